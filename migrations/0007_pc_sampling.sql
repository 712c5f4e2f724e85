-- gpuprof schema, version 7: continuous PC sampling.
--
-- Source lines of sampled PCs (0: unknown, the cubin had no line info).
ALTER TABLE pc_sample ADD COLUMN file INTEGER NOT NULL DEFAULT 0;   -- strings.id
ALTER TABLE pc_sample ADD COLUMN line INTEGER NOT NULL DEFAULT 0;

-- PC sampling of each (session, process, device): the last state (written when the session
-- ends; open sessions show the daemon's memory), samples taken and lost (added by the writer
-- with each batch), heals of a stuck hardware buffer. Deleted with the session by retention.
CREATE TABLE pc_sampling (
    session  INTEGER NOT NULL,
    proc     INTEGER NOT NULL,
    device   INTEGER NOT NULL,              -- CUDA ordinal in the process
    state    TEXT NOT NULL DEFAULT '',
    samples  INTEGER NOT NULL DEFAULT 0,
    dropped  INTEGER NOT NULL DEFAULT 0,
    heals    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, proc, device)
) WITHOUT ROWID;

-- Samples per (session, process, function, stall reason) and second (the batch's end, s since
-- the Unix epoch): the time series behind the Perfetto export's stall-reason counters.
CREATE TABLE pc_timeline (
    session  INTEGER NOT NULL,
    proc     INTEGER NOT NULL,
    function INTEGER NOT NULL,              -- strings.id
    stall    INTEGER NOT NULL,              -- strings.id
    t        INTEGER NOT NULL,
    count    INTEGER NOT NULL,
    PRIMARY KEY (session, proc, function, stall, t)
) WITHOUT ROWID;

-- Cubins the injected processes loaded, once per content hash (CUPTI's CRC, 16 hex digits;
-- pc_sample.module names the same string), for PC-to-source lookups.
CREATE TABLE cubins (
    hash          TEXT PRIMARY KEY,
    size          INTEGER NOT NULL,
    data          BLOB NOT NULL,
    first_seen_ns INTEGER NOT NULL,
    proc          INTEGER NOT NULL              -- the process that sent it first
);
