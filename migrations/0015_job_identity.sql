-- gpuprof schema, version 15: the distributed job a process belongs to, as its environment
-- said when it started (the injector's Hello): torchrun (torchelastic), SLURM or MPI.
--
-- job_launcher: "torchelastic", "slurm", "mpi" or ''. job_id: TORCHELASTIC_RUN_ID or
-- SLURM_JOB_ID ('' when none). The ranks are NULL when the environment gave none.
-- parent_pid: the process's parent when it started (0 when unknown).
ALTER TABLE processes ADD COLUMN job_launcher TEXT NOT NULL DEFAULT '';
ALTER TABLE processes ADD COLUMN job_id TEXT NOT NULL DEFAULT '';
ALTER TABLE processes ADD COLUMN job_rank INTEGER;
ALTER TABLE processes ADD COLUMN job_local_rank INTEGER;
ALTER TABLE processes ADD COLUMN job_world_size INTEGER;
ALTER TABLE processes ADD COLUMN job_group_rank INTEGER;
ALTER TABLE processes ADD COLUMN parent_pid INTEGER NOT NULL DEFAULT 0;
CREATE INDEX processes_job ON processes(job_id) WHERE job_id <> '';
