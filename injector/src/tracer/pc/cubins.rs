//! Cubins captured at module load (and when CUPTI asks for a module's CRC), kept once per CRC
//! within `GPUPROF_PC_CUBIN_MAX_MIB` (default 512) while a PC-sampling lease is held, for
//! resolving PCs to source lines.
// Safety: the CRC callback receives raw pointers from CUPTI; each use is commented.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use gpuprof_cupti::Cupti;

struct Cubins {
    map: Mutex<HashMap<u64, Arc<Vec<u8>>>>,
    bytes: AtomicUsize,
    max_bytes: usize,
    cupti: Arc<Cupti>,
}

static CUBINS: OnceLock<Cubins> = OnceLock::new();
/// Cubins are kept only while a lease is held.
static CAPTURE: AtomicBool = AtomicBool::new(false);
/// Modules seen (logs).
static SEEN: AtomicU64 = AtomicU64::new(0);
/// Cubins left out for the budget (logs).
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// Sets the store up (once) and starts or stops keeping cubins.
pub fn capture_on(cupti: &Arc<Cupti>, on: bool) {
    let _ = CUBINS.get_or_init(|| Cubins {
        map: Mutex::new(HashMap::new()),
        bytes: AtomicUsize::new(0),
        max_bytes: budget(),
        cupti: cupti.clone(),
    });
    CAPTURE.store(on, Ordering::Relaxed);
}

/// Whether cubins are being kept (a lease is held).
pub fn capturing() -> bool {
    CAPTURE.load(Ordering::Relaxed)
}

fn budget() -> usize {
    let mib = std::env::var("GPUPROF_PC_CUBIN_MAX_MIB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(512);
    mib << 20
}

/// Keeps a copy of a module's cubin (once per CRC, within the budget); its CRC.
pub fn capture(bytes: &[u8]) -> Option<u64> {
    let c = CUBINS.get()?;
    SEEN.fetch_add(1, Ordering::Relaxed);
    let crc = c.cupti.cubin_crc(bytes).ok()?;
    if !CAPTURE.load(Ordering::Relaxed) {
        return Some(crc);
    }
    let mut map = c.map.lock().unwrap_or_else(|p| p.into_inner());
    if map.contains_key(&crc) {
        return Some(crc);
    }
    if c.bytes.load(Ordering::Relaxed) + bytes.len() > c.max_bytes {
        SKIPPED.fetch_add(1, Ordering::Relaxed);
        return Some(crc);
    }
    c.bytes.fetch_add(bytes.len(), Ordering::Relaxed);
    map.insert(crc, Arc::new(bytes.to_vec()));
    Some(crc)
}

/// The cubin with CUPTI CRC `crc`, if kept.
pub fn get(crc: u64) -> Option<Arc<Vec<u8>>> {
    CUBINS.get()?.map.lock().ok()?.get(&crc).cloned()
}

/// (modules seen, cubins kept, cubins left out for the budget).
pub fn stats() -> (u64, usize, u64) {
    let kept = CUBINS.get().map_or(0, |c| c.map.lock().map_or(0, |m| m.len()));
    (SEEN.load(Ordering::Relaxed), kept, SKIPPED.load(Ordering::Relaxed))
}

/// CUPTI asks for a module's CRC: it is CUPTI's own CRC, and the cubin is kept on the way.
pub extern "C" fn on_crc(cubin: *const c_void, size: usize, crc: *mut u64) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if cubin.is_null() || size == 0 || crc.is_null() {
            return;
        }
        // Safety: CUPTI passes `size` bytes of cubin, valid during this call.
        let bytes = unsafe { std::slice::from_raw_parts(cubin as *const u8, size) };
        if let Some(v) = capture(bytes) {
            // Safety: CUPTI's out pointer for the CRC.
            unsafe { *crc = v };
        }
    }));
}
