-- gpuprof schema, version 9: a kernel's launch shape stored once, not in every row.
--
-- A kernel's name, grid y and z, block x, y and z, registers per thread and shared memory
-- repeat from launch to launch of the same kernel (registers and static shared memory are
-- properties of the compiled function; the block and the dynamic shared memory follow the
-- code that launches it). They move to `kernel_shapes`, one row per distinct combination, and
-- a row of `kernel_data` keeps its track, correlation id, shape, start, duration, grid x (which
-- follows the problem size) and graph node: seven columns where it had twelve. The `kernel`
-- view joins the shape back (a LEFT JOIN, which SQLite leaves out of queries that use none of
-- the shape's columns; every row has its shape), so readers see the same columns; rowids are
-- kept. Grid and block
-- values are plain integers in `kernel_shapes` (no packing: a shape is written once).

CREATE TABLE kernel_shapes (
    id    INTEGER PRIMARY KEY,
    name  INTEGER NOT NULL,  -- strings.id
    gy    INTEGER NOT NULL,
    gz    INTEGER NOT NULL,
    bx    INTEGER NOT NULL,
    by    INTEGER NOT NULL,
    bz    INTEGER NOT NULL,
    regs  INTEGER NOT NULL,
    ssmem INTEGER NOT NULL,
    dsmem INTEGER NOT NULL,
    UNIQUE (name, gy, gz, bx, by, bz, regs, ssmem, dsmem)
);

INSERT INTO kernel_shapes(name, gy, gz, bx, by, bz, regs, ssmem, dsmem)
    SELECT DISTINCT name, gy, gz, bx, by, bz, regs, ssmem, dsmem FROM kernel;

CREATE TABLE kernel_rows (
    track      INTEGER NOT NULL,
    corr       INTEGER NOT NULL,
    shape      INTEGER NOT NULL,  -- kernel_shapes.id
    start      INTEGER NOT NULL,
    dur        INTEGER NOT NULL,
    gx         INTEGER NOT NULL,
    graph_node INTEGER NOT NULL
);
INSERT INTO kernel_rows(rowid, track, corr, shape, start, dur, gx, graph_node)
    SELECT d.rowid, d.track, d.corr, s.id, d.start, d.dur, d.gx, d.graph_node
    FROM kernel k
    JOIN kernel_data d ON d.rowid = k.rowid
    JOIN kernel_shapes s ON s.name = k.name AND s.gy = k.gy AND s.gz = k.gz AND s.bx = k.bx AND s.by = k.by
                        AND s.bz = k.bz AND s.regs = k.regs AND s.ssmem = k.ssmem AND s.dsmem = k.dsmem
    ORDER BY d.rowid;

DROP VIEW kernel_v;
DROP VIEW kernel;
DROP TABLE kernel_data;
ALTER TABLE kernel_rows RENAME TO kernel_data;

CREATE VIEW kernel AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr,
           s.name AS name, d.start AS start, d.dur AS dur, d.gx AS gx, s.gy AS gy, s.gz AS gz,
           s.bx AS bx, s.by AS by, s.bz AS bz, s.regs AS regs, s.ssmem AS ssmem, s.dsmem AS dsmem,
           d.graph_node AS graph_node, d.rowid AS rowid
    FROM kernel_data d CROSS JOIN tracks k ON k.id = d.track LEFT JOIN kernel_shapes s ON s.id = d.shape;
CREATE VIEW kernel_v AS
    SELECT x.session, x.proc, x.dev, x.ctx, x.stream, x.corr, x.name, x.start, x.dur, x.gx, x.gy, x.gz, x.bx, x.by, x.bz, x.regs, x.ssmem, x.dsmem, x.graph_node, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM kernel x JOIN processes p ON p.id = x.proc;
