from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_PENDING: _ClassVar[SessionState]
    SESSION_STATE_ACTIVE: _ClassVar[SessionState]
    SESSION_STATE_STOPPING: _ClassVar[SessionState]
    SESSION_STATE_COMPLETED: _ClassVar[SessionState]
    SESSION_STATE_FAILED: _ClassVar[SessionState]
    SESSION_STATE_INTERRUPTED: _ClassVar[SessionState]

class ExportFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPORT_FORMAT_UNSPECIFIED: _ClassVar[ExportFormat]
    EXPORT_FORMAT_CHROME_JSON: _ClassVar[ExportFormat]
    EXPORT_FORMAT_SQLITE: _ClassVar[ExportFormat]
    EXPORT_FORMAT_PERFETTO: _ClassVar[ExportFormat]
    EXPORT_FORMAT_PPROF: _ClassVar[ExportFormat]
    EXPORT_FORMAT_PARQUET: _ClassVar[ExportFormat]
    EXPORT_FORMAT_CHROME_JSON_GZ: _ClassVar[ExportFormat]

class PcGroupBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PC_GROUP_BY_UNSPECIFIED: _ClassVar[PcGroupBy]
    PC_GROUP_BY_FUNCTION: _ClassVar[PcGroupBy]
    PC_GROUP_BY_LINE: _ClassVar[PcGroupBy]
    PC_GROUP_BY_STALL: _ClassVar[PcGroupBy]
    PC_GROUP_BY_PC: _ClassVar[PcGroupBy]
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_PENDING: SessionState
SESSION_STATE_ACTIVE: SessionState
SESSION_STATE_STOPPING: SessionState
SESSION_STATE_COMPLETED: SessionState
SESSION_STATE_FAILED: SessionState
SESSION_STATE_INTERRUPTED: SessionState
EXPORT_FORMAT_UNSPECIFIED: ExportFormat
EXPORT_FORMAT_CHROME_JSON: ExportFormat
EXPORT_FORMAT_SQLITE: ExportFormat
EXPORT_FORMAT_PERFETTO: ExportFormat
EXPORT_FORMAT_PPROF: ExportFormat
EXPORT_FORMAT_PARQUET: ExportFormat
EXPORT_FORMAT_CHROME_JSON_GZ: ExportFormat
PC_GROUP_BY_UNSPECIFIED: PcGroupBy
PC_GROUP_BY_FUNCTION: PcGroupBy
PC_GROUP_BY_LINE: PcGroupBy
PC_GROUP_BY_STALL: PcGroupBy
PC_GROUP_BY_PC: PcGroupBy

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecordKindCount(_message.Message):
    __slots__ = ("kind", "ingested", "dropped")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INGESTED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    ingested: int
    dropped: int
    def __init__(self, kind: _Optional[str] = ..., ingested: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("version", "uptime_seconds", "connected_agents", "records", "database_bytes", "database_path", "ingest_queue_depth", "gpu_count", "gpu_note", "protocol_errors", "active_sessions", "storage_error", "cupti_dropped", "expired_sessions", "expired_records", "now_ns")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AGENTS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    DATABASE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATABASE_PATH_FIELD_NUMBER: _ClassVar[int]
    INGEST_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_NOTE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_ERROR_FIELD_NUMBER: _ClassVar[int]
    CUPTI_DROPPED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    NOW_NS_FIELD_NUMBER: _ClassVar[int]
    version: str
    uptime_seconds: int
    connected_agents: int
    records: _containers.RepeatedCompositeFieldContainer[RecordKindCount]
    database_bytes: int
    database_path: str
    ingest_queue_depth: int
    gpu_count: int
    gpu_note: str
    protocol_errors: int
    active_sessions: int
    storage_error: str
    cupti_dropped: int
    expired_sessions: int
    expired_records: int
    now_ns: int
    def __init__(self, version: _Optional[str] = ..., uptime_seconds: _Optional[int] = ..., connected_agents: _Optional[int] = ..., records: _Optional[_Iterable[_Union[RecordKindCount, _Mapping]]] = ..., database_bytes: _Optional[int] = ..., database_path: _Optional[str] = ..., ingest_queue_depth: _Optional[int] = ..., gpu_count: _Optional[int] = ..., gpu_note: _Optional[str] = ..., protocol_errors: _Optional[int] = ..., active_sessions: _Optional[int] = ..., storage_error: _Optional[str] = ..., cupti_dropped: _Optional[int] = ..., expired_sessions: _Optional[int] = ..., expired_records: _Optional[int] = ..., now_ns: _Optional[int] = ...) -> None: ...

class ListDevicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Device(_message.Message):
    __slots__ = ("index", "uuid", "name", "compute_major", "compute_minor", "sm_count", "global_memory_bytes", "monitor_state", "pci_bus_id", "mig_mode", "power_limit_watts", "gpm_supported", "driver_version", "cuda_version", "origin")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MAJOR_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MINOR_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MONITOR_STATE_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MIG_MODE_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    GPM_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    compute_major: int
    compute_minor: int
    sm_count: int
    global_memory_bytes: int
    monitor_state: str
    pci_bus_id: str
    mig_mode: str
    power_limit_watts: float
    gpm_supported: bool
    driver_version: str
    cuda_version: str
    origin: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., compute_major: _Optional[int] = ..., compute_minor: _Optional[int] = ..., sm_count: _Optional[int] = ..., global_memory_bytes: _Optional[int] = ..., monitor_state: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., mig_mode: _Optional[str] = ..., power_limit_watts: _Optional[float] = ..., gpm_supported: _Optional[bool] = ..., driver_version: _Optional[str] = ..., cuda_version: _Optional[str] = ..., origin: _Optional[str] = ...) -> None: ...

class ListDevicesResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ...) -> None: ...

class ListProcessesRequest(_message.Message):
    __slots__ = ("include_exited",)
    INCLUDE_EXITED_FIELD_NUMBER: _ClassVar[int]
    include_exited: bool
    def __init__(self, include_exited: _Optional[bool] = ...) -> None: ...

