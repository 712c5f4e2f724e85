//! gpuprof's wire protocols.
//!
//! - [`agent`]: `gpuprof.agent.v1`, what the injector and the samplers exchange with
//!   `gpuprofd` over the agent socket, plus the length-prefixed [`frame`] codec, and the
//!   new-process [`hint`] file the daemon keeps next to that socket, and the record
//!   [`kinds`] it carries.
//! - [`api`]: `gpuprof.v1`, the public gRPC API (feature `api`).
//! - [`perfetto`]: the part of Perfetto's trace format that gpuprofd's exports write.
//! - [`pprof`]: the pprof `Profile` that gpuprofd's PC-sampling export writes.
#![forbid(unsafe_code)]

pub mod frame;
pub mod glob;
pub mod hint;
pub mod kinds;

/// The agent protocol, `gpuprof.agent.v1`.
pub mod agent {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/gpuprof.agent.v1.rs"));

    /// The protocol version this build speaks.
    pub const PROTOCOL_VERSION: u32 = ProtocolVersion::Current as u32;
}

/// The messages of Perfetto's trace format that a `.pftrace` export holds (`perfetto.protos`,
/// a subset with Perfetto's field numbers).
pub mod perfetto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

/// The pprof profile format (`perftools.profiles`, google/pprof's field numbers), written by
/// the `pprof` export of a session's PC samples.
pub mod pprof {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// The public gRPC API, `gpuprof.v1`.
#[cfg(feature = "api")]
pub mod api {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/gpuprof.v1.rs"));

    /// The encoded `FileDescriptorSet` of `gpuprof.v1`, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("gpuprof_v1_descriptor");
}
