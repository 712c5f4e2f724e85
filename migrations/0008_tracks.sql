-- gpuprof schema, version 8: denser record rows, and kernel durations per name.
--
-- Columns that repeat over a stream of records move out of the rows: each record row keeps a
-- `track`, the id of one `tracks` row holding its (session, process, device, context, stream,
-- thread) — those of these the record kind has, 0 for the others. A row of `kernel_data` thus
-- carries one small integer where it carried five columns, and one `dims` for the grid's and
-- block's y and z. The record tables become views of
-- the same name and columns over `<table>_data` joined to `tracks` (plus `rowid`, the data
-- row's), so readers see what they saw before; the writer and retention use the `_data`
-- tables. Rowids are kept: `session_rows` and `rollup_progress` stay valid.

CREATE TABLE tracks (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: late rows cannot take a deleted track's id
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    tid     INTEGER NOT NULL,
    UNIQUE (session, proc, dev, ctx, stream, tid)
);

INSERT INTO tracks(session, proc, dev, ctx, stream, tid)
    SELECT session, proc, dev, ctx, stream, 0 FROM kernel
    UNION SELECT session, proc, dev, ctx, stream, 0 FROM memcpy
    UNION SELECT session, proc, dev, ctx, stream, 0 FROM memset
    UNION SELECT session, proc, 0, 0, 0, tid FROM api
    UNION SELECT session, proc, 0, ctx, stream, 0 FROM sync
    UNION SELECT session, proc, 0, 0, 0, 0 FROM overhead
    UNION SELECT session, proc, 0, 0, 0, tid FROM marker
    UNION SELECT session, proc, 0, 0, 0, 0 FROM external_correlation
    UNION SELECT session, proc, dev, ctx, stream, 0 FROM graph;

CREATE TABLE kernel_data (
    track INTEGER NOT NULL,
    corr INTEGER NOT NULL,
    name INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL,
    gx INTEGER NOT NULL,
    -- (gy-1) | (gz-1) << 16 | (by-1) << 32 | (bz-1) << 48: 0 for the usual 1, 1, 1, 1; the text
    -- 'gy,gz,by,bz' when a value is outside 1..=65536 (bz: 1..=32768), which CUDA never reports.
    dims INTEGER NOT NULL,
    bx INTEGER NOT NULL,
    regs INTEGER NOT NULL,
    ssmem INTEGER NOT NULL,
    dsmem INTEGER NOT NULL,
    graph_node INTEGER NOT NULL
);
INSERT INTO kernel_data(rowid, track, corr, name, start, dur, gx, dims, bx, regs, ssmem, dsmem, graph_node)
    SELECT r.rowid, k.id, r.corr, r.name, r.start, r.dur, r.gx,
           CASE WHEN r.gy BETWEEN 1 AND 65536 AND r.gz BETWEEN 1 AND 65536 AND r.by BETWEEN 1 AND 65536
                     AND r.bz BETWEEN 1 AND 32768
                THEN (r.gy - 1) | ((r.gz - 1) << 16) | ((r.by - 1) << 32) | ((r.bz - 1) << 48)
                ELSE r.gy || ',' || r.gz || ',' || r.by || ',' || r.bz END,
           r.bx, r.regs, r.ssmem, r.dsmem, r.graph_node
    FROM kernel r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = r.dev AND k.ctx = r.ctx AND k.stream = r.stream AND k.tid = 0
    ORDER BY r.rowid;
CREATE TABLE memcpy_data (
    track INTEGER NOT NULL,
    corr INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    src_kind INTEGER NOT NULL,
    dst_kind INTEGER NOT NULL,
    src_dev INTEGER NOT NULL,
    dst_dev INTEGER NOT NULL,
    async INTEGER NOT NULL,
    graph_node INTEGER NOT NULL
);
INSERT INTO memcpy_data(rowid, track, corr, start, dur, bytes, kind, src_kind, dst_kind, src_dev, dst_dev, async, graph_node)
    SELECT r.rowid, k.id, r.corr, r.start, r.dur, r.bytes, r.kind, r.src_kind, r.dst_kind, r.src_dev, r.dst_dev, r.async, r.graph_node
    FROM memcpy r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = r.dev AND k.ctx = r.ctx AND k.stream = r.stream AND k.tid = 0
    ORDER BY r.rowid;
CREATE TABLE memset_data (
    track INTEGER NOT NULL,
    corr INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    value INTEGER NOT NULL,
    mem_kind INTEGER NOT NULL,
    graph_node INTEGER NOT NULL
);
INSERT INTO memset_data(rowid, track, corr, start, dur, bytes, value, mem_kind, graph_node)
    SELECT r.rowid, k.id, r.corr, r.start, r.dur, r.bytes, r.value, r.mem_kind, r.graph_node
    FROM memset r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = r.dev AND k.ctx = r.ctx AND k.stream = r.stream AND k.tid = 0
    ORDER BY r.rowid;
CREATE TABLE api_data (
    track INTEGER NOT NULL,
    domain INTEGER NOT NULL,
    cbid INTEGER NOT NULL,
    corr INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL,
    ret INTEGER NOT NULL
);
INSERT INTO api_data(rowid, track, domain, cbid, corr, start, dur, ret)
    SELECT r.rowid, k.id, r.domain, r.cbid, r.corr, r.start, r.dur, r.ret
    FROM api r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = 0 AND k.ctx = 0 AND k.stream = 0 AND k.tid = r.tid
    ORDER BY r.rowid;
CREATE TABLE sync_data (
    track INTEGER NOT NULL,
    type INTEGER NOT NULL,
    event INTEGER NOT NULL,
    corr INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL
);
INSERT INTO sync_data(rowid, track, type, event, corr, start, dur)
    SELECT r.rowid, k.id, r.type, r.event, r.corr, r.start, r.dur
    FROM sync r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = 0 AND k.ctx = r.ctx AND k.stream = r.stream AND k.tid = 0
    ORDER BY r.rowid;
CREATE TABLE overhead_data (
    track INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    obj_kind INTEGER NOT NULL,
    obj_id INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL
);
INSERT INTO overhead_data(rowid, track, kind, obj_kind, obj_id, start, dur)
    SELECT r.rowid, k.id, r.kind, r.obj_kind, r.obj_id, r.start, r.dur
    FROM overhead r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = 0 AND k.ctx = 0 AND k.stream = 0 AND k.tid = 0
    ORDER BY r.rowid;
CREATE TABLE marker_data (
    track INTEGER NOT NULL,
    id INTEGER NOT NULL,
    name INTEGER NOT NULL,
    domain INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL,
    is_mark INTEGER NOT NULL
);
INSERT INTO marker_data(rowid, track, id, name, domain, start, dur, is_mark)
    SELECT r.rowid, k.id, r.id, r.name, r.domain, r.start, r.dur, r.is_mark
    FROM marker r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = 0 AND k.ctx = 0 AND k.stream = 0 AND k.tid = r.tid
    ORDER BY r.rowid;
CREATE TABLE external_correlation_data (
    track INTEGER NOT NULL,
    ext_kind INTEGER NOT NULL,
    ext_id INTEGER NOT NULL,
    corr INTEGER NOT NULL
);
INSERT INTO external_correlation_data(rowid, track, ext_kind, ext_id, corr)
    SELECT r.rowid, k.id, r.ext_kind, r.ext_id, r.corr
    FROM external_correlation r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = 0 AND k.ctx = 0 AND k.stream = 0 AND k.tid = 0
    ORDER BY r.rowid;
CREATE TABLE graph_data (
    track INTEGER NOT NULL,
    corr INTEGER NOT NULL,
    graph_id INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL
);
INSERT INTO graph_data(rowid, track, corr, graph_id, start, dur)
    SELECT r.rowid, k.id, r.corr, r.graph_id, r.start, r.dur
    FROM graph r JOIN tracks k ON k.session = r.session AND k.proc = r.proc AND k.dev = r.dev AND k.ctx = r.ctx AND k.stream = r.stream AND k.tid = 0
    ORDER BY r.rowid;

DROP VIEW kernel_v;
DROP VIEW memcpy_v;
DROP VIEW memset_v;
DROP VIEW api_v;
DROP VIEW marker_v;
DROP TABLE kernel;
DROP TABLE memcpy;
DROP TABLE memset;
DROP TABLE api;
DROP TABLE sync;
DROP TABLE overhead;
DROP TABLE marker;
DROP TABLE external_correlation;
DROP TABLE graph;

CREATE VIEW kernel AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr,
           d.name AS name, d.start AS start, d.dur AS dur, d.gx AS gx,
           CASE WHEN typeof(d.dims) = 'integer' THEN (d.dims & 65535) + 1 ELSE CAST(d.dims AS INTEGER) END AS gy,
           CASE WHEN typeof(d.dims) = 'integer' THEN ((d.dims >> 16) & 65535) + 1 ELSE CAST(substr(d.dims, instr(d.dims, ',') + 1) AS INTEGER) END AS gz,
           d.bx AS bx,
           CASE WHEN typeof(d.dims) = 'integer' THEN ((d.dims >> 32) & 65535) + 1 ELSE CAST(substr(d.dims, instr(d.dims, ',') + instr(substr(d.dims, instr(d.dims, ',') + 1), ',') + 1) AS INTEGER) END AS by,
           CASE WHEN typeof(d.dims) = 'integer' THEN (d.dims >> 48) + 1 ELSE CAST(substr(d.dims, length(rtrim(d.dims, '0123456789')) + 1) AS INTEGER) END AS bz,
           d.regs AS regs, d.ssmem AS ssmem, d.dsmem AS dsmem, d.graph_node AS graph_node, d.rowid AS rowid
    FROM kernel_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW memcpy AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr, d.start AS start, d.dur AS dur, d.bytes AS bytes, d.kind AS kind, d.src_kind AS src_kind, d.dst_kind AS dst_kind, d.src_dev AS src_dev, d.dst_dev AS dst_dev, d.async AS async, d.graph_node AS graph_node, d.rowid AS rowid
    FROM memcpy_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW memset AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr, d.start AS start, d.dur AS dur, d.bytes AS bytes, d.value AS value, d.mem_kind AS mem_kind, d.graph_node AS graph_node, d.rowid AS rowid
    FROM memset_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW api AS
    SELECT k.session AS session, k.proc AS proc, d.domain AS domain, d.cbid AS cbid, d.corr AS corr, k.tid AS tid, d.start AS start, d.dur AS dur, d.ret AS ret, d.rowid AS rowid
    FROM api_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW sync AS
    SELECT k.session AS session, k.proc AS proc, d.type AS type, k.ctx AS ctx, k.stream AS stream, d.event AS event, d.corr AS corr, d.start AS start, d.dur AS dur, d.rowid AS rowid
    FROM sync_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW overhead AS
    SELECT k.session AS session, k.proc AS proc, d.kind AS kind, d.obj_kind AS obj_kind, d.obj_id AS obj_id, d.start AS start, d.dur AS dur, d.rowid AS rowid
    FROM overhead_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW marker AS
    SELECT k.session AS session, k.proc AS proc, d.id AS id, d.name AS name, d.domain AS domain, k.tid AS tid, d.start AS start, d.dur AS dur, d.is_mark AS is_mark, d.rowid AS rowid
    FROM marker_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW external_correlation AS
    SELECT k.session AS session, k.proc AS proc, d.ext_kind AS ext_kind, d.ext_id AS ext_id, d.corr AS corr, d.rowid AS rowid
    FROM external_correlation_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW graph AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr, d.graph_id AS graph_id, d.start AS start, d.dur AS dur, d.rowid AS rowid
    FROM graph_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW kernel_v AS
    SELECT x.session, x.proc, x.dev, x.ctx, x.stream, x.corr, x.name, x.start, x.dur, x.gx, x.gy, x.gz, x.bx, x.by, x.bz, x.regs, x.ssmem, x.dsmem, x.graph_node, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM kernel x JOIN processes p ON p.id = x.proc;
CREATE VIEW memcpy_v AS
    SELECT x.session, x.proc, x.dev, x.ctx, x.stream, x.corr, x.start, x.dur, x.bytes, x.kind, x.src_kind, x.dst_kind, x.src_dev, x.dst_dev, x.async, x.graph_node, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM memcpy x JOIN processes p ON p.id = x.proc;
CREATE VIEW memset_v AS
    SELECT x.session, x.proc, x.dev, x.ctx, x.stream, x.corr, x.start, x.dur, x.bytes, x.value, x.mem_kind, x.graph_node, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM memset x JOIN processes p ON p.id = x.proc;
CREATE VIEW api_v AS
    SELECT x.session, x.proc, x.domain, x.cbid, x.corr, x.tid, x.start, x.dur, x.ret, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM api x JOIN processes p ON p.id = x.proc;
CREATE VIEW marker_v AS
    SELECT x.session, x.proc, x.id, x.name, x.domain, x.tid, x.start, x.dur, x.is_mark, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM marker x JOIN processes p ON p.id = x.proc;

-- Kernel durations per session, name and bucket: kernel_rollup summed over processes,
-- devices and streams, which top kernels reads when the filter leaves those alone
-- (tens of rows per name instead of thousands).
CREATE TABLE kernel_name_rollup (
    session INTEGER NOT NULL,
    name    INTEGER NOT NULL,               -- strings.id
    bucket  INTEGER NOT NULL,
    n       INTEGER NOT NULL,
    total   INTEGER NOT NULL,
    min     INTEGER NOT NULL,
    max     INTEGER NOT NULL,
    PRIMARY KEY (session, name, bucket)
) WITHOUT ROWID;
INSERT INTO kernel_name_rollup(session, name, bucket, n, total, min, max)
    SELECT session, name, bucket, sum(n), sum(total), min(min), max(max) FROM kernel_rollup
    GROUP BY session, name, bucket;
