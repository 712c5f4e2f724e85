//! The decoded activity records: one enum over one plain struct per CUPTI record kind.

use gpuprof_cupti::ids;

/// One decoded activity record. Addresses of C strings are kept as `u64` (0 = none).
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Kernel(Kernel),
    Memcpy(Memcpy),
    Memset(Memset),
    Api(Api),
    Sync(Sync),
    Overhead(Overhead),
    Marker(Marker),
    ExternalCorrelation(ExternalCorrelation),
    Device(Device),
    Context(Context),
    Stream(Stream),
    Graph(Graph),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kernel {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub name: u64,
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub registers_per_thread: u16,
    pub static_shared: i32,
    pub dynamic_shared: i32,
    pub graph_node_id: u64,
    pub graph_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memcpy {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub bytes: u64,
    pub copy_kind: u8,
    pub src_kind: u8,
    pub dst_kind: u8,
    pub is_async: bool,
    /// Peer copies (MEMCPY2) only.
    pub src_device_id: u32,
    pub dst_device_id: u32,
    pub graph_node_id: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memset {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub bytes: u64,
    pub value: u32,
    pub memory_kind: u16,
    pub graph_node_id: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Api {
    /// True for `CUPTI_ACTIVITY_KIND_DRIVER`, false for `RUNTIME`.
    pub driver: bool,
    pub cbid: u32,
    pub start: u64,
    pub end: u64,
    pub process_id: u32,
    pub thread_id: u32,
    pub correlation_id: u32,
    pub return_value: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sync {
    pub sync_type: u32,
    pub start: u64,
    pub end: u64,
    pub correlation_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub event_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overhead {
    pub overhead_kind: u32,
    pub object_kind: u32,
    /// Thread id for thread objects, process id for processes, `device << 32 | context` for
    /// device/context/stream objects.
    pub object_id: u64,
    pub start: u64,
    pub end: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marker {
    pub flags: u32,
    pub timestamp: u64,
    pub id: u32,
    pub thread_id: u32,
    pub name: u64,
    pub domain: u64,
}

impl Marker {
    pub fn is_start(&self) -> bool {
        self.flags & ids::CUPTI_ACTIVITY_FLAG_MARKER_START != 0
    }
    pub fn is_end(&self) -> bool {
        self.flags & ids::CUPTI_ACTIVITY_FLAG_MARKER_END != 0
    }
    pub fn is_instant(&self) -> bool {
        self.flags & ids::CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS != 0
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExternalCorrelation {
    pub external_kind: u32,
    pub external_id: u64,
    pub correlation_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Device {
    pub id: u32,
    pub uuid: [u8; 16],
    pub name: u64,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub sm_count: u32,
    pub global_memory: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    pub context_id: u32,
    pub device_id: u32,
    pub null_stream_id: u16,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stream {
    pub context_id: u32,
    pub stream_id: u32,
    pub priority: u32,
    pub flags: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Graph {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub graph_id: u32,
}
