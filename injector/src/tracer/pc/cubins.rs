//! Cubins captured at module load (and when CUPTI asks for a module's CRC), kept once per CRC
//! within `GPUPROF_PC_CUBIN_MAX_MIB` (default 512) while a PC-sampling lease is held (or, when a
//! PC-sampling session awaits the process, from `cuInit` on), for resolving PCs to source lines.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::tracer::hooks;
use std::sync::{Arc, Mutex, OnceLock};

use gpuprof_cupti::Cupti;

struct Cubins {
    map: Mutex<HashMap<u64, Arc<Vec<u8>>>>,
    bytes: AtomicUsize,
    max_bytes: usize,
    cupti: Arc<Cupti>,
}

static CUBINS: OnceLock<Cubins> = OnceLock::new();
/// Cubins are kept only while a lease is held or awaited.
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

/// Keeps a copy of a module's cubin (once per CRC, within the budget); its CRC. On an
/// application thread in a CUPTI callback: left out while another thread finalizes CUPTI.
pub fn capture(bytes: &[u8]) -> Option<u64> {
    let c = CUBINS.get()?;
    SEEN.fetch_add(1, Ordering::Relaxed);
    let crc = {
        let _call = crate::tracer::hooks::app_cupti()?;
        c.cupti.cubin_crc(bytes).ok()?
    };
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
pub fn on_crc(cubin: &[u8]) -> Option<u64> {
    capture(cubin)
}

/// Cubins of the ELF files the process has mapped, for modules loaded before PC sampling
/// began (a late attach), found on a thread of their own ("gpuprof-cubins": reading and
/// decompressing a large library's fatbin takes seconds, which the agent's thread must not
/// wait for). Each file's fatbin is read for the device's SM ([`crate::fatbin`]); a cubin's
/// CRC is computed only when it names a wanted function, and the cubins of the wanted CRCs are
/// kept. A module that lives only in memory (JIT-compiled from PTX, `cuModuleLoadData`)
/// loaded before sampling is in no file and stays without lines.
struct Late {
    tx: std::sync::mpsc::Sender<(Vec<(u64, String)>, u32)>,
}

static LATE: Mutex<Option<Late>> = Mutex::new(None);

fn late() -> std::sync::MutexGuard<'static, Option<Late>> {
    LATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// CRCs looked for and found nowhere (here, or by an earlier process as gpuprofd says), and
/// those found nowhere here not yet reported to gpuprofd.
#[derive(Default)]
struct Missing {
    all: std::collections::HashSet<u64>,
    unreported: Vec<u64>,
}

static MISSING: Mutex<Option<Missing>> = Mutex::new(None);

fn missing<R>(f: impl FnOnce(&mut Missing) -> R) -> R {
    f(MISSING.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Missing::default))
}

/// A module gpuprofd says an earlier process found in none of its mapped files.
pub fn note_missing(crc: u64) {
    missing(|m| m.all.insert(crc));
}

/// The modules found in no mapped file here since the last call, for gpuprofd.
pub fn take_not_found() -> Vec<u64> {
    missing(|m| std::mem::take(&mut m.unreported))
}

/// Keeps a cubin gpuprofd sent for module `crc` (found by an earlier process) once CUPTI's
/// CRC of it is `crc`. On gpuprof's thread, under the background guard.
pub fn adopt(crc: u64, bytes: Vec<u8>) -> bool {
    let Some(c) = CUBINS.get() else { return false };
    if get(crc).is_some() {
        return true;
    }
    if c.cupti.cubin_crc(&bytes).ok() != Some(crc) {
        return false;
    }
    c.keep(crc, bytes);
    true
}

impl Cubins {
    /// Keeps a cubin found for a module loaded before sampling (outside the capture budget).
    fn keep(&self, crc: u64, bytes: Vec<u8>) {
        self.bytes.fetch_add(bytes.len(), Ordering::Relaxed);
        self.map.lock().unwrap_or_else(|p| p.into_inner()).insert(crc, Arc::new(bytes));
    }
}

