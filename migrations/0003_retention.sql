-- gpuprof schema, version 3: what retention (daemon/src/retention.rs) needs to delete old
-- sessions, records and processes safely and cheaply.

-- Session ids are never reused: retention deletes finished sessions, and an id handed out
-- again would attach stray records of a deleted session (still being removed, or sent late
-- by an agent) to a new one. Same columns as before, now AUTOINCREMENT.
CREATE TABLE sessions_v3 (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT NOT NULL,
    state         TEXT NOT NULL,           -- pending|active|stopping|completed|failed|interrupted
    targets       TEXT NOT NULL,           -- JSON
    collect       TEXT NOT NULL,           -- JSON
    owner_uid     INTEGER NOT NULL,
    created_ns    INTEGER NOT NULL,
    start_at_ns   INTEGER NOT NULL,
    started_ns    INTEGER,
    stopped_ns    INTEGER,
    duration_ms   INTEGER NOT NULL,
    max_records   INTEGER NOT NULL,
    stop_reason   TEXT
);
INSERT INTO sessions_v3 SELECT * FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v3 RENAME TO sessions;
CREATE INDEX sessions_owner ON sessions(owner_uid, id);

-- From this version on the rollup pass also keeps `session_rows` entries for session 0
-- (records captured outside sessions: rows and rowid range per table and process), so that
-- retention finds them without scanning. Rows of session 0 stored before this version are
-- not in `session_rows`; processes that existed then are never deleted by retention (they
-- may own such rows), which `retention_process_floor` records.
INSERT OR REPLACE INTO meta(key, value)
    VALUES ('retention_process_floor', (SELECT coalesce(max(id), 0) FROM processes));

-- Whether any session still refers to a process (retention deletes processes that nothing
-- refers to).
CREATE INDEX session_rows_proc ON session_rows(proc);
