-- gpuprof schema, version 16: NCCL collectives, as NCCL reports them to the injector through
-- its profiler plugin interface.
--
-- One row per collective of one rank, on the track of the thread that enqueued it (session,
-- process, thread). `start`, `dur`: the enqueue on the host (relative to the track's base, as
-- every record's start). `gpu_off`: the execution's start in the NCCL kernel (first channel)
-- less `start`, ns; `gpu_dur`: first channel's start to last channel's end, -1 when NCCL
-- reported no kernel timing. `name`, `dtype`, `algo`, `proto`: strings.id (0: none). `comm`:
-- the communicator's 64-bit hash (equal on every rank of it), stored as a signed integer.
CREATE TABLE collective_data (
    track INTEGER NOT NULL,
    name INTEGER NOT NULL,
    start INTEGER NOT NULL,
    dur INTEGER NOT NULL,
    gpu_off INTEGER NOT NULL,
    gpu_dur INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    comm INTEGER NOT NULL,
    count INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    dtype INTEGER NOT NULL,
    algo INTEGER NOT NULL,
    proto INTEGER NOT NULL,
    root INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    nranks INTEGER NOT NULL,
    channels INTEGER NOT NULL
);
CREATE VIEW collective AS
    SELECT k.session AS session, k.proc AS proc, k.tid AS tid, k.base + d.start AS start, d.dur AS dur, d.gpu_off AS gpu_off, d.gpu_dur AS gpu_dur, d.name AS name, d.seq AS seq, d.comm AS comm, d.count AS count, d.bytes AS bytes, d.dtype AS dtype, d.algo AS algo, d.proto AS proto, d.root AS root, d.rank AS rank, d.nranks AS nranks, d.channels AS channels, d.rowid AS rowid
    FROM collective_data d CROSS JOIN tracks k ON k.id = d.track;
CREATE VIEW collective_v AS
    SELECT x.session, x.proc, x.tid, x.name, x.seq, x.comm, x.rank, x.nranks, x.count, x.bytes, x.dtype, x.algo, x.proto, x.root, x.channels, x.start, x.dur,
        p.base_ns + x.start AS start_ns, p.base_ns + x.start + x.dur AS end_ns,
        CASE WHEN x.gpu_dur < 0 THEN NULL ELSE p.base_ns + x.start + x.gpu_off END AS gpu_start_ns,
        CASE WHEN x.gpu_dur < 0 THEN NULL ELSE p.base_ns + x.start + x.gpu_off + x.gpu_dur END AS gpu_end_ns
    FROM collective x JOIN processes p ON p.id = x.proc;