/// A PC-sampling session awaits this process (the new-process hint, read inside `cuInit`):
/// cubins are kept from here on, through the subscriber's module-load callback, so that modules
/// loaded before the lease comes (JIT-compiled from PTX, or from memory, at the first launch)
/// have source lines. CUPTI calls only; the driver API is not usable yet.
/// Ends at the trace's stop when no device is sampled then ([`release_from_start`]), and at the
/// first lease's end.
pub fn capture_from_start(cupti: &Arc<Cupti>) -> Result<(), gpuprof_cupti::CuptiError> {
    hooks::acquire(cupti, hooks::User::Pc)?;
    capture_on(cupti, true);
    FROM_START.store(true, Ordering::SeqCst);
    Ok(())
}

/// The subscriber and cubin capture were taken at `cuInit` ([`capture_from_start`]) and no
/// lease has ended them yet.
static FROM_START: AtomicBool = AtomicBool::new(false);

/// A trace stops: what [`capture_from_start`] took is given back unless PC sampling is `busy`
/// (a device sampled or an operation waiting: then the lease's end gives it back).
pub fn release_from_start(cupti: &Arc<Cupti>, busy: bool) {
    if !FROM_START.load(Ordering::SeqCst) || busy {
        return;
    }
    FROM_START.store(false, Ordering::SeqCst);
    capture_on(cupti, false);
    if hooks::held_by(hooks::User::Pc) {
        hooks::release(cupti, hooks::User::Pc);
    }
}

/// The first lease's end gives back what [`capture_from_start`] took.
pub fn forget_from_start() {
    FROM_START.store(false, Ordering::SeqCst);
}

/// Looks asked of the look-up thread and not done yet.
static LOOKING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether the look-up thread is looking for cubins (it calls CUPTI for their CRCs).
pub fn looking() -> bool {
    LOOKING.load(Ordering::SeqCst) > 0
}

