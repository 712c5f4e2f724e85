-- gpuprof schema, version 11: starts stored in at most 4 bytes however long a process lives.
--
-- A record's start was stored relative to its process's `base_ns`: 4 bytes for the process's
-- first 2.1 s, 6 bytes after. A track now has a `base` too, a multiple of 2^32 ns after the
-- process's base, and a row's `start` is relative to its track's base, within ±2^31 ns of it:
-- the writer starts a new track row (same session, process, device, context, stream and
-- thread, the next base) when a stream's records move past it, every 4.3 s of records. The
-- views add the base back, so readers see the same `start` as before. Rows already stored keep
-- their starts: their tracks get base 0. `tracks` is rebuilt with `base` in its unique key,
-- keeping every id and the AUTOINCREMENT sequence (ids of deleted tracks are never reused).

DROP VIEW kernel_v;
DROP VIEW memcpy_v;
DROP VIEW memset_v;
DROP VIEW api_v;
DROP VIEW marker_v;
DROP VIEW kernel;
DROP VIEW memcpy;
DROP VIEW memset;
DROP VIEW api;
DROP VIEW sync;
DROP VIEW overhead;
DROP VIEW marker;
DROP VIEW external_correlation;
DROP VIEW graph;

CREATE TABLE tracks_11 (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: late rows cannot take a deleted track's id
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    tid     INTEGER NOT NULL,
    base    INTEGER NOT NULL,  -- ns after the process's base_ns that the rows' starts count from
    UNIQUE (session, proc, dev, ctx, stream, tid, base)
);
INSERT INTO tracks_11(id, session, proc, dev, ctx, stream, tid, base)
    SELECT id, session, proc, dev, ctx, stream, tid, 0 FROM tracks ORDER BY id;
INSERT INTO sqlite_sequence(name, seq)
    SELECT 'tracks_11', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'tracks_11');
UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'tracks'), 0))
    WHERE name = 'tracks_11';
DROP TABLE tracks;
ALTER TABLE tracks_11 RENAME TO tracks;

CREATE VIEW kernel AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr,
           s.name AS name, k.base + d.start AS start, d.dur AS dur, d.gx AS gx, s.gy AS gy, s.gz AS gz,
           s.bx AS bx, s.by AS by, s.bz AS bz, s.regs AS regs, s.ssmem AS ssmem, s.dsmem AS dsmem,
           s.graph_node AS graph_node, d.rowid AS rowid
    FROM kernel_data d CROSS JOIN tracks k ON k.id = d.track LEFT JOIN kernel_shapes s ON s.id = d.shape;
CREATE VIEW memcpy AS
    SELECT t.session AS session, t.proc AS proc, t.dev AS dev, t.ctx AS ctx, t.stream AS stream, d.corr AS corr,
           t.base + d.start AS start, d.dur AS dur, d.bytes AS bytes, s.kind AS kind, s.src_kind AS src_kind,
           s.dst_kind AS dst_kind, s.src_dev AS src_dev, s.dst_dev AS dst_dev, s.async AS async,
           s.graph_node AS graph_node, d.rowid AS rowid
    FROM memcpy_data d CROSS JOIN tracks t ON t.id = d.track LEFT JOIN memcpy_shapes s ON s.id = d.shape;
CREATE VIEW memset AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr, k.base + d.start AS start, d.dur AS dur, d.bytes AS bytes, d.value AS value, d.mem_kind AS mem_kind, d.graph_node AS graph_node, d.rowid AS rowid
    FROM memset_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW api AS
    SELECT t.session AS session, t.proc AS proc, k.domain AS domain, k.cbid AS cbid, d.corr AS corr, t.tid AS tid,
           t.base + d.start AS start, d.dur AS dur, k.ret AS ret, d.rowid AS rowid
    FROM api_data d CROSS JOIN tracks t ON t.id = d.track LEFT JOIN api_kinds k ON k.id = d.kind;
CREATE VIEW sync AS
    SELECT k.session AS session, k.proc AS proc, d.type AS type, k.ctx AS ctx, k.stream AS stream, d.event AS event, d.corr AS corr, k.base + d.start AS start, d.dur AS dur, d.rowid AS rowid
    FROM sync_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW overhead AS
    SELECT k.session AS session, k.proc AS proc, d.kind AS kind, d.obj_kind AS obj_kind, d.obj_id AS obj_id, k.base + d.start AS start, d.dur AS dur, d.rowid AS rowid
    FROM overhead_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW marker AS
    SELECT k.session AS session, k.proc AS proc, d.id AS id, d.name AS name, d.domain AS domain, k.tid AS tid, k.base + d.start AS start, d.dur AS dur, d.is_mark AS is_mark, d.rowid AS rowid
    FROM marker_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW external_correlation AS
    SELECT k.session AS session, k.proc AS proc, d.ext_kind AS ext_kind, d.ext_id AS ext_id, d.corr AS corr, d.rowid AS rowid
    FROM external_correlation_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW graph AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream, d.corr AS corr, d.graph_id AS graph_id, k.base + d.start AS start, d.dur AS dur, d.rowid AS rowid
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
