-- gpuprof schema, version 14: the node's always-on PC profile (`[pc] always_on`).
--
-- Samples of the always-on session are not kept per PC like a session's (`pc_sample`) but
-- summed per minute (start of the minute, s since the Unix epoch), process, function, source
-- line and stall reason; the process row gives the executable, container and pod. Kept for
-- `[pc] always_on_keep`, then deleted by retention.
CREATE TABLE pc_rollup (
    minute   INTEGER NOT NULL,
    proc     INTEGER NOT NULL,
    function INTEGER NOT NULL,              -- strings.id
    file     INTEGER NOT NULL,              -- strings.id, 0 = unknown
    line     INTEGER NOT NULL,              -- 0 = unknown
    stall    INTEGER NOT NULL,              -- strings.id
    count    INTEGER NOT NULL,
    PRIMARY KEY (minute, proc, function, file, line, stall)
) WITHOUT ROWID;
-- Retention asks whether a process still has rollups before it deletes the process.
CREATE INDEX pc_rollup_proc ON pc_rollup(proc);
