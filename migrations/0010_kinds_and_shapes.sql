-- gpuprof schema, version 10: what repeats from record to record stored once, for API calls and
-- copies too, and a kernel's graph node in its shape.
--
-- An API call's domain (runtime or driver), callback id and return value repeat from call to
-- call: a process makes a few dozen kinds of call, nearly all returning success. They move to
-- `api_kinds`, one row per distinct (domain, cbid, ret), and a row of `api_data` keeps its
-- track, correlation id, kind, start and duration: five columns where it had seven.
--
-- A copy's kind, source and destination memory kinds and devices, whether it is async and its
-- graph node likewise move to `memcpy_shapes`; a row of `memcpy_data` keeps track, correlation
-- id, start, duration, bytes and shape: six columns where it had twelve.
--
-- A kernel's graph node (0 outside CUDA graphs; a graph's kernel node launches the same kernel
-- each time) joins the other columns of its `kernel_shapes` row; `kernel_data` keeps six columns.
--
-- The views join the kinds and shapes back (LEFT JOINs, which SQLite leaves out of queries that
-- use none of their columns; every row has its kind or shape), so readers see the same columns;
-- rowids are kept.

CREATE TABLE api_kinds (
    id     INTEGER PRIMARY KEY,
    domain INTEGER NOT NULL,
    cbid   INTEGER NOT NULL,
    ret    INTEGER NOT NULL,
    UNIQUE (domain, cbid, ret)
);
INSERT INTO api_kinds(domain, cbid, ret) SELECT DISTINCT domain, cbid, ret FROM api_data;

CREATE TABLE api_rows (
    track INTEGER NOT NULL,
    corr  INTEGER NOT NULL,
    kind  INTEGER NOT NULL,  -- api_kinds.id
    start INTEGER NOT NULL,
    dur   INTEGER NOT NULL
);
INSERT INTO api_rows(rowid, track, corr, kind, start, dur)
    SELECT d.rowid, d.track, d.corr, k.id, d.start, d.dur
    FROM api_data d JOIN api_kinds k ON k.domain = d.domain AND k.cbid = d.cbid AND k.ret = d.ret
    ORDER BY d.rowid;

CREATE TABLE memcpy_shapes (
    id         INTEGER PRIMARY KEY,
    kind       INTEGER NOT NULL,
    src_kind   INTEGER NOT NULL,
    dst_kind   INTEGER NOT NULL,
    src_dev    INTEGER NOT NULL,
    dst_dev    INTEGER NOT NULL,
    async      INTEGER NOT NULL,
    graph_node INTEGER NOT NULL,
    UNIQUE (kind, src_kind, dst_kind, src_dev, dst_dev, async, graph_node)
);
INSERT INTO memcpy_shapes(kind, src_kind, dst_kind, src_dev, dst_dev, async, graph_node)
    SELECT DISTINCT kind, src_kind, dst_kind, src_dev, dst_dev, async, graph_node FROM memcpy_data;

CREATE TABLE memcpy_rows (
    track INTEGER NOT NULL,
    corr  INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur   INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    shape INTEGER NOT NULL   -- memcpy_shapes.id
);
INSERT INTO memcpy_rows(rowid, track, corr, start, dur, bytes, shape)
    SELECT d.rowid, d.track, d.corr, d.start, d.dur, d.bytes, s.id
    FROM memcpy_data d JOIN memcpy_shapes s
      ON s.kind = d.kind AND s.src_kind = d.src_kind AND s.dst_kind = d.dst_kind AND s.src_dev = d.src_dev
     AND s.dst_dev = d.dst_dev AND s.async = d.async AND s.graph_node = d.graph_node
    ORDER BY d.rowid;

CREATE TABLE kernel_shapes_10 (
    id         INTEGER PRIMARY KEY,
    name       INTEGER NOT NULL,  -- strings.id
    gy         INTEGER NOT NULL,
    gz         INTEGER NOT NULL,
    bx         INTEGER NOT NULL,
    by         INTEGER NOT NULL,
    bz         INTEGER NOT NULL,
    regs       INTEGER NOT NULL,
    ssmem      INTEGER NOT NULL,
    dsmem      INTEGER NOT NULL,
    graph_node INTEGER NOT NULL,
    UNIQUE (name, gy, gz, bx, by, bz, regs, ssmem, dsmem, graph_node)
);
INSERT INTO kernel_shapes_10(name, gy, gz, bx, by, bz, regs, ssmem, dsmem, graph_node)
    SELECT DISTINCT s.name, s.gy, s.gz, s.bx, s.by, s.bz, s.regs, s.ssmem, s.dsmem, d.graph_node
    FROM kernel_data d JOIN kernel_shapes s ON s.id = d.shape;

