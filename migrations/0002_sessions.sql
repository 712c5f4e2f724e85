-- gpuprof schema, version 2: session bookkeeping and per-session rollups.
--
-- No index is added to the record tables (every insert would pay for it). Instead the
-- daemon's rollup pass (daemon/src/rollup.rs) reads each record table once, in rowid
-- order, behind the writer, and keeps the small tables below: how many rows each session
-- has per table and process and in which rowid range they lie (so a session's rows are
-- read by rowid range, never by a full scan), and aggregates for summaries.

-- Drop counters of a process (sum over kinds) when it joined and left a session.
ALTER TABLE session_processes ADD COLUMN drops_at_join INTEGER NOT NULL DEFAULT 0;
ALTER TABLE session_processes ADD COLUMN drops_at_leave INTEGER;

CREATE INDEX session_processes_proc ON session_processes(proc);
CREATE INDEX sessions_owner ON sessions(owner_uid, id);

-- How far the rollup pass has read each record table.
CREATE TABLE rollup_progress (
    tbl        TEXT PRIMARY KEY,
    last_rowid INTEGER NOT NULL
) WITHOUT ROWID;

-- Rows of a session per record table and process, and the rowid range they lie in.
CREATE TABLE session_rows (
    session     INTEGER NOT NULL,
    tbl         TEXT NOT NULL,
    proc        INTEGER NOT NULL,
    n           INTEGER NOT NULL,
    first_rowid INTEGER NOT NULL,
    last_rowid  INTEGER NOT NULL,
    PRIMARY KEY (session, tbl, proc)
) WITHOUT ROWID;

-- Kernel durations per session, name, process, device and stream, in log-scale buckets
-- (exact below 64 ns, then 32 buckets per power of two): counts, sums and extremes are
-- exact; percentiles are exact when a bucket's min equals its max, else interpolated
-- inside a bucket that is 3% wide.
CREATE TABLE kernel_rollup (
    session INTEGER NOT NULL,
    name    INTEGER NOT NULL,               -- strings.id
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    bucket  INTEGER NOT NULL,
    n       INTEGER NOT NULL,
    total   INTEGER NOT NULL,
    min     INTEGER NOT NULL,
    max     INTEGER NOT NULL,
    PRIMARY KEY (session, name, proc, dev, stream, bucket)
) WITHOUT ROWID;

-- Copies per session, process, device, stream and direction (CUpti_ActivityMemcpyKind).
CREATE TABLE memcpy_rollup (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    kind    INTEGER NOT NULL,
    n       INTEGER NOT NULL,
    bytes   INTEGER NOT NULL,
    total   INTEGER NOT NULL,
    PRIMARY KEY (session, proc, dev, stream, kind)
) WITHOUT ROWID;

-- API calls per session, process and function.
CREATE TABLE api_rollup (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    domain  INTEGER NOT NULL,
    cbid    INTEGER NOT NULL,
    n       INTEGER NOT NULL,
    total   INTEGER NOT NULL,
    max     INTEGER NOT NULL,
    PRIMARY KEY (session, proc, domain, cbid)
) WITHOUT ROWID;

-- Busy time per session and device (union of kernel, copy and set intervals), swept in
-- start order; [open_start, open_end) is the merged interval still growing.
CREATE TABLE busy_rollup (
    session    INTEGER NOT NULL,
    dev        INTEGER NOT NULL,
    closed_ns  INTEGER NOT NULL,
    open_start INTEGER NOT NULL,
    open_end   INTEGER NOT NULL,
    first_ns   INTEGER NOT NULL,
    last_ns    INTEGER NOT NULL,
    PRIMARY KEY (session, dev)
) WITHOUT ROWID;
