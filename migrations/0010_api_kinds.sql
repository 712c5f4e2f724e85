-- gpuprof schema, version 10: an API call's kind stored once, not in every row.
--
-- An API call's domain (runtime or driver), callback id and return value repeat from call to
-- call: a process makes a few dozen kinds of call, nearly all returning success. They move to
-- `api_kinds`, one row per distinct (domain, cbid, ret), and a row of `api_data` keeps its
-- track, correlation id, kind, start and duration: five columns where it had seven. The `api`
-- view joins the kind back (a LEFT JOIN, which SQLite leaves out of queries that use none of
-- its columns; every row has its kind), so readers see the same columns; rowids are kept.

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

DROP VIEW api_v;
DROP VIEW api;
DROP TABLE api_data;
ALTER TABLE api_rows RENAME TO api_data;

CREATE VIEW api AS
    SELECT t.session AS session, t.proc AS proc, k.domain AS domain, k.cbid AS cbid, d.corr AS corr, t.tid AS tid,
           d.start AS start, d.dur AS dur, k.ret AS ret, d.rowid AS rowid
    FROM api_data d CROSS JOIN tracks t ON t.id = d.track LEFT JOIN api_kinds k ON k.id = d.kind;
CREATE VIEW api_v AS
    SELECT x.session, x.proc, x.domain, x.cbid, x.corr, x.tid, x.start, x.dur, x.ret, p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns
    FROM api x JOIN processes p ON p.id = x.proc;
