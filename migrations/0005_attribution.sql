-- gpuprof schema, version 5: container and pod attribution of each process connection.
--
-- gpuprofd reads /proc/PID/cgroup itself (the pid from SO_PEERCRED) and takes the path apart
-- into the container id (64 hex digits) and the Kubernetes pod UID; pod name and namespace come
-- from the kubelet's pod list when [kubernetes] is configured. Empty when unknown. `cgroup`
-- holds the path gpuprofd read, or the one the agent reported when /proc/PID was not visible.
ALTER TABLE processes ADD COLUMN container_id TEXT NOT NULL DEFAULT '';
ALTER TABLE processes ADD COLUMN container_runtime TEXT NOT NULL DEFAULT '';
ALTER TABLE processes ADD COLUMN pod_uid TEXT NOT NULL DEFAULT '';
ALTER TABLE processes ADD COLUMN pod_name TEXT NOT NULL DEFAULT '';
ALTER TABLE processes ADD COLUMN pod_namespace TEXT NOT NULL DEFAULT '';