class Process(_message.Message):
    __slots__ = ("id", "pid", "uid", "exe", "cmdline", "cgroup", "agent_kind", "connected_at_ns", "disconnected_at_ns", "trace_state", "cupti_version", "container_id", "container_runtime", "pod_uid", "pod_name", "pod_namespace", "job_id", "rank", "local_rank", "world_size", "job_launcher", "role", "parent_pid")
    ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    EXE_FIELD_NUMBER: _ClassVar[int]
    CMDLINE_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    AGENT_KIND_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    DISCONNECTED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    TRACE_STATE_FIELD_NUMBER: _ClassVar[int]
    CUPTI_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    JOB_LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PARENT_PID_FIELD_NUMBER: _ClassVar[int]
    id: int
    pid: int
    uid: int
    exe: str
    cmdline: _containers.RepeatedScalarFieldContainer[str]
    cgroup: str
    agent_kind: str
    connected_at_ns: int
    disconnected_at_ns: int
    trace_state: str
    cupti_version: int
    container_id: str
    container_runtime: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    job_id: str
    rank: int
    local_rank: int
    world_size: int
    job_launcher: str
    role: str
    parent_pid: int
    def __init__(self, id: _Optional[int] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ..., exe: _Optional[str] = ..., cmdline: _Optional[_Iterable[str]] = ..., cgroup: _Optional[str] = ..., agent_kind: _Optional[str] = ..., connected_at_ns: _Optional[int] = ..., disconnected_at_ns: _Optional[int] = ..., trace_state: _Optional[str] = ..., cupti_version: _Optional[int] = ..., container_id: _Optional[str] = ..., container_runtime: _Optional[str] = ..., pod_uid: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_namespace: _Optional[str] = ..., job_id: _Optional[str] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., world_size: _Optional[int] = ..., job_launcher: _Optional[str] = ..., role: _Optional[str] = ..., parent_pid: _Optional[int] = ...) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[Process]
    def __init__(self, processes: _Optional[_Iterable[_Union[Process, _Mapping]]] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ("pid", "exe_name", "exe_pattern", "cgroup", "all", "pod_uid", "container_id", "job")
    PID_FIELD_NUMBER: _ClassVar[int]
    EXE_NAME_FIELD_NUMBER: _ClassVar[int]
    EXE_PATTERN_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    pid: int
    exe_name: str
    exe_pattern: str
    cgroup: str
    all: bool
    pod_uid: str
    container_id: str
    job: JobTarget
    def __init__(self, pid: _Optional[int] = ..., exe_name: _Optional[str] = ..., exe_pattern: _Optional[str] = ..., cgroup: _Optional[str] = ..., all: _Optional[bool] = ..., pod_uid: _Optional[str] = ..., container_id: _Optional[str] = ..., job: _Optional[_Union[JobTarget, _Mapping]] = ...) -> None: ...

class JobTarget(_message.Message):
    __slots__ = ("job_id", "ranks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class CollectOptions(_message.Message):
    __slots__ = ("preset", "pc_sampling", "pc_sampling_period_log2", "pm_metrics", "pm_sampling_rate_hz", "pc_stall_reasons", "pc_flush_interval_ms", "pc_hw_buffer_mib", "pc_scratch_buffer_mib", "pc_mode", "pc_cost_budget_pct")
    PRESET_FIELD_NUMBER: _ClassVar[int]
    PC_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PC_SAMPLING_PERIOD_LOG2_FIELD_NUMBER: _ClassVar[int]
    PM_METRICS_FIELD_NUMBER: _ClassVar[int]
    PM_SAMPLING_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    PC_STALL_REASONS_FIELD_NUMBER: _ClassVar[int]
    PC_FLUSH_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PC_HW_BUFFER_MIB_FIELD_NUMBER: _ClassVar[int]
    PC_SCRATCH_BUFFER_MIB_FIELD_NUMBER: _ClassVar[int]
    PC_MODE_FIELD_NUMBER: _ClassVar[int]
    PC_COST_BUDGET_PCT_FIELD_NUMBER: _ClassVar[int]
    preset: str
    pc_sampling: bool
    pc_sampling_period_log2: int
    pm_metrics: _containers.RepeatedScalarFieldContainer[str]
    pm_sampling_rate_hz: int
    pc_stall_reasons: _containers.RepeatedScalarFieldContainer[str]
    pc_flush_interval_ms: int
    pc_hw_buffer_mib: int
    pc_scratch_buffer_mib: int
    pc_mode: str
    pc_cost_budget_pct: float
    def __init__(self, preset: _Optional[str] = ..., pc_sampling: _Optional[bool] = ..., pc_sampling_period_log2: _Optional[int] = ..., pm_metrics: _Optional[_Iterable[str]] = ..., pm_sampling_rate_hz: _Optional[int] = ..., pc_stall_reasons: _Optional[_Iterable[str]] = ..., pc_flush_interval_ms: _Optional[int] = ..., pc_hw_buffer_mib: _Optional[int] = ..., pc_scratch_buffer_mib: _Optional[int] = ..., pc_mode: _Optional[str] = ..., pc_cost_budget_pct: _Optional[float] = ...) -> None: ...

class StartSessionRequest(_message.Message):
    __slots__ = ("name", "targets", "collect", "start_at_ns", "duration_ms", "max_records")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    COLLECT_FIELD_NUMBER: _ClassVar[int]
    START_AT_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    targets: _containers.RepeatedCompositeFieldContainer[Target]
    collect: CollectOptions
    start_at_ns: int
    duration_ms: int
    max_records: int
    def __init__(self, name: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[Target, _Mapping]]] = ..., collect: _Optional[_Union[CollectOptions, _Mapping]] = ..., start_at_ns: _Optional[int] = ..., duration_ms: _Optional[int] = ..., max_records: _Optional[int] = ...) -> None: ...

class StopSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class SessionProcess(_message.Message):
    __slots__ = ("process_id", "pid", "exe", "records", "dropped", "displaced", "state", "joined_at_ns", "detail", "container_id", "pod_uid", "pod_name", "pod_namespace", "pc_sampling", "job_id", "rank", "role")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXE_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DISPLACED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOINED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PC_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    pid: int
    exe: str
    records: int
    dropped: int
    displaced: bool
    state: str
    joined_at_ns: int
    detail: str
    container_id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    pc_sampling: _containers.RepeatedCompositeFieldContainer[PcSamplingDevice]
    job_id: str
    rank: int
    role: str
    def __init__(self, process_id: _Optional[int] = ..., pid: _Optional[int] = ..., exe: _Optional[str] = ..., records: _Optional[int] = ..., dropped: _Optional[int] = ..., displaced: _Optional[bool] = ..., state: _Optional[str] = ..., joined_at_ns: _Optional[int] = ..., detail: _Optional[str] = ..., container_id: _Optional[str] = ..., pod_uid: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_namespace: _Optional[str] = ..., pc_sampling: _Optional[_Iterable[_Union[PcSamplingDevice, _Mapping]]] = ..., job_id: _Optional[str] = ..., rank: _Optional[int] = ..., role: _Optional[str] = ...) -> None: ...

