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

/// Cubins of the ELF files the process has mapped, for modules loaded before PC sampling
/// began (a late attach): each file's fatbin is read once for the device's SM
/// ([`crate::fatbin`]), each cubin's CRC computed and noted with where it is; the cubins the
/// samples name are kept. A module that lives only in memory (JIT, `cuModuleLoadData`) loaded
/// before sampling is not in any file and stays without lines.
struct Mapped {
    /// Files read (path, size, mtime).
    read: std::collections::HashSet<(std::path::PathBuf, u64, i64)>,
    /// CRC → (file, index of the cubin among the file's cubins of `sm`, sm).
    index: HashMap<u64, (std::path::PathBuf, usize, u32)>,
    /// CRCs looked for and found nowhere.
    missing: std::collections::HashSet<u64>,
}

static MAPPED: Mutex<Option<Mapped>> = Mutex::new(None);

/// Finds the cubins of `wanted` CRCs (not kept yet) in the files the process has mapped, for
/// SM `sm` (e.g. 90), and keeps those found. Returns how many were found now.
pub fn find_mapped(wanted: &[u64], sm: u32) -> usize {
    let Some(c) = CUBINS.get() else { return 0 };
    let mut g = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    let m = g.get_or_insert_with(|| Mapped {
        read: Default::default(),
        index: HashMap::new(),
        missing: Default::default(),
    });
    let todo: Vec<u64> = wanted.iter().copied().filter(|crc| get(*crc).is_none()).collect();
    if todo.is_empty() {
        return 0;
    }
    // New files first (a library loaded since the last look).
    if todo.iter().any(|crc| !m.index.contains_key(crc))
        && let Ok(maps) = std::fs::read_to_string("/proc/self/maps")
    {
        let t = std::time::Instant::now();
        for path in crate::fatbin::mapped_elf_files(&maps) {
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            let key = (path.clone(), meta.len(), std::os::unix::fs::MetadataExt::mtime(&meta));
            if !m.read.insert(key) {
                continue;
            }
            let mut i = 0;
            let r = crate::fatbin::visit_file_cubins(&path, sm, |cubin| {
                if let Ok(crc) = c.cupti.cubin_crc(cubin) {
                    m.index.entry(crc).or_insert((path.clone(), i, sm));
                }
                i += 1;
            });
            if let Err(e) = r {
                crate::log::log!(Debug, "PC sampling: reading the fatbin of {}: {e}", path.display());
            }
        }
        crate::log::log!(
            Info,
            "PC sampling: mapped files read for sm_{sm} cubins in {:.0} ms ({} cubins indexed)",
            t.elapsed().as_secs_f64() * 1e3,
            m.index.len()
        );
    }
    // The cubins wanted, grouped by file: each file is read once more.
    let mut by_file: HashMap<(std::path::PathBuf, u32), HashMap<usize, u64>> = HashMap::new();
    for crc in todo {
        match m.index.get(&crc) {
            Some((path, at, sm)) => {
                by_file.entry((path.clone(), *sm)).or_default().insert(*at, crc);
            }
            None => {
                m.missing.insert(crc);
            }
        }
    }
    let mut found = 0;
    for ((path, sm), want) in by_file {
        let mut i = 0;
        let _ = crate::fatbin::visit_file_cubins(&path, sm, |cubin| {
            if let Some(crc) = want.get(&i)
                && c.cupti.cubin_crc(cubin).ok() == Some(*crc)
            {
                c.bytes.fetch_add(cubin.len(), Ordering::Relaxed);
                c.map.lock().unwrap_or_else(|p| p.into_inner()).insert(*crc, Arc::new(cubin.to_vec()));
                found += 1;
            }
            i += 1;
        });
    }
    found
}

/// Modules sampled whose cubin was found neither at load nor in a mapped file.
pub fn unresolved() -> usize {
    MAPPED
        .lock()
        .ok()
        .and_then(|g| g.as_ref().map(|m| m.missing.iter().filter(|c| get(**c).is_none()).count()))
        .unwrap_or(0)
}
