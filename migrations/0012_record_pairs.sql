-- gpuprof schema, version 12: two records of a track in one row of kernel_data and api_data.
--
-- A row's own costs (its cell pointer, length, rowid, record header and track) were about as
-- many bytes as a kernel's or API call's values. The writer now stores two consecutive records
-- of the same track in one row: the first in the row's columns as before, the second in the
-- `*2` columns (`corr2` and `start2` relative to the first's, `dur2` NULL when the row holds
-- one record). The views return both, each with the row's rowid: a rowid range still reads
-- the rows of that range, and a row's records are always of one session and process. Rows
-- stored before keep one record each (their `*2` columns are NULL).

ALTER TABLE kernel_data ADD COLUMN corr2 INTEGER;   -- second record: corr - the first's corr
ALTER TABLE kernel_data ADD COLUMN shape2 INTEGER;
ALTER TABLE kernel_data ADD COLUMN start2 INTEGER;  -- second record: start - the first's start
ALTER TABLE kernel_data ADD COLUMN dur2 INTEGER;    -- NULL: the row holds one record
ALTER TABLE kernel_data ADD COLUMN gx2 INTEGER;
ALTER TABLE api_data ADD COLUMN corr2 INTEGER;
ALTER TABLE api_data ADD COLUMN kind2 INTEGER;
ALTER TABLE api_data ADD COLUMN start2 INTEGER;
ALTER TABLE api_data ADD COLUMN dur2 INTEGER;

-- The two halves of a row: the views join every row with them and keep the second only where
-- the row has one.
CREATE TABLE halves (n INTEGER PRIMARY KEY);
INSERT INTO halves(n) VALUES (0), (1);

DROP VIEW kernel_v;
DROP VIEW api_v;
DROP VIEW kernel;
DROP VIEW api;

CREATE VIEW kernel AS
    SELECT k.session AS session, k.proc AS proc, k.dev AS dev, k.ctx AS ctx, k.stream AS stream,
           CASE h.n WHEN 0 THEN d.corr ELSE d.corr + d.corr2 END AS corr, s.name AS name,
           k.base + d.start + CASE h.n WHEN 0 THEN 0 ELSE d.start2 END AS start,
           CASE h.n WHEN 0 THEN d.dur ELSE d.dur2 END AS dur, CASE h.n WHEN 0 THEN d.gx ELSE d.gx2 END AS gx,
           s.gy AS gy, s.gz AS gz, s.bx AS bx, s.by AS by, s.bz AS bz, s.regs AS regs, s.ssmem AS ssmem,
           s.dsmem AS dsmem, s.graph_node AS graph_node, d.rowid AS rowid
    FROM kernel_data d CROSS JOIN halves h CROSS JOIN tracks k ON k.id = d.track
         LEFT JOIN kernel_shapes s ON s.id = CASE h.n WHEN 0 THEN d.shape ELSE d.shape2 END
    WHERE h.n = 0 OR d.dur2 IS NOT NULL;
CREATE VIEW api AS
    SELECT t.session AS session, t.proc AS proc, k.domain AS domain, k.cbid AS cbid,
           CASE h.n WHEN 0 THEN d.corr ELSE d.corr + d.corr2 END AS corr, t.tid AS tid,
           t.base + d.start + CASE h.n WHEN 0 THEN 0 ELSE d.start2 END AS start,
           CASE h.n WHEN 0 THEN d.dur ELSE d.dur2 END AS dur, k.ret AS ret, d.rowid AS rowid
    FROM api_data d CROSS JOIN halves h CROSS JOIN tracks t ON t.id = d.track
         LEFT JOIN api_kinds k ON k.id = CASE h.n WHEN 0 THEN d.kind ELSE d.kind2 END
    WHERE h.n = 0 OR d.dur2 IS NOT NULL;
CREATE VIEW kernel_v AS
    SELECT x.session, x.proc, x.dev, x.ctx, x.stream, x.corr, x.name, x.start, x.dur, x.gx, x.gy, x.gz, x.bx, x.by, x.bz, x.regs, x.ssmem, x.dsmem, x.graph_node, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM kernel x JOIN processes p ON p.id = x.proc;
CREATE VIEW api_v AS
    SELECT x.session, x.proc, x.domain, x.cbid, x.corr, x.tid, x.start, x.dur, x.ret, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM api x JOIN processes p ON p.id = x.proc;