class PcSamplingDevice(_message.Message):
    __slots__ = ("device", "state", "samples", "dropped", "heals")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    HEALS_FIELD_NUMBER: _ClassVar[int]
    device: int
    state: str
    samples: int
    dropped: int
    heals: int
    def __init__(self, device: _Optional[int] = ..., state: _Optional[str] = ..., samples: _Optional[int] = ..., dropped: _Optional[int] = ..., heals: _Optional[int] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("id", "name", "state", "targets", "collect", "owner_uid", "created_at_ns", "start_at_ns", "started_at_ns", "stopped_at_ns", "duration_ms", "max_records", "stop_reason", "processes", "records")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    COLLECT_FIELD_NUMBER: _ClassVar[int]
    OWNER_UID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    START_AT_NS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    STOPPED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    state: SessionState
    targets: _containers.RepeatedCompositeFieldContainer[Target]
    collect: CollectOptions
    owner_uid: int
    created_at_ns: int
    start_at_ns: int
    started_at_ns: int
    stopped_at_ns: int
    duration_ms: int
    max_records: int
    stop_reason: str
    processes: _containers.RepeatedCompositeFieldContainer[SessionProcess]
    records: int
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., state: _Optional[_Union[SessionState, str]] = ..., targets: _Optional[_Iterable[_Union[Target, _Mapping]]] = ..., collect: _Optional[_Union[CollectOptions, _Mapping]] = ..., owner_uid: _Optional[int] = ..., created_at_ns: _Optional[int] = ..., start_at_ns: _Optional[int] = ..., started_at_ns: _Optional[int] = ..., stopped_at_ns: _Optional[int] = ..., duration_ms: _Optional[int] = ..., max_records: _Optional[int] = ..., stop_reason: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[SessionProcess, _Mapping]]] = ..., records: _Optional[int] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("states", "name_contains", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    NAME_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[SessionState]
    name_contains: str
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[SessionState, str]]] = ..., name_contains: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class TimeRange(_message.Message):
    __slots__ = ("start_ns", "end_ns")
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    start_ns: int
    end_ns: int
    def __init__(self, start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ...) -> None: ...

class RecordFilter(_message.Message):
    __slots__ = ("process_ids", "device_ids", "stream_ids", "name_pattern", "time_range")
    PROCESS_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_IDS_FIELD_NUMBER: _ClassVar[int]
    NAME_PATTERN_FIELD_NUMBER: _ClassVar[int]
    TIME_RANGE_FIELD_NUMBER: _ClassVar[int]
    process_ids: _containers.RepeatedScalarFieldContainer[int]
    device_ids: _containers.RepeatedScalarFieldContainer[int]
    stream_ids: _containers.RepeatedScalarFieldContainer[int]
    name_pattern: str
    time_range: TimeRange
    def __init__(self, process_ids: _Optional[_Iterable[int]] = ..., device_ids: _Optional[_Iterable[int]] = ..., stream_ids: _Optional[_Iterable[int]] = ..., name_pattern: _Optional[str] = ..., time_range: _Optional[_Union[TimeRange, _Mapping]] = ...) -> None: ...

