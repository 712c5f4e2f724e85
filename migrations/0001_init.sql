-- gpuprof schema, version 1.
--
-- Record tables are compact on purpose (tens of millions of rows): integer columns only,
-- strings interned in `strings`, times stored as `start` = ns relative to the owning
-- process's `processes.base_ns` and `dur` = end - start, so SQLite's variable-length
-- integers stay short. The *_v views give absolute times (ns since the Unix epoch).
-- `session` is 0 for records captured outside any session.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- Interned strings (kernel names, NVTX messages, metric names, stall reasons).
CREATE TABLE strings (
    id    INTEGER PRIMARY KEY,
    value TEXT NOT NULL UNIQUE
);

-- One row per agent connection (a process may reconnect: a new row).
CREATE TABLE processes (
    id              INTEGER PRIMARY KEY,
    pid             INTEGER NOT NULL,
    uid             INTEGER NOT NULL,
    gid             INTEGER NOT NULL,
    agent_kind      TEXT NOT NULL,          -- 'injector' | 'sampler'
    exe             TEXT NOT NULL,
    cmdline         TEXT NOT NULL,          -- JSON array
    cgroup          TEXT NOT NULL,
    cupti_version   INTEGER NOT NULL,
    base_ns         INTEGER NOT NULL,       -- record times are relative to this
    connected_ns    INTEGER NOT NULL,
    disconnected_ns INTEGER,                -- NULL while connected
    close_reason    TEXT
);

-- GPUs as reported by agents, keyed by UUID.
CREATE TABLE devices (
    id                  INTEGER PRIMARY KEY,
    uuid                TEXT NOT NULL UNIQUE,
    name                TEXT NOT NULL,
    compute_major       INTEGER NOT NULL,
    compute_minor       INTEGER NOT NULL,
    sm_count            INTEGER NOT NULL,
    global_memory_bytes INTEGER NOT NULL,
    pci_bus_id          TEXT NOT NULL,
    first_seen_ns       INTEGER NOT NULL
);

-- Which device ordinal of a process is which GPU.
CREATE TABLE process_devices (
    proc      INTEGER NOT NULL REFERENCES processes(id),
    device_id INTEGER NOT NULL,            -- ordinal in the process
    device    INTEGER NOT NULL REFERENCES devices(id),
    PRIMARY KEY (proc, device_id)
) WITHOUT ROWID;

CREATE TABLE sessions (
    id            INTEGER PRIMARY KEY,
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

-- Processes that took part in a session.
CREATE TABLE session_processes (
    session    INTEGER NOT NULL REFERENCES sessions(id),
    proc       INTEGER NOT NULL REFERENCES processes(id),
    joined_ns  INTEGER NOT NULL,
    left_ns    INTEGER,
    state      TEXT NOT NULL,              -- tracing|displaced|failed|exited|stopped
    detail     TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session, proc)
) WITHOUT ROWID;

-- Drop counters reported by agents (cumulative per connection and kind).
CREATE TABLE drops (
    proc    INTEGER NOT NULL REFERENCES processes(id),
    kind    TEXT NOT NULL,
    dropped INTEGER NOT NULL,
    PRIMARY KEY (proc, kind)
) WITHOUT ROWID;

-- ---------------------------------------------------------------- activity records

CREATE TABLE kernel (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    corr    INTEGER NOT NULL,
    name    INTEGER NOT NULL,               -- strings.id
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL,
    gx INTEGER NOT NULL, gy INTEGER NOT NULL, gz INTEGER NOT NULL,
    bx INTEGER NOT NULL, by INTEGER NOT NULL, bz INTEGER NOT NULL,
    regs    INTEGER NOT NULL,
    ssmem   INTEGER NOT NULL,
    dsmem   INTEGER NOT NULL,
    graph_node INTEGER NOT NULL
);

CREATE TABLE memcpy (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    corr    INTEGER NOT NULL,
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL,
    bytes   INTEGER NOT NULL,
    kind    INTEGER NOT NULL,               -- CUpti_ActivityMemcpyKind
    src_kind INTEGER NOT NULL,
    dst_kind INTEGER NOT NULL,
    src_dev INTEGER NOT NULL,
    dst_dev INTEGER NOT NULL,
    async   INTEGER NOT NULL,
    graph_node INTEGER NOT NULL
);

CREATE TABLE memset (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    corr    INTEGER NOT NULL,
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL,
    bytes   INTEGER NOT NULL,
    value   INTEGER NOT NULL,
    mem_kind INTEGER NOT NULL,
    graph_node INTEGER NOT NULL
);

-- Runtime (domain 1) and driver (domain 2) API calls.
CREATE TABLE api (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    domain  INTEGER NOT NULL,
    cbid    INTEGER NOT NULL,
    corr    INTEGER NOT NULL,
    tid     INTEGER NOT NULL,
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL,
    ret     INTEGER NOT NULL
);

CREATE TABLE sync (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    type    INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    event   INTEGER NOT NULL,
    corr    INTEGER NOT NULL,
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL
);

CREATE TABLE overhead (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    kind    INTEGER NOT NULL,
    obj_kind INTEGER NOT NULL,
    obj_id  INTEGER NOT NULL,
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL
);

