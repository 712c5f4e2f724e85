//! The CUPTI buffer callbacks, which run on CUPTI's and the application's threads and only hand
//! buffers over, and the state they reach through a static.
// Safety: the `extern "C"` callbacks receive raw pointers from CUPTI; each use is commented.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crossbeam_channel::{Sender, TrySendError};

use super::backend::{Completed, RecordSource};
use crate::convert::kind_of_activity;
use crate::pool::{Buf, Pool};
use crate::records;
use crate::sys::Wake;
use gpuprof_cupti::ids;
use gpuprof_cupti::{Context, Cupti};

/// Milliseconds on a monotonic clock, for "last callback" bookkeeping.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// State the CUPTI callbacks reach through a static.
pub struct Shared {
    pub pid: u32,
    pub cupti: Arc<Cupti>,
    pub pool: Pool,
    pub tx: Sender<Completed>,
    pub wake: Arc<Wake>,
    /// `now_ms()` of the last buffer request or completion.
    pub last_callback_ms: AtomicU64,
    /// Records CUPTI reported dropped (cuptiActivityGetNumDroppedRecords), summed.
    pub cupti_dropped: AtomicU64,
    /// Records dropped because the queue to the background thread was full, per RecordKind.
    pub queue_dropped: [AtomicU64; gpuprof_proto::kinds::SLOTS],
    /// Buffers whose records were handed over, and those CUPTI returned that were not ours.
    pub buffers_completed: AtomicU64,
    pub foreign_buffers: AtomicU64,
}

static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();

/// True while CUPTI activity kinds are enabled by this library (read by the exit handler).
pub static TRACING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs the callbacks' state (once per process).
pub fn install(shared: Arc<Shared>) -> Arc<Shared> {
    SHARED.get_or_init(|| shared).clone()
}

fn shared() -> Option<&'static Arc<Shared>> {
    let s = SHARED.get()?;
    // A forked child inherits the parent's CUPTI state but not its background thread.
    (s.pid == std::process::id()).then_some(s)
}

/// CUPTI asks for an empty buffer (on an application or CUPTI thread).
pub(super) extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let got = catch_unwind(|| {
        let s = shared()?;
        s.last_callback_ms.store(now_ms(), Ordering::Relaxed);
        // CUPTI owns the buffer until buffer_completed hands it back.
        s.pool.take().map(|b| (b.into_raw(), s.pool.buffer_size()))
    })
    .ok()
    .flatten();
    let (p, n) = got.unwrap_or((std::ptr::null_mut(), 0));
    // Safety: CUPTI passes valid out pointers.
    unsafe {
        *buffer = p;
        *size = n;
        *max_records = 0;
    }
}

/// CUPTI returns a buffer of records (on CUPTI's thread or the thread that flushed).
/// Only hands it over: no decoding, no I/O here.
pub(super) extern "C" fn buffer_completed(
    ctx: ids::CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(s) = shared() else { return };
        s.last_callback_ms.store(now_ms(), Ordering::Relaxed);
        // Safety: `ctx` is the context CUPTI passed to this callback.
        let ctx = unsafe { Context::from_raw(ctx) };
        let dropped = s.cupti.dropped_records(ctx, stream_id) as u64;
        if dropped > 0 {
            s.cupti_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        let Some(buf) = s.pool.claim(buffer) else {
            s.foreign_buffers.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if valid == 0 {
            s.pool.put(buf);
            return;
        }
        let item: Completed = Box::new(CuptiBuffer { buf: Some(buf), valid, shared: s.clone() });
        match s.tx.try_send(item) {
            Ok(()) => {
                s.buffers_completed.fetch_add(1, Ordering::Relaxed);
                s.wake.wake();
            }
            Err(TrySendError::Full(item) | TrySendError::Disconnected(item)) => {
                item.for_each(&mut |rec| {
                    if let Some(k) = records::peek_kind(rec) {
                        s.queue_dropped[kind_of_activity(k) as usize].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
    }));
}

/// A completed CUPTI buffer; returns itself to the pool when dropped.
struct CuptiBuffer {
    buf: Option<Buf>,
    valid: usize,
    shared: Arc<Shared>,
}

impl RecordSource for CuptiBuffer {
    fn for_each(&self, f: &mut dyn FnMut(&[u8])) {
        let Some(buf) = &self.buf else { return };
        let base = buf.as_ptr();
        // Safety: CUPTI wrote `valid` bytes of records at the start of this buffer and gave up
        // ownership in buffer_completed; nothing else writes it until it is returned.
        let whole = unsafe { std::slice::from_raw_parts(base as *const u8, self.valid) };
        // Safety: `base`/`valid` describe a completed CUPTI buffer (above).
        unsafe {
            self.shared.cupti.for_each_record(base, self.valid, |rec| {
                let off = (rec as usize).wrapping_sub(base as usize);
                if off >= whole.len() {
                    return;
                }
                let rest = &whole[off..];
                let len =
                    records::peek_kind(rest).and_then(records::record_size).map_or(rest.len(), |n| n.min(rest.len()));
                f(&rest[..len]);
            })
        };
    }

    fn read_str(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        // Safety: `addr` is a `const char*` field of a CUPTI record (kernel, marker or device
        // name): a NUL-terminated string owned by CUPTI that outlives the records.
        Some(unsafe { CStr::from_ptr(addr as usize as *const c_char) }.to_string_lossy().into_owned())
    }
}

impl Drop for CuptiBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.shared.pool.recycle(b);
        }
    }
}

/// At process exit (for the `atexit` handler only, on the exiting thread): vouches that a
/// context PC sampling still has is alive, for the reads and disables before CUDA tears down.
pub(crate) fn vouch_at_exit(ctx: Context) -> Option<gpuprof_cupti::LiveContext<'static>> {
    // Safety: called only from the `atexit` handler before CUDA's own teardown; a context
    // destroyed earlier was closed by its destroy callback and is no longer PC sampling's.
    unsafe { gpuprof_cupti::LiveContext::assume(ctx) }
}