/// Asks for the cubins of `wanted` (CRC, function name) in the mapped files, for SM `sm`
/// (e.g. 90). They are kept when found.
pub fn request_late(wanted: Vec<(u64, String)>, sm: u32) {
    if wanted.is_empty() || CUBINS.get().is_none() {
        return;
    }
    let mut g = late();
    if g.is_none() {
        let (tx, rx) = std::sync::mpsc::channel::<(Vec<(u64, String)>, u32)>();
        let spawned = std::thread::Builder::new().name("gpuprof-cubins".into()).spawn(move || {
            super::meter::mark_own_thread();
            // Seconds of CPU in a PyTorch process (6-9 s on the H200 machines): never taken from
            // the application's threads.
            if let Err(e) = crate::sys::idle_priority() {
                crate::log::log!(Debug, "PC sampling: the cubin look-up thread keeps its priority: {e}");
            }
            while let Ok((wanted, sm)) = rx.recv() {
                let _ = catch_unwind(AssertUnwindSafe(|| find_mapped(&wanted, sm)));
                LOOKING.fetch_sub(1, Ordering::SeqCst);
                missing(|m| {
                    for (crc, _) in &wanted {
                        if get(*crc).is_none() && m.all.insert(*crc) {
                            m.unreported.push(*crc);
                        }
                    }
                });
            }
        });
        if spawned.is_err() {
            return;
        }
        *g = Some(Late { tx });
    }
    if let Some(l) = g.as_mut() {
        LOOKING.fetch_add(1, Ordering::SeqCst);
        if l.tx.send((wanted, sm)).is_err() {
            LOOKING.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Modules sampled whose cubin was found neither at load nor in a mapped file.
pub fn unresolved() -> usize {
    missing(|m| m.all.iter().filter(|c| get(**c).is_none()).count())
}

/// Reads the fatbins of the mapped files for the cubins of `wanted`; keeps those found.
fn find_mapped(wanted: &[(u64, String)], sm: u32) {
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        find_in_files(&maps, wanted, sm);
    }
}

/// [`find_mapped`] in the files of `maps` (the text of a `/proc/PID/maps`).
fn find_in_files(maps: &str, wanted: &[(u64, String)], sm: u32) {
    let Some(c) = CUBINS.get() else { return };
    let t = std::time::Instant::now();
    let mut left: HashMap<u64, &str> = wanted.iter().map(|(crc, f)| (*crc, f.as_str())).collect();
    let (mut files, mut cubins, mut crcs) = (0, 0, 0);
    for path in crate::fatbin::mapped_elf_files(maps) {
        if left.is_empty() {
            break;
        }
        let r = crate::fatbin::visit_file_cubins(&path, sm, |cubin| {
            cubins += 1;
            // A cubin defines the function whose name it holds (its symbol table).
            if !left.values().any(|f| !f.is_empty() && contains(cubin, f.as_bytes())) {
                return;
            }
            crcs += 1;
            // A CUPTI call from gpuprof's thread: never while an application thread finalizes.
            let crc = {
                let _cupti = crate::tracer::hooks::background();
                c.cupti.cubin_crc(cubin)
            };
            if let Ok(crc) = crc
                && left.remove(&crc).is_some()
            {
                c.keep(crc, cubin.to_vec());
            }
        });
        match r {
            Ok(st) if st.blobs > 0 => files += 1,
            Ok(_) => {}
            Err(e) => crate::log::log!(Debug, "PC sampling: reading the fatbin of {}: {e}", path.display()),
        }
    }
    crate::log::log!(
        Info,
        "PC sampling: {} of {} modules loaded before sampling found in mapped files ({files} fatbins, {cubins} sm_{sm} \
         cubins, {crcs} CRCs) in {:.0} ms",
        wanted.len() - left.len(),
        wanted.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
}

/// Whether `needle` occurs in `hay` (SIMD substring search: the look reads every cubin of the
/// mapped libraries, hundreds of MB in PyTorch's).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A late attach's lines without a GPU, on a real libcupti: the cubin of a module loaded
    /// before sampling is found in a mapped library's zstd-compressed fatbin by CUPTI's CRC and
    /// kept; a cubin received with a CRC it does not have is refused. The fixtures are made by
    /// CUDA 13.0's ptxas and fatbinary (`cupti/tests/data/make.sh`).
    #[test]
    #[ignore = "needs a libcupti.so.13 (no GPU needed): GPUPROF_CUPTI_LIBRARY=/path/libcupti.so.13 cargo test -p gpuprof-inject -- --ignored"]
    fn a_late_module_s_cubin_is_found_in_a_mapped_library_by_cupti_s_crc() {
        let lib = gpuprof_cupti::loader::env_library().expect("set GPUPROF_CUPTI_LIBRARY to a libcupti.so.13");
        let cupti = Arc::new(Cupti::load_path(&lib, gpuprof_cupti::Purpose::Tracing).expect("load"));
        capture_on(&cupti, false);
        let fixture = crate::fatbin::tests::real_fixture;
        let cubin = std::fs::read(fixture("gather_sm90.cubin")).unwrap();
        let crc = cupti.cubin_crc(&cubin).unwrap();
        let so = fixture("libgather.so").canonicalize().unwrap();
        let maps = format!(
            "7f0000000000-7f0000001000 r--p 00000000 08:01 42 /usr/lib/missing.so\n\
             7f0000001000-7f0000002000 r-xp 00001000 08:01 43 {}\n\
             7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n",
            so.display()
        );
        assert!(get(crc).is_none());
        find_in_files(&maps, &[(crc ^ 1, "gather".into())], 90);
        assert!(get(crc).is_none(), "a CRC asked for is the one kept, not another of the same function");
        find_in_files(&maps, &[(crc, "no_such_kernel".into())], 90);
        assert!(get(crc).is_none(), "only cubins naming the wanted function are looked at");
        find_in_files(&maps, &[(crc, "gather".into())], 90);
        assert_eq!(get(crc).as_deref(), Some(&cubin), "found in the library's fatbin and kept");
        assert!(get(crc + 1).is_none());

        let mut tampered = cubin.clone();
        let mid = tampered.len() / 2;
        tampered[mid] ^= 0xff;
        assert!(!adopt(crc + 1, tampered.clone()), "a received cubin whose CRC is not the one asked is refused");
        assert!(!adopt(crc + 1, cubin.clone()), "nor one that is another module's");
        assert!(get(crc + 1).is_none());
        let line = cupti.sass_to_source(&get(crc).unwrap(), c"gather", 0x10).unwrap();
        assert!(line.as_ref().is_some_and(|(f, _)| f == "/src/gather.cu"), "the kept cubin gives lines: {line:?}");
    }

    #[test]
    fn finds_a_function_name_in_a_cubin() {
        let cubin = b"\x7fELF....._Z6gatherPKiPfi\0.text._Z6gatherPKiPfi";
        assert!(contains(cubin, b"_Z6gatherPKiPfi"));
        assert!(!contains(cubin, b"_Z9fma_chainPfi"));
        assert!(!contains(b"short", b"a longer needle"));
    }
}