-- NVTX ranges and marks.
CREATE TABLE marker (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    id      INTEGER NOT NULL,
    name    INTEGER NOT NULL,               -- strings.id
    domain  INTEGER NOT NULL,               -- strings.id, 0 = default domain
    tid     INTEGER NOT NULL,
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL,
    is_mark INTEGER NOT NULL
);

CREATE TABLE external_correlation (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    ext_kind INTEGER NOT NULL,
    ext_id  INTEGER NOT NULL,
    corr    INTEGER NOT NULL
);

CREATE TABLE context (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    null_stream INTEGER NOT NULL
);

CREATE TABLE stream (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    flags   INTEGER NOT NULL
);

CREATE TABLE graph (
    session INTEGER NOT NULL,
    proc    INTEGER NOT NULL,
    dev     INTEGER NOT NULL,
    ctx     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    corr    INTEGER NOT NULL,
    graph_id INTEGER NOT NULL,
    start   INTEGER NOT NULL,
    dur     INTEGER NOT NULL
);

-- ---------------------------------------------------------------- samples

-- PM metric dictionary.
CREATE TABLE pm_metrics (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);

-- PM samples in long format at full rate (device = devices.id).
CREATE TABLE pm_sample (
    device INTEGER NOT NULL,
    ts     INTEGER NOT NULL,                -- sample end, ns since the Unix epoch
    dur    INTEGER NOT NULL,
    metric INTEGER NOT NULL,                -- pm_metrics.id
    value  REAL NOT NULL
);
CREATE INDEX pm_sample_ts ON pm_sample(device, ts);

-- Downsampled PM aggregates kept after the full-rate window.
CREATE TABLE pm_rollup (
    device   INTEGER NOT NULL,
    bucket_ns INTEGER NOT NULL,             -- bucket start
    width_ns INTEGER NOT NULL,
    metric   INTEGER NOT NULL,
    n        INTEGER NOT NULL,
    mean     REAL NOT NULL,
    min      REAL NOT NULL,
    max      REAL NOT NULL,
    PRIMARY KEY (device, metric, bucket_ns)
) WITHOUT ROWID;

-- PC samples aggregated per (session, process, function, pc offset, stall reason).
CREATE TABLE pc_sample (
    session  INTEGER NOT NULL,
    proc     INTEGER NOT NULL,
    function INTEGER NOT NULL,              -- strings.id
    pc       INTEGER NOT NULL,
    stall    INTEGER NOT NULL,              -- strings.id
    module   INTEGER NOT NULL,              -- strings.id, 0 = unknown
    count    INTEGER NOT NULL,
    PRIMARY KEY (session, proc, function, pc, stall)
) WITHOUT ROWID;

-- ---------------------------------------------------------------- performance-monitor arbiter

-- Leases on a device's performance monitor, live and past.
CREATE TABLE leases (
    id          INTEGER PRIMARY KEY,
    device      INTEGER NOT NULL,           -- daemon device index
    holder_kind TEXT NOT NULL,              -- sampler|pc_sampling|pause|external
    holder      TEXT NOT NULL,
    priority    INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    granted_ns  INTEGER,
    expires_ns  INTEGER,
    ended_ns    INTEGER,
    end_reason  TEXT
);

-- Operator pauses that must survive a restart (ended ones are kept for history).
CREATE TABLE pauses (
    id          INTEGER PRIMARY KEY,
    device      INTEGER NOT NULL,
    owner_uid   INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    created_ns  INTEGER NOT NULL,
    expires_ns  INTEGER NOT NULL,
    ended_ns    INTEGER
);

-- Every grant, revoke, expiry and pause/resume.
CREATE TABLE audit (
    id      INTEGER PRIMARY KEY,
    ts_ns   INTEGER NOT NULL,
    device  INTEGER,
    event   TEXT NOT NULL,                  -- grant|revoke|expire|queue|release|pause|resume|external
    lease   INTEGER,
    actor   TEXT NOT NULL,
    detail  TEXT NOT NULL
);

-- ---------------------------------------------------------------- views with absolute times

CREATE VIEW kernel_v AS
    SELECT k.*, p.base_ns + k.start AS start_ns, p.base_ns + k.start + k.dur AS end_ns
    FROM kernel k JOIN processes p ON p.id = k.proc;
CREATE VIEW memcpy_v AS
    SELECT m.*, p.base_ns + m.start AS start_ns, p.base_ns + m.start + m.dur AS end_ns
    FROM memcpy m JOIN processes p ON p.id = m.proc;
CREATE VIEW memset_v AS
    SELECT m.*, p.base_ns + m.start AS start_ns, p.base_ns + m.start + m.dur AS end_ns
    FROM memset m JOIN processes p ON p.id = m.proc;
CREATE VIEW api_v AS
    SELECT a.*, p.base_ns + a.start AS start_ns, p.base_ns + a.start + a.dur AS end_ns
    FROM api a JOIN processes p ON p.id = a.proc;
CREATE VIEW marker_v AS
    SELECT m.*, p.base_ns + m.start AS start_ns, p.base_ns + m.start + m.dur AS end_ns
    FROM marker m JOIN processes p ON p.id = m.proc;
