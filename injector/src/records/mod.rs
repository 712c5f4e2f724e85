//! Decoding CUPTI 13.0 activity records from raw bytes.
//!
//! Pure, safe code over `&[u8]`: every field is read at the offset the generated bindings give
//! (`offset_of!` on the layouts `gpuprof_cupti::ids` re-exports from `cupti/src/sys/cupti.rs`),
//! little-endian, bounds-checked. Strings (kernel names, NVTX messages) stay raw addresses here;
//! [`crate::convert`] resolves them. The tests lay out buffers byte by byte at offsets copied
//! from `cupti_activity.h`, which checks the bindings too.
//!
//! Layout: `types` holds the decoded structs ([`Record`] and one struct per kind); `decode` reads
//! bytes into them ([`decode()`], [`record_size`], [`peek_kind`], [`DecodeError`]); `tests` has the
//! layout test and the byte builders other modules' tests use.

mod decode;
#[cfg(test)]
pub(crate) mod tests;
mod types;

pub use decode::{DecodeError, decode, peek_kind, record_size};
pub use types::{
    Api, Context, Device, ExternalCorrelation, Graph, Kernel, Marker, Memcpy, Memset, Overhead, Record, Stream, Sync,
};