class QueryRecordsRequest(_message.Message):
    __slots__ = ("session_id", "kinds", "filter", "limit")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    filter: RecordFilter
    limit: int
    def __init__(self, session_id: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ..., filter: _Optional[_Union[RecordFilter, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class KernelRow(_message.Message):
    __slots__ = ("process_id", "start_ns", "end_ns", "device_id", "stream_id", "correlation_id", "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread", "static_shared_bytes", "dynamic_shared_bytes", "mangled_name")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRID_X_FIELD_NUMBER: _ClassVar[int]
    GRID_Y_FIELD_NUMBER: _ClassVar[int]
    GRID_Z_FIELD_NUMBER: _ClassVar[int]
    BLOCK_X_FIELD_NUMBER: _ClassVar[int]
    BLOCK_Y_FIELD_NUMBER: _ClassVar[int]
    BLOCK_Z_FIELD_NUMBER: _ClassVar[int]
    REGISTERS_PER_THREAD_FIELD_NUMBER: _ClassVar[int]
    STATIC_SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MANGLED_NAME_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    start_ns: int
    end_ns: int
    device_id: int
    stream_id: int
    correlation_id: int
    name: str
    grid_x: int
    grid_y: int
    grid_z: int
    block_x: int
    block_y: int
    block_z: int
    registers_per_thread: int
    static_shared_bytes: int
    dynamic_shared_bytes: int
    mangled_name: str
    def __init__(self, process_id: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., device_id: _Optional[int] = ..., stream_id: _Optional[int] = ..., correlation_id: _Optional[int] = ..., name: _Optional[str] = ..., grid_x: _Optional[int] = ..., grid_y: _Optional[int] = ..., grid_z: _Optional[int] = ..., block_x: _Optional[int] = ..., block_y: _Optional[int] = ..., block_z: _Optional[int] = ..., registers_per_thread: _Optional[int] = ..., static_shared_bytes: _Optional[int] = ..., dynamic_shared_bytes: _Optional[int] = ..., mangled_name: _Optional[str] = ...) -> None: ...

class MemcpyRow(_message.Message):
    __slots__ = ("process_id", "start_ns", "end_ns", "device_id", "stream_id", "correlation_id", "bytes", "direction")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    start_ns: int
    end_ns: int
    device_id: int
    stream_id: int
    correlation_id: int
    bytes: int
    direction: str
    def __init__(self, process_id: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., device_id: _Optional[int] = ..., stream_id: _Optional[int] = ..., correlation_id: _Optional[int] = ..., bytes: _Optional[int] = ..., direction: _Optional[str] = ...) -> None: ...

class MemsetRow(_message.Message):
    __slots__ = ("process_id", "start_ns", "end_ns", "device_id", "stream_id", "correlation_id", "bytes")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    start_ns: int
    end_ns: int
    device_id: int
    stream_id: int
    correlation_id: int
    bytes: int
    def __init__(self, process_id: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., device_id: _Optional[int] = ..., stream_id: _Optional[int] = ..., correlation_id: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ApiRow(_message.Message):
    __slots__ = ("process_id", "start_ns", "end_ns", "thread_id", "correlation_id", "domain", "name", "cbid")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CBID_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    start_ns: int
    end_ns: int
    thread_id: int
    correlation_id: int
    domain: str
    name: str
    cbid: int
    def __init__(self, process_id: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., thread_id: _Optional[int] = ..., correlation_id: _Optional[int] = ..., domain: _Optional[str] = ..., name: _Optional[str] = ..., cbid: _Optional[int] = ...) -> None: ...

class SyncRow(_message.Message):
    __slots__ = ("process_id", "start_ns", "end_ns", "stream_id", "correlation_id", "sync_type")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    SYNC_TYPE_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    start_ns: int
    end_ns: int
    stream_id: int
    correlation_id: int
    sync_type: str
    def __init__(self, process_id: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., stream_id: _Optional[int] = ..., correlation_id: _Optional[int] = ..., sync_type: _Optional[str] = ...) -> None: ...

class MarkerRow(_message.Message):
    __slots__ = ("process_id", "start_ns", "end_ns", "thread_id", "name", "domain", "is_mark")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    IS_MARK_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    start_ns: int
    end_ns: int
    thread_id: int
    name: str
    domain: str
    is_mark: bool
    def __init__(self, process_id: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., thread_id: _Optional[int] = ..., name: _Optional[str] = ..., domain: _Optional[str] = ..., is_mark: _Optional[bool] = ...) -> None: ...

class CollectiveRow(_message.Message):
    __slots__ = ("process_id", "start_ns", "end_ns", "thread_id", "name", "seq", "communicator", "rank", "nranks", "count", "bytes", "datatype", "root", "algorithm", "protocol", "channels", "gpu_start_ns", "gpu_end_ns", "kernel_correlation_id", "device_id")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATOR_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NRANKS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    GPU_START_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_END_NS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    start_ns: int
    end_ns: int
    thread_id: int
    name: str
    seq: int
    communicator: str
    rank: int
    nranks: int
    count: int
    bytes: int
    datatype: str
    root: int
    algorithm: str
    protocol: str
    channels: int
    gpu_start_ns: int
    gpu_end_ns: int
    kernel_correlation_id: int
    device_id: int
    def __init__(self, process_id: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., thread_id: _Optional[int] = ..., name: _Optional[str] = ..., seq: _Optional[int] = ..., communicator: _Optional[str] = ..., rank: _Optional[int] = ..., nranks: _Optional[int] = ..., count: _Optional[int] = ..., bytes: _Optional[int] = ..., datatype: _Optional[str] = ..., root: _Optional[int] = ..., algorithm: _Optional[str] = ..., protocol: _Optional[str] = ..., channels: _Optional[int] = ..., gpu_start_ns: _Optional[int] = ..., gpu_end_ns: _Optional[int] = ..., kernel_correlation_id: _Optional[int] = ..., device_id: _Optional[int] = ...) -> None: ...

class QueryRecordsResponse(_message.Message):
    __slots__ = ("kernels", "memcpys", "memsets", "api_calls", "syncs", "markers", "collectives")
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    MEMCPYS_FIELD_NUMBER: _ClassVar[int]
    MEMSETS_FIELD_NUMBER: _ClassVar[int]
    API_CALLS_FIELD_NUMBER: _ClassVar[int]
    SYNCS_FIELD_NUMBER: _ClassVar[int]
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    kernels: _containers.RepeatedCompositeFieldContainer[KernelRow]
    memcpys: _containers.RepeatedCompositeFieldContainer[MemcpyRow]
    memsets: _containers.RepeatedCompositeFieldContainer[MemsetRow]
    api_calls: _containers.RepeatedCompositeFieldContainer[ApiRow]
    syncs: _containers.RepeatedCompositeFieldContainer[SyncRow]
    markers: _containers.RepeatedCompositeFieldContainer[MarkerRow]
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveRow]
    def __init__(self, kernels: _Optional[_Iterable[_Union[KernelRow, _Mapping]]] = ..., memcpys: _Optional[_Iterable[_Union[MemcpyRow, _Mapping]]] = ..., memsets: _Optional[_Iterable[_Union[MemsetRow, _Mapping]]] = ..., api_calls: _Optional[_Iterable[_Union[ApiRow, _Mapping]]] = ..., syncs: _Optional[_Iterable[_Union[SyncRow, _Mapping]]] = ..., markers: _Optional[_Iterable[_Union[MarkerRow, _Mapping]]] = ..., collectives: _Optional[_Iterable[_Union[CollectiveRow, _Mapping]]] = ...) -> None: ...

class GetSummaryRequest(_message.Message):
    __slots__ = ("session_id", "filter", "top")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    filter: RecordFilter
    top: int
    def __init__(self, session_id: _Optional[int] = ..., filter: _Optional[_Union[RecordFilter, _Mapping]] = ..., top: _Optional[int] = ...) -> None: ...

class KernelStat(_message.Message):
    __slots__ = ("name", "mangled_name", "count", "total_ns", "mean_ns", "p50_ns", "p95_ns", "max_ns", "min_ns", "stddev_ns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MANGLED_NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    MEAN_NS_FIELD_NUMBER: _ClassVar[int]
    P50_NS_FIELD_NUMBER: _ClassVar[int]
    P95_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_NS_FIELD_NUMBER: _ClassVar[int]
    MIN_NS_FIELD_NUMBER: _ClassVar[int]
    STDDEV_NS_FIELD_NUMBER: _ClassVar[int]
    name: str
    mangled_name: str
    count: int
    total_ns: int
    mean_ns: int
    p50_ns: int
    p95_ns: int
    max_ns: int
    min_ns: int
    stddev_ns: float
    def __init__(self, name: _Optional[str] = ..., mangled_name: _Optional[str] = ..., count: _Optional[int] = ..., total_ns: _Optional[int] = ..., mean_ns: _Optional[int] = ..., p50_ns: _Optional[int] = ..., p95_ns: _Optional[int] = ..., max_ns: _Optional[int] = ..., min_ns: _Optional[int] = ..., stddev_ns: _Optional[float] = ...) -> None: ...

class DeviceBusy(_message.Message):
    __slots__ = ("device_id", "busy_ns", "span_ns")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    BUSY_NS_FIELD_NUMBER: _ClassVar[int]
    SPAN_NS_FIELD_NUMBER: _ClassVar[int]
    device_id: int
    busy_ns: int
    span_ns: int
    def __init__(self, device_id: _Optional[int] = ..., busy_ns: _Optional[int] = ..., span_ns: _Optional[int] = ...) -> None: ...

class CopyStat(_message.Message):
    __slots__ = ("direction", "count", "bytes", "total_ns", "bandwidth_gbps")
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    direction: str
    count: int
    bytes: int
    total_ns: int
    bandwidth_gbps: float
    def __init__(self, direction: _Optional[str] = ..., count: _Optional[int] = ..., bytes: _Optional[int] = ..., total_ns: _Optional[int] = ..., bandwidth_gbps: _Optional[float] = ...) -> None: ...

class ApiStat(_message.Message):
    __slots__ = ("name", "domain", "count", "total_ns", "max_ns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_NS_FIELD_NUMBER: _ClassVar[int]
    name: str
    domain: str
    count: int
    total_ns: int
    max_ns: int
    def __init__(self, name: _Optional[str] = ..., domain: _Optional[str] = ..., count: _Optional[int] = ..., total_ns: _Optional[int] = ..., max_ns: _Optional[int] = ...) -> None: ...

class GetSummaryResponse(_message.Message):
    __slots__ = ("top_kernels", "device_busy", "copies", "api_calls", "kernel_count", "kernel_total_ns", "collectives")
    TOP_KERNELS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BUSY_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    API_CALLS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_COUNT_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    top_kernels: _containers.RepeatedCompositeFieldContainer[KernelStat]
    device_busy: _containers.RepeatedCompositeFieldContainer[DeviceBusy]
    copies: _containers.RepeatedCompositeFieldContainer[CopyStat]
    api_calls: _containers.RepeatedCompositeFieldContainer[ApiStat]
    kernel_count: int
    kernel_total_ns: int
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveStat]
    def __init__(self, top_kernels: _Optional[_Iterable[_Union[KernelStat, _Mapping]]] = ..., device_busy: _Optional[_Iterable[_Union[DeviceBusy, _Mapping]]] = ..., copies: _Optional[_Iterable[_Union[CopyStat, _Mapping]]] = ..., api_calls: _Optional[_Iterable[_Union[ApiStat, _Mapping]]] = ..., kernel_count: _Optional[int] = ..., kernel_total_ns: _Optional[int] = ..., collectives: _Optional[_Iterable[_Union[CollectiveStat, _Mapping]]] = ...) -> None: ...

class CollectiveStat(_message.Message):
    __slots__ = ("name", "count", "bytes", "total_ns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    bytes: int
    total_ns: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., bytes: _Optional[int] = ..., total_ns: _Optional[int] = ...) -> None: ...

class GetJobSummaryRequest(_message.Message):
    __slots__ = ("session_id", "job_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    job_id: str
    def __init__(self, session_id: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class RankSummary(_message.Message):
    __slots__ = ("process_id", "pid", "rank", "device_ids", "start_ns", "end_ns", "kernel_count", "step_ns", "step_source", "step_name", "steps", "busy_ns", "busy_share", "nccl_count", "nccl_ns", "wait_ns", "last_count", "collectives")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_COUNT_FIELD_NUMBER: _ClassVar[int]
    STEP_NS_FIELD_NUMBER: _ClassVar[int]
    STEP_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BUSY_NS_FIELD_NUMBER: _ClassVar[int]
    BUSY_SHARE_FIELD_NUMBER: _ClassVar[int]
    NCCL_COUNT_FIELD_NUMBER: _ClassVar[int]
    NCCL_NS_FIELD_NUMBER: _ClassVar[int]
    WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_COUNT_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    pid: int
    rank: int
    device_ids: _containers.RepeatedScalarFieldContainer[int]
    start_ns: int
    end_ns: int
    kernel_count: int
    step_ns: int
    step_source: str
    step_name: str
    steps: int
    busy_ns: int
    busy_share: float
    nccl_count: int
    nccl_ns: int
    wait_ns: int
    last_count: int
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveCount]
    def __init__(self, process_id: _Optional[int] = ..., pid: _Optional[int] = ..., rank: _Optional[int] = ..., device_ids: _Optional[_Iterable[int]] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., kernel_count: _Optional[int] = ..., step_ns: _Optional[int] = ..., step_source: _Optional[str] = ..., step_name: _Optional[str] = ..., steps: _Optional[int] = ..., busy_ns: _Optional[int] = ..., busy_share: _Optional[float] = ..., nccl_count: _Optional[int] = ..., nccl_ns: _Optional[int] = ..., wait_ns: _Optional[int] = ..., last_count: _Optional[int] = ..., collectives: _Optional[_Iterable[_Union[CollectiveCount, _Mapping]]] = ...) -> None: ...

class CollectiveCount(_message.Message):
    __slots__ = ("name", "count", "bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    bytes: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class Straggler(_message.Message):
    __slots__ = ("rank", "process_id", "last_count", "collectives", "others_wait_ns", "median_wait_ns", "evidence")
    RANK_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_COUNT_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    OTHERS_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    process_id: int
    last_count: int
    collectives: int
    others_wait_ns: int
    median_wait_ns: int
    evidence: str
    def __init__(self, rank: _Optional[int] = ..., process_id: _Optional[int] = ..., last_count: _Optional[int] = ..., collectives: _Optional[int] = ..., others_wait_ns: _Optional[int] = ..., median_wait_ns: _Optional[int] = ..., evidence: _Optional[str] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("session_id", "job_id", "ranks", "collectives", "straggler", "no_straggler", "notes", "matched_by")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_FIELD_NUMBER: _ClassVar[int]
    NO_STRAGGLER_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    MATCHED_BY_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    job_id: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankSummary]
    collectives: int
    straggler: Straggler
    no_straggler: str
    notes: _containers.RepeatedScalarFieldContainer[str]
    matched_by: str
    def __init__(self, session_id: _Optional[int] = ..., job_id: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[RankSummary, _Mapping]]] = ..., collectives: _Optional[int] = ..., straggler: _Optional[_Union[Straggler, _Mapping]] = ..., no_straggler: _Optional[str] = ..., notes: _Optional[_Iterable[str]] = ..., matched_by: _Optional[str] = ...) -> None: ...

class ExportTraceRequest(_message.Message):
    __slots__ = ("session_id", "format", "filter", "gzip_level")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    GZIP_LEVEL_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    format: ExportFormat
    filter: RecordFilter
    gzip_level: int
    def __init__(self, session_id: _Optional[int] = ..., format: _Optional[_Union[ExportFormat, str]] = ..., filter: _Optional[_Union[RecordFilter, _Mapping]] = ..., gzip_level: _Optional[int] = ...) -> None: ...

class ExportTraceResponse(_message.Message):
    __slots__ = ("data", "events_written", "events_total", "file_name")
    DATA_FIELD_NUMBER: _ClassVar[int]
    EVENTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    EVENTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    events_written: int
    events_total: int
    file_name: str
    def __init__(self, data: _Optional[bytes] = ..., events_written: _Optional[int] = ..., events_total: _Optional[int] = ..., file_name: _Optional[str] = ...) -> None: ...

class StreamPmSamplesRequest(_message.Message):
    __slots__ = ("devices", "metrics", "downsample_ms", "sources", "cupti_rate_hz")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    DOWNSAMPLE_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    CUPTI_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[int]
    metrics: _containers.RepeatedScalarFieldContainer[str]
    downsample_ms: int
    sources: _containers.RepeatedScalarFieldContainer[str]
    cupti_rate_hz: int
    def __init__(self, devices: _Optional[_Iterable[int]] = ..., metrics: _Optional[_Iterable[str]] = ..., downsample_ms: _Optional[int] = ..., sources: _Optional[_Iterable[str]] = ..., cupti_rate_hz: _Optional[int] = ...) -> None: ...

class PmValue(_message.Message):
    __slots__ = ("metric", "value")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    metric: str
    value: float
    def __init__(self, metric: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class PmSamplePoint(_message.Message):
    __slots__ = ("device", "start_ns", "end_ns", "values", "source")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    device: int
    start_ns: int
    end_ns: int
    values: _containers.RepeatedCompositeFieldContainer[PmValue]
    source: str
    def __init__(self, device: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., values: _Optional[_Iterable[_Union[PmValue, _Mapping]]] = ..., source: _Optional[str] = ...) -> None: ...

class PmPaused(_message.Message):
    __slots__ = ("device", "holder", "reason", "resumed")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    device: int
    holder: str
    reason: str
    resumed: bool
    def __init__(self, device: _Optional[int] = ..., holder: _Optional[str] = ..., reason: _Optional[str] = ..., resumed: _Optional[bool] = ...) -> None: ...

class StreamPmSamplesResponse(_message.Message):
    __slots__ = ("sample", "paused")
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    sample: PmSamplePoint
    paused: PmPaused
    def __init__(self, sample: _Optional[_Union[PmSamplePoint, _Mapping]] = ..., paused: _Optional[_Union[PmPaused, _Mapping]] = ...) -> None: ...

class StreamPcSamplesRequest(_message.Message):
    __slots__ = ("session_id", "kernel")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    kernel: str
    def __init__(self, session_id: _Optional[int] = ..., kernel: _Optional[str] = ...) -> None: ...

class PcSampleRow(_message.Message):
    __slots__ = ("process_id", "function_name", "pc_offset", "stall_reason", "count", "mangled_name", "file", "line", "device")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    PC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STALL_REASON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MANGLED_NAME_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    process_id: int
    function_name: str
    pc_offset: int
    stall_reason: str
    count: int
    mangled_name: str
    file: str
    line: int
    device: int
    def __init__(self, process_id: _Optional[int] = ..., function_name: _Optional[str] = ..., pc_offset: _Optional[int] = ..., stall_reason: _Optional[str] = ..., count: _Optional[int] = ..., mangled_name: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., device: _Optional[int] = ...) -> None: ...

class StreamPcSamplesResponse(_message.Message):
    __slots__ = ("samples", "start_ns", "end_ns", "dropped_samples")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[PcSampleRow]
    start_ns: int
    end_ns: int
    dropped_samples: int
    def __init__(self, samples: _Optional[_Iterable[_Union[PcSampleRow, _Mapping]]] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., dropped_samples: _Optional[int] = ...) -> None: ...

class QueryPcSamplesRequest(_message.Message):
    __slots__ = ("session_id", "group_by", "kernel", "limit", "since_ns", "pod", "exe")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    EXE_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    group_by: PcGroupBy
    kernel: str
    limit: int
    since_ns: int
    pod: str
    exe: str
    def __init__(self, session_id: _Optional[int] = ..., group_by: _Optional[_Union[PcGroupBy, str]] = ..., kernel: _Optional[str] = ..., limit: _Optional[int] = ..., since_ns: _Optional[int] = ..., pod: _Optional[str] = ..., exe: _Optional[str] = ...) -> None: ...

class StallCount(_message.Message):
    __slots__ = ("reason", "count")
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    count: int
    def __init__(self, reason: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class PcProfileRow(_message.Message):
    __slots__ = ("function_name", "mangled_name", "file", "line", "pc_offset", "stall_reason", "samples", "stalls")
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    MANGLED_NAME_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    PC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STALL_REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    STALLS_FIELD_NUMBER: _ClassVar[int]
    function_name: str
    mangled_name: str
    file: str
    line: int
    pc_offset: int
    stall_reason: str
    samples: int
    stalls: _containers.RepeatedCompositeFieldContainer[StallCount]
    def __init__(self, function_name: _Optional[str] = ..., mangled_name: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., pc_offset: _Optional[int] = ..., stall_reason: _Optional[str] = ..., samples: _Optional[int] = ..., stalls: _Optional[_Iterable[_Union[StallCount, _Mapping]]] = ...) -> None: ...

class QueryPcSamplesResponse(_message.Message):
    __slots__ = ("rows", "total_samples", "dropped_samples", "total_rows")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[PcProfileRow]
    total_samples: int
    dropped_samples: int
    total_rows: int
    def __init__(self, rows: _Optional[_Iterable[_Union[PcProfileRow, _Mapping]]] = ..., total_samples: _Optional[int] = ..., dropped_samples: _Optional[int] = ..., total_rows: _Optional[int] = ...) -> None: ...

class DiffSide(_message.Message):
    __slots__ = ("session_id", "process_ids", "rank", "since_ns", "until_ns", "pod", "exe", "summary", "pc", "label")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_IDS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_NS_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    EXE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PC_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    process_ids: _containers.RepeatedScalarFieldContainer[int]
    rank: int
    since_ns: int
    until_ns: int
    pod: str
    exe: str
    summary: GetSummaryResponse
    pc: QueryPcSamplesResponse
    label: str
    def __init__(self, session_id: _Optional[int] = ..., process_ids: _Optional[_Iterable[int]] = ..., rank: _Optional[int] = ..., since_ns: _Optional[int] = ..., until_ns: _Optional[int] = ..., pod: _Optional[str] = ..., exe: _Optional[str] = ..., summary: _Optional[_Union[GetSummaryResponse, _Mapping]] = ..., pc: _Optional[_Union[QueryPcSamplesResponse, _Mapping]] = ..., label: _Optional[str] = ...) -> None: ...

class DiffSummaryRequest(_message.Message):
    __slots__ = ("a", "b", "limit", "by_shape")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BY_SHAPE_FIELD_NUMBER: _ClassVar[int]
    a: DiffSide
    b: DiffSide
    limit: int
    by_shape: bool
    def __init__(self, a: _Optional[_Union[DiffSide, _Mapping]] = ..., b: _Optional[_Union[DiffSide, _Mapping]] = ..., limit: _Optional[int] = ..., by_shape: _Optional[bool] = ...) -> None: ...

class KernelDiff(_message.Message):
    __slots__ = ("name", "mangled_name", "change", "significant", "count_a", "count_b", "total_ns_a", "total_ns_b", "mean_ns_a", "mean_ns_b", "stddev_ns_a", "stddev_ns_b", "delta_total_ns", "delta_mean_ns", "noise_ns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MANGLED_NAME_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    SIGNIFICANT_FIELD_NUMBER: _ClassVar[int]
    COUNT_A_FIELD_NUMBER: _ClassVar[int]
    COUNT_B_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_A_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_B_FIELD_NUMBER: _ClassVar[int]
    MEAN_NS_A_FIELD_NUMBER: _ClassVar[int]
    MEAN_NS_B_FIELD_NUMBER: _ClassVar[int]
    STDDEV_NS_A_FIELD_NUMBER: _ClassVar[int]
    STDDEV_NS_B_FIELD_NUMBER: _ClassVar[int]
    DELTA_TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    DELTA_MEAN_NS_FIELD_NUMBER: _ClassVar[int]
    NOISE_NS_FIELD_NUMBER: _ClassVar[int]
    name: str
    mangled_name: str
    change: str
    significant: bool
    count_a: int
    count_b: int
    total_ns_a: int
    total_ns_b: int
    mean_ns_a: float
    mean_ns_b: float
    stddev_ns_a: float
    stddev_ns_b: float
    delta_total_ns: int
    delta_mean_ns: float
    noise_ns: float
    def __init__(self, name: _Optional[str] = ..., mangled_name: _Optional[str] = ..., change: _Optional[str] = ..., significant: _Optional[bool] = ..., count_a: _Optional[int] = ..., count_b: _Optional[int] = ..., total_ns_a: _Optional[int] = ..., total_ns_b: _Optional[int] = ..., mean_ns_a: _Optional[float] = ..., mean_ns_b: _Optional[float] = ..., stddev_ns_a: _Optional[float] = ..., stddev_ns_b: _Optional[float] = ..., delta_total_ns: _Optional[int] = ..., delta_mean_ns: _Optional[float] = ..., noise_ns: _Optional[float] = ...) -> None: ...

class DeviceBusyDiff(_message.Message):
    __slots__ = ("device_id", "busy_ns_a", "busy_ns_b", "span_ns_a", "span_ns_b", "delta_busy_ns")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    BUSY_NS_A_FIELD_NUMBER: _ClassVar[int]
    BUSY_NS_B_FIELD_NUMBER: _ClassVar[int]
    SPAN_NS_A_FIELD_NUMBER: _ClassVar[int]
    SPAN_NS_B_FIELD_NUMBER: _ClassVar[int]
    DELTA_BUSY_NS_FIELD_NUMBER: _ClassVar[int]
    device_id: int
    busy_ns_a: int
    busy_ns_b: int
    span_ns_a: int
    span_ns_b: int
    delta_busy_ns: int
    def __init__(self, device_id: _Optional[int] = ..., busy_ns_a: _Optional[int] = ..., busy_ns_b: _Optional[int] = ..., span_ns_a: _Optional[int] = ..., span_ns_b: _Optional[int] = ..., delta_busy_ns: _Optional[int] = ...) -> None: ...

class CopyDiff(_message.Message):
    __slots__ = ("direction", "count_a", "count_b", "bytes_a", "bytes_b", "bandwidth_gbps_a", "bandwidth_gbps_b", "total_ns_a", "total_ns_b")
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    COUNT_A_FIELD_NUMBER: _ClassVar[int]
    COUNT_B_FIELD_NUMBER: _ClassVar[int]
    BYTES_A_FIELD_NUMBER: _ClassVar[int]
    BYTES_B_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_GBPS_A_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_GBPS_B_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_A_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_B_FIELD_NUMBER: _ClassVar[int]
    direction: str
    count_a: int
    count_b: int
    bytes_a: int
    bytes_b: int
    bandwidth_gbps_a: float
    bandwidth_gbps_b: float
    total_ns_a: int
    total_ns_b: int
    def __init__(self, direction: _Optional[str] = ..., count_a: _Optional[int] = ..., count_b: _Optional[int] = ..., bytes_a: _Optional[int] = ..., bytes_b: _Optional[int] = ..., bandwidth_gbps_a: _Optional[float] = ..., bandwidth_gbps_b: _Optional[float] = ..., total_ns_a: _Optional[int] = ..., total_ns_b: _Optional[int] = ...) -> None: ...

class CollectiveDiff(_message.Message):
    __slots__ = ("name", "count_a", "count_b", "bytes_a", "bytes_b", "total_ns_a", "total_ns_b")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_A_FIELD_NUMBER: _ClassVar[int]
    COUNT_B_FIELD_NUMBER: _ClassVar[int]
    BYTES_A_FIELD_NUMBER: _ClassVar[int]
    BYTES_B_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_A_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_B_FIELD_NUMBER: _ClassVar[int]
    name: str
    count_a: int
    count_b: int
    bytes_a: int
    bytes_b: int
    total_ns_a: int
    total_ns_b: int
    def __init__(self, name: _Optional[str] = ..., count_a: _Optional[int] = ..., count_b: _Optional[int] = ..., bytes_a: _Optional[int] = ..., bytes_b: _Optional[int] = ..., total_ns_a: _Optional[int] = ..., total_ns_b: _Optional[int] = ...) -> None: ...

class DiffSummaryResponse(_message.Message):
    __slots__ = ("label_a", "label_b", "kernels", "total_kernels", "findings", "kernel_total_ns_a", "kernel_total_ns_b", "devices", "copies", "collectives", "notes", "noise_rule")
    LABEL_A_FIELD_NUMBER: _ClassVar[int]
    LABEL_B_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KERNELS_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TOTAL_NS_A_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TOTAL_NS_B_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    NOISE_RULE_FIELD_NUMBER: _ClassVar[int]
    label_a: str
    label_b: str
    kernels: _containers.RepeatedCompositeFieldContainer[KernelDiff]
    total_kernels: int
    findings: int
    kernel_total_ns_a: int
    kernel_total_ns_b: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceBusyDiff]
    copies: _containers.RepeatedCompositeFieldContainer[CopyDiff]
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveDiff]
    notes: _containers.RepeatedScalarFieldContainer[str]
    noise_rule: str
    def __init__(self, label_a: _Optional[str] = ..., label_b: _Optional[str] = ..., kernels: _Optional[_Iterable[_Union[KernelDiff, _Mapping]]] = ..., total_kernels: _Optional[int] = ..., findings: _Optional[int] = ..., kernel_total_ns_a: _Optional[int] = ..., kernel_total_ns_b: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceBusyDiff, _Mapping]]] = ..., copies: _Optional[_Iterable[_Union[CopyDiff, _Mapping]]] = ..., collectives: _Optional[_Iterable[_Union[CollectiveDiff, _Mapping]]] = ..., notes: _Optional[_Iterable[str]] = ..., noise_rule: _Optional[str] = ...) -> None: ...

class DiffPcSamplesRequest(_message.Message):
    __slots__ = ("a", "b", "group_by", "kernel", "limit")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    a: DiffSide
    b: DiffSide
    group_by: PcGroupBy
    kernel: str
    limit: int
    def __init__(self, a: _Optional[_Union[DiffSide, _Mapping]] = ..., b: _Optional[_Union[DiffSide, _Mapping]] = ..., group_by: _Optional[_Union[PcGroupBy, str]] = ..., kernel: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class PcRowDiff(_message.Message):
    __slots__ = ("function_name", "file", "line", "stall_reason", "samples_a", "samples_b", "share_a", "share_b", "delta_share", "noise_share", "change", "significant")
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    STALL_REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_A_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_B_FIELD_NUMBER: _ClassVar[int]
    SHARE_A_FIELD_NUMBER: _ClassVar[int]
    SHARE_B_FIELD_NUMBER: _ClassVar[int]
    DELTA_SHARE_FIELD_NUMBER: _ClassVar[int]
    NOISE_SHARE_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    SIGNIFICANT_FIELD_NUMBER: _ClassVar[int]
    function_name: str
    file: str
    line: int
    stall_reason: str
    samples_a: int
    samples_b: int
    share_a: float
    share_b: float
    delta_share: float
    noise_share: float
    change: str
    significant: bool
    def __init__(self, function_name: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., stall_reason: _Optional[str] = ..., samples_a: _Optional[int] = ..., samples_b: _Optional[int] = ..., share_a: _Optional[float] = ..., share_b: _Optional[float] = ..., delta_share: _Optional[float] = ..., noise_share: _Optional[float] = ..., change: _Optional[str] = ..., significant: _Optional[bool] = ...) -> None: ...

class DiffPcSamplesResponse(_message.Message):
    __slots__ = ("label_a", "label_b", "total_samples_a", "total_samples_b", "rows", "total_rows", "findings", "notes", "noise_rule")
    LABEL_A_FIELD_NUMBER: _ClassVar[int]
    LABEL_B_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SAMPLES_A_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SAMPLES_B_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    NOISE_RULE_FIELD_NUMBER: _ClassVar[int]
    label_a: str
    label_b: str
    total_samples_a: int
    total_samples_b: int
    rows: _containers.RepeatedCompositeFieldContainer[PcRowDiff]
    total_rows: int
    findings: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    noise_rule: str
    def __init__(self, label_a: _Optional[str] = ..., label_b: _Optional[str] = ..., total_samples_a: _Optional[int] = ..., total_samples_b: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[PcRowDiff, _Mapping]]] = ..., total_rows: _Optional[int] = ..., findings: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., noise_rule: _Optional[str] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("devices", "all", "duration_seconds", "reason")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    duration_seconds: int
    reason: str
    def __init__(self, devices: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ..., duration_seconds: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("device", "holder_kind", "holder", "priority", "reason", "granted_at_ns", "expires_at_ns", "lease_id")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KIND_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_NS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    device: int
    holder_kind: str
    holder: str
    priority: int
    reason: str
    granted_at_ns: int
    expires_at_ns: int
    lease_id: int
    def __init__(self, device: _Optional[int] = ..., holder_kind: _Optional[str] = ..., holder: _Optional[str] = ..., priority: _Optional[int] = ..., reason: _Optional[str] = ..., granted_at_ns: _Optional[int] = ..., expires_at_ns: _Optional[int] = ..., lease_id: _Optional[int] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("reservations",)
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    reservations: _containers.RepeatedCompositeFieldContainer[Reservation]
    def __init__(self, reservations: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("devices", "all")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    def __init__(self, devices: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, devices: _Optional[_Iterable[int]] = ...) -> None: ...

class ListReservationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceReservations(_message.Message):
    __slots__ = ("device", "holder", "waiting", "held_externally")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    HELD_EXTERNALLY_FIELD_NUMBER: _ClassVar[int]
    device: int
    holder: Reservation
    waiting: _containers.RepeatedCompositeFieldContainer[Reservation]
    held_externally: bool
    def __init__(self, device: _Optional[int] = ..., holder: _Optional[_Union[Reservation, _Mapping]] = ..., waiting: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ..., held_externally: _Optional[bool] = ...) -> None: ...

class ListReservationsResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceReservations]
    def __init__(self, devices: _Optional[_Iterable[_Union[DeviceReservations, _Mapping]]] = ...) -> None: ...