CREATE TABLE kernel_rows (
    track INTEGER NOT NULL,
    corr  INTEGER NOT NULL,
    shape INTEGER NOT NULL,  -- kernel_shapes.id
    start INTEGER NOT NULL,
    dur   INTEGER NOT NULL,
    gx    INTEGER NOT NULL
);
INSERT INTO kernel_rows(rowid, track, corr, shape, start, dur, gx)
    SELECT d.rowid, d.track, d.corr, n.id, d.start, d.dur, d.gx
    FROM kernel_data d
    JOIN kernel_shapes s ON s.id = d.shape
    JOIN kernel_shapes_10 n ON n.name = s.name AND n.gy = s.gy AND n.gz = s.gz AND n.bx = s.bx AND n.by = s.by
                           AND n.bz = s.bz AND n.regs = s.regs AND n.ssmem = s.ssmem AND n.dsmem = s.dsmem
                           AND n.graph_node = d.graph_node
    ORDER BY d.rowid;

DROP VIEW api_v;
DROP VIEW api;
DROP VIEW memcpy_v;
DROP VIEW memcpy;
DROP VIEW kernel_v;
DROP VIEW kernel;
DROP TABLE api_data;
DROP TABLE memcpy_data;
DROP TABLE kernel_data;
DROP TABLE kernel_shapes;
ALTER TABLE api_rows RENAME TO api_data;
ALTER TABLE memcpy_rows RENAME TO memcpy_data;
ALTER TABLE kernel_rows RENAME TO kernel_data;
ALTER TABLE kernel_shapes_10 RENAME TO kernel_shapes;

CREATE VIEW api AS
    SELECT t.session AS session, t.proc AS proc, k.domain AS domain, k.cbid AS cbid, d.corr AS corr, t.tid AS tid,
           d.start AS start, d.dur AS dur, k.ret AS ret, d.rowid AS rowid
    FROM api_data d CROSS JOIN tracks t ON t.id = d.track LEFT JOIN api_kinds k ON k.id = d.kind;
CREATE VIEW api_v AS
    SELECT x.session, x.proc, x.domain, x.cbid, x.corr, x.tid, x.start, x.dur, x.ret, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM api x JOIN processes p ON p.id = x.proc;

CREATE VIEW memcpy AS
    SELECT t.session AS session, t.proc AS proc, t.dev AS dev, t.ctx AS ctx, t.stream AS stream, d.corr AS corr,
           d.start AS start, d.dur AS dur, d.bytes AS bytes, s.kind AS kind, s.src_kind AS src_kind,
           s.dst_kind AS dst_kind, s.src_dev AS src_dev, s.dst_dev AS dst_dev, s.async AS async,
           s.graph_node AS graph_node, d.rowid AS rowid
    FROM memcpy_data d CROSS JOIN tracks t ON t.id = d.track LEFT JOIN memcpy_shapes s ON s.id = d.shape;
CREATE VIEW memcpy_v AS
    SELECT x.session, x.proc, x.dev, x.ctx, x.stream, x.corr, x.start, x.dur, x.bytes, x.kind, x.src_kind, x.dst_kind, x.src_dev, x.dst_dev, x.async, x.graph_node, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM memcpy x JOIN processes p ON p.id = x.proc;

CREATE VIEW kernel AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr,
           s.name AS name, d.start AS start, d.dur AS dur, d.gx AS gx, s.gy AS gy, s.gz AS gz,
           s.bx AS bx, s.by AS by, s.bz AS bz, s.regs AS regs, s.ssmem AS ssmem, s.dsmem AS dsmem,
           s.graph_node AS graph_node, d.rowid AS rowid
    FROM kernel_data d CROSS JOIN tracks k ON k.id = d.track LEFT JOIN kernel_shapes s ON s.id = d.shape;
CREATE VIEW kernel_v AS
    SELECT x.session, x.proc, x.dev, x.ctx, x.stream, x.corr, x.name, x.start, x.dur, x.gx, x.gy, x.gz, x.bx, x.by, x.bz, x.regs, x.ssmem, x.dsmem, x.graph_node, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM kernel x JOIN processes p ON p.id = x.proc;
