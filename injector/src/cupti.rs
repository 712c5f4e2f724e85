//! Finding, loading and calling libcupti at run time.
//!
//! The library is never linked: the driver silently skips an injection library with an undefined
//! CUDA symbol. Search order: a copy already mapped in the process (so PyTorch's pip copy is
//! shared, never doubled), `GPUPROF_CUPTI_LIB`, `CUDA_HOME`/`CUDA_PATH`, a pip `nvidia/cu13/lib`
//! next to a CUDA library already mapped or in the Python environment, then the dynamic linker's
//! own search (ldconfig cache, `LD_LIBRARY_PATH`) and `/usr/local/cuda`.
//!
//! Record layouts are known for the CUPTI versions in [`KNOWN_VERSIONS`] only; any other
//! version is refused with [`LoadError::UnknownVersion`] and reported to the daemon.
// Safety: this module is the FFI boundary to CUPTI. Each unsafe block calls a function
// resolved by `Cupti::load` with arguments whose validity is stated next to it.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::sys::cupti as sys;

/// `cuptiGetVersion` values whose activity record layouts (`CUpti_ActivityKernel10`,
/// `CUpti_ActivityMemcpy6`, ...) match `src/sys/cupti.rs`: CUDA 13.0 GA (130000) and 13.0
/// Update 1/2 (130001). Their `cupti_activity.h` differ in comments only.
pub const KNOWN_VERSIONS: &[u32] = &[130000, 130001];

/// Environment variable naming an exact libcupti to load.
pub const ENV_CUPTI_LIB: &str = "GPUPROF_CUPTI_LIB";

/// A CUPTI status code other than success.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CuptiError(pub u32);

impl CuptiError {
    /// The symbolic name of the code, as in `cupti_result.h`.
    pub fn name(self) -> &'static str {
        match self.0 {
            sys::CUPTI_ERROR_INVALID_PARAMETER => "CUPTI_ERROR_INVALID_PARAMETER",
            sys::CUPTI_ERROR_INVALID_DEVICE => "CUPTI_ERROR_INVALID_DEVICE",
            sys::CUPTI_ERROR_INVALID_CONTEXT => "CUPTI_ERROR_INVALID_CONTEXT",
            sys::CUPTI_ERROR_INVALID_OPERATION => "CUPTI_ERROR_INVALID_OPERATION",
            sys::CUPTI_ERROR_OUT_OF_MEMORY => "CUPTI_ERROR_OUT_OF_MEMORY",
            sys::CUPTI_ERROR_NOT_READY => "CUPTI_ERROR_NOT_READY",
            sys::CUPTI_ERROR_NOT_COMPATIBLE => "CUPTI_ERROR_NOT_COMPATIBLE",
            sys::CUPTI_ERROR_NOT_INITIALIZED => "CUPTI_ERROR_NOT_INITIALIZED",
            sys::CUPTI_ERROR_QUEUE_EMPTY => "CUPTI_ERROR_QUEUE_EMPTY",
            sys::CUPTI_ERROR_INVALID_KIND => "CUPTI_ERROR_INVALID_KIND",
            sys::CUPTI_ERROR_DISABLED => "CUPTI_ERROR_DISABLED",
            sys::CUPTI_ERROR_HARDWARE_BUSY => "CUPTI_ERROR_HARDWARE_BUSY",
            sys::CUPTI_ERROR_NOT_SUPPORTED => "CUPTI_ERROR_NOT_SUPPORTED",
            sys::CUPTI_ERROR_INSUFFICIENT_PRIVILEGES => "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
            sys::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
            sys::CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED => "CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED",
            sys::CUPTI_ERROR_UNKNOWN => "CUPTI_ERROR_UNKNOWN",
            _ => "CUPTI_ERROR_(other)",
        }
    }
}

impl fmt::Debug for CuptiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl fmt::Display for CuptiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for CuptiError {}

fn check(r: sys::CUptiResult) -> Result<(), CuptiError> {
    if r == sys::CUPTI_SUCCESS { Ok(()) } else { Err(CuptiError(r)) }
}

/// Why libcupti could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// No candidate could be opened; each attempt and its error.
    NotFound(Vec<(String, String)>),
    /// A library was opened but lacks a function gpuprof needs.
    MissingSymbol { path: String, symbol: &'static str },
    /// `cuptiGetVersion` failed.
    Version(CuptiError),
    /// The version's record layouts are not known to this build.
    UnknownVersion { path: String, version: u32 },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound(tries) => {
                write!(f, "libcupti not found (tried")?;
                for (p, e) in tries {
                    write!(f, " {p}: {e};")?;
                }
                write!(f, " set {ENV_CUPTI_LIB} to its path)")
            }
            LoadError::MissingSymbol { path, symbol } => write!(f, "{path} lacks {symbol}"),
            LoadError::Version(e) => write!(f, "cuptiGetVersion failed: {e}"),
            LoadError::UnknownVersion { path, version } => write!(
                f,
                "{path} is CUPTI API version {version}; this build knows the record layouts of {KNOWN_VERSIONS:?} only"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// Functions that must resolve for tracing to work (the PM-sampling and profiler-host tables
/// are optional and checked by their users).
const REQUIRED: &[&str] = &[
    "cuptiGetVersion",
    "cuptiGetResultString",
    "cuptiSubscribe",
    "cuptiUnsubscribe",
    "cuptiActivityEnable",
    "cuptiActivityDisable",
    "cuptiActivityEnableRuntimeApi",
    "cuptiActivityEnableDriverApi",
    "cuptiActivityGetNextRecord",
    "cuptiActivityGetNumDroppedRecords",
    "cuptiActivityRegisterCallbacks",
    "cuptiActivityFlushAll",
];

/// The process's libcupti, loaded once on first use (by the background thread, or by the NVTX
/// injection entry point if NVTX initialises first).
pub fn shared() -> &'static Result<std::sync::Arc<Cupti>, LoadFailure> {
    static SHARED: std::sync::OnceLock<Result<std::sync::Arc<Cupti>, LoadFailure>> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        Cupti::load().map(std::sync::Arc::new).map_err(|e| LoadFailure {
            version: match &e {
                LoadError::UnknownVersion { version, .. } => *version,
                _ => 0,
            },
            message: e.to_string(),
        })
    })
}

/// Why CUPTI is unusable in this process, as reported to the daemon.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// The refused version, when a library was found (0 otherwise).
    pub version: u32,
    pub message: String,
}

/// A loaded libcupti of a known version.
pub struct Cupti {
    raw: sys::Cupti,
    version: u32,
    path: String,
}

/// Where a libcupti candidate came from, for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Path or bare soname handed to dlopen.
    pub path: String,
    /// Open with `RTLD_NOLOAD`: reuse a copy already in the process, never load another.
    pub no_load: bool,
}

impl Cupti {
    /// Finds and loads libcupti in the documented order and checks its version.
    pub fn load() -> Result<Cupti, LoadError> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let env = |k: &str| std::env::var_os(k).map(PathBuf::from);
        let candidates =
            candidates(&maps, env(ENV_CUPTI_LIB), env("CUDA_HOME").or_else(|| env("CUDA_PATH")), python_prefixes());
        let mut tries = Vec::new();
        for c in candidates {
            match open(&c) {
                Ok(lib) => return Cupti::from_library(lib, c.path),
                Err(e) => tries.push((c.path, e)),
            }
        }
        Err(LoadError::NotFound(tries))
    }

    /// Loads exactly `path` (tests, and the sampler, which knows its library).
    pub fn load_path(path: &Path) -> Result<Cupti, LoadError> {
        let c = Candidate { path: path.display().to_string(), no_load: false };
        let lib = open(&c).map_err(|e| LoadError::NotFound(vec![(c.path.clone(), e)]))?;
        Cupti::from_library(lib, c.path)
    }

    fn from_library(lib: libloading::Library, path: String) -> Result<Cupti, LoadError> {
        // Safety: `from_library` resolves symbols by name; nothing is called yet. Missing
        // symbols are stored as errors and checked right below.
        let raw = unsafe { sys::Cupti::from_library(lib) }
            .map_err(|_| LoadError::MissingSymbol { path: path.clone(), symbol: "(library)" })?;
        for &symbol in REQUIRED {
            if !has_symbol(&raw, symbol) {
                return Err(LoadError::MissingSymbol { path, symbol });
            }
        }
        let mut version = 0u32;
        // Safety: `version` is a valid out pointer; cuptiGetVersion only writes it.
        check(unsafe { raw.cuptiGetVersion(&mut version) }).map_err(LoadError::Version)?;
        if !KNOWN_VERSIONS.contains(&version) {
            return Err(LoadError::UnknownVersion { path, version });
        }
        Ok(Cupti { raw, version, path })
    }

    /// `cuptiGetVersion()`.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The path (or soname) the library was opened by.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The raw table, for modules that build their own safe layer (PM sampling).
    pub fn raw(&self) -> &sys::Cupti {
        &self.raw
    }

    /// `cuptiActivityEnable(kind)`.
    pub fn activity_enable(&self, kind: sys::CUpti_ActivityKind) -> Result<(), CuptiError> {
        // Safety: plain value argument; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityEnable(kind) })
    }

    /// `cuptiActivityDisable(kind)`.
    pub fn activity_disable(&self, kind: sys::CUpti_ActivityKind) -> Result<(), CuptiError> {
        // Safety: plain value argument; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityDisable(kind) })
    }

    /// `cuptiActivityEnableRuntimeApi(cbid, enable)`.
    pub fn enable_runtime_api(&self, cbid: u32, enable: bool) -> Result<(), CuptiError> {
        // Safety: plain value arguments; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityEnableRuntimeApi(cbid, enable as u8) })
    }

    /// `cuptiActivityEnableDriverApi(cbid, enable)`.
    pub fn enable_driver_api(&self, cbid: u32, enable: bool) -> Result<(), CuptiError> {
        // Safety: plain value arguments; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityEnableDriverApi(cbid, enable as u8) })
    }

    /// `cuptiActivityEnableAllSyncRecords(enable)`: with `false`, CUPTI skips event/stream query
    /// records for work not completed yet (a busy-polling application makes millions).
    pub fn enable_all_sync_records(&self, enable: bool) -> Result<(), CuptiError> {
        if self.raw.cuptiActivityEnableAllSyncRecords.is_err() {
            return Err(CuptiError(sys::CUPTI_ERROR_NOT_SUPPORTED));
        }
        // Safety: plain value argument; the symbol resolved (checked above).
        check(unsafe { self.raw.cuptiActivityEnableAllSyncRecords(enable as u8) })
    }

    /// `cuptiActivitySetAttribute(attr, sizeof(T), &value)` for a `u8` or `usize` attribute.
    pub fn set_attribute<T: Copy>(&self, attr: sys::CUpti_ActivityAttribute, value: T) -> Result<(), CuptiError> {
        let Ok(f) = &self.raw.cuptiActivitySetAttribute else {
            return Err(CuptiError(sys::CUPTI_ERROR_NOT_SUPPORTED));
        };
        let mut v = value;
        let mut size = std::mem::size_of::<T>();
        // Safety: `size` and `v` are valid for the call; CUPTI reads `size` bytes of `v` (the
        // attribute's documented type, u8 or size_t, chosen by the caller).
        check(unsafe { f(attr, &mut size, (&mut v as *mut T).cast()) })
    }

    /// `cuptiActivityRegisterCallbacks(request, complete)`.
    pub fn register_callbacks(
        &self,
        request: sys::CUpti_BuffersCallbackRequestFunc,
        complete: sys::CUpti_BuffersCallbackCompleteFunc,
    ) -> Result<(), CuptiError> {
        // Safety: the callbacks are `extern "C"` functions with CUPTI's signatures that live
        // for the whole process (they are statics of this library, which is never unloaded).
        check(unsafe { self.raw.cuptiActivityRegisterCallbacks(request, complete) })
    }

    /// `cuptiActivityFlushAll(flags)`; `forced` returns buffers with incomplete records too.
    pub fn flush_all(&self, forced: bool) -> Result<(), CuptiError> {
        let flag = if forced { sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED } else { 0 };
        // Safety: plain value argument; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityFlushAll(flag) })
    }

    /// `cuptiActivityGetNumDroppedRecords(ctx, stream, &n)`: records CUPTI dropped since the
    /// last call for the buffer being completed.
    ///
    /// # Safety
    /// `ctx` must be the context pointer CUPTI passed to the completion callback (or null).
    pub unsafe fn dropped_records(&self, ctx: sys::CUcontext, stream_id: u32) -> usize {
        let mut n = 0usize;
        // Safety: `ctx`/`stream_id` are the values CUPTI handed to the completion callback;
        // `n` is a valid out pointer.
        let r = unsafe { self.raw.cuptiActivityGetNumDroppedRecords(ctx, stream_id, &mut n) };
        if r == sys::CUPTI_SUCCESS { n } else { 0 }
    }

    /// Walks the records of a completed buffer, calling `f` with each record's address.
    ///
    /// # Safety
    /// `buf` must point to `valid` initialised bytes of a buffer CUPTI has completed.
    pub unsafe fn for_each_record(&self, buf: *mut u8, valid: usize, mut f: impl FnMut(*const u8)) {
        let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
        loop {
            // Safety: per this function's contract; CUPTI reads the buffer and advances `rec`
            // within `valid` bytes.
            let r = unsafe { self.raw.cuptiActivityGetNextRecord(buf, valid, &mut rec) };
            if r != sys::CUPTI_SUCCESS || rec.is_null() {
                break;
            }
            f(rec as *const u8);
        }
    }

    /// Probes whether another CUPTI subscriber (e.g. Kineto's) exists: subscribes and
    /// immediately unsubscribes. `Err(39)` means someone else holds CUPTI.
    pub fn probe_subscriber(&self) -> Result<(), CuptiError> {
        let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
        // Safety: `probe_callback` has CUPTI's callback signature and does nothing; no domain
        // is enabled, so it is never called; `handle` is a valid out pointer.
        check(unsafe { self.raw.cuptiSubscribe(&mut handle, Some(probe_callback), std::ptr::null_mut()) })?;
        // Safety: `handle` was just returned by a successful cuptiSubscribe.
        let _ = unsafe { self.raw.cuptiUnsubscribe(handle) };
        Ok(())
    }

    /// `cuptiGetResultString(code)`.
    pub fn result_string(&self, code: u32) -> String {
        let mut s: *const c_char = std::ptr::null();
        // Safety: `s` is a valid out pointer; CUPTI returns a static string.
        let r = unsafe { self.raw.cuptiGetResultString(code, &mut s) };
        if r != sys::CUPTI_SUCCESS || s.is_null() {
            return CuptiError(code).name().to_string();
        }
        // Safety: CUPTI returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

extern "C" fn probe_callback(
    _userdata: *mut std::ffi::c_void,
    _domain: sys::CUpti_CallbackDomain,
    _cbid: sys::CUpti_CallbackId,
    _data: *const std::ffi::c_void,
) {
}

fn has_symbol(raw: &sys::Cupti, name: &str) -> bool {
    match name {
        "cuptiGetVersion" => raw.cuptiGetVersion.is_ok(),
        "cuptiGetResultString" => raw.cuptiGetResultString.is_ok(),
        "cuptiSubscribe" => raw.cuptiSubscribe.is_ok(),
        "cuptiUnsubscribe" => raw.cuptiUnsubscribe.is_ok(),
        "cuptiActivityEnable" => raw.cuptiActivityEnable.is_ok(),
        "cuptiActivityDisable" => raw.cuptiActivityDisable.is_ok(),
        "cuptiActivityEnableRuntimeApi" => raw.cuptiActivityEnableRuntimeApi.is_ok(),
        "cuptiActivityEnableDriverApi" => raw.cuptiActivityEnableDriverApi.is_ok(),
        "cuptiActivityGetNextRecord" => raw.cuptiActivityGetNextRecord.is_ok(),
        "cuptiActivityGetNumDroppedRecords" => raw.cuptiActivityGetNumDroppedRecords.is_ok(),
        "cuptiActivityRegisterCallbacks" => raw.cuptiActivityRegisterCallbacks.is_ok(),
        "cuptiActivityFlushAll" => raw.cuptiActivityFlushAll.is_ok(),
        _ => false,
    }
}

const SONAME: &str = "libcupti.so.13";

/// The ordered list of libcupti candidates (pure, for tests).
pub fn candidates(
    maps: &str,
    env_override: Option<PathBuf>,
    cuda_home: Option<PathBuf>,
    python_prefixes: Vec<PathBuf>,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut push = |path: String, no_load: bool| {
        if !out.iter().any(|c| c.path == path && c.no_load == no_load) {
            out.push(Candidate { path, no_load });
        }
    };
    // 1. Already mapped: reuse, never load a second copy.
    let mapped: Vec<&str> = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).collect();
    for p in &mapped {
        let base = p.rsplit('/').next().unwrap_or(p);
        if base.starts_with("libcupti.so") {
            push((*p).to_string(), true);
        }
    }
    push(SONAME.to_string(), true);
    push("libcupti.so".to_string(), true);
    // 2. Explicit override.
    if let Some(p) = env_override {
        push(p.display().to_string(), false);
    }
    // 3. CUDA_HOME.
    if let Some(h) = cuda_home {
        for sub in ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib"] {
            push(h.join(sub).join(SONAME).display().to_string(), false);
        }
    }
    // 4. pip nvidia/cu13/lib: next to a CUDA library PyTorch already mapped, then the Python
    // environment's site-packages.
    for p in &mapped {
        if let Some(idx) = p.find("/nvidia/cu13/lib/") {
            push(format!("{}/nvidia/cu13/lib/{SONAME}", &p[..idx]), false);
        }
    }
    for prefix in python_prefixes {
        for site in site_packages(&prefix) {
            push(site.join("nvidia/cu13/lib").join(SONAME).display().to_string(), false);
        }
    }
    // 5. The dynamic linker's search, then the default toolkit location.
    push(SONAME.to_string(), false);
    push("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13".to_string(), false);
    push("/usr/local/cuda/lib64/libcupti.so.13".to_string(), false);
    out
}

/// Python environment prefixes worth searching: `VIRTUAL_ENV`, and the prefix of the running
/// executable when it is a Python interpreter.
fn python_prefixes() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os("VIRTUAL_ENV") {
        v.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
        let is_python = exe.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python"));
        if is_python && let Some(prefix) = exe.parent().and_then(Path::parent) {
            v.push(prefix.to_path_buf());
        }
    }
    v
}

fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let lib = prefix.join("lib");
    let Ok(rd) = std::fs::read_dir(&lib) else { return Vec::new() };
    rd.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .map(|e| e.path().join("site-packages"))
        .collect()
}

fn open(c: &Candidate) -> Result<libloading::Library, String> {
    use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
    let flags = if c.no_load { RTLD_LAZY | RTLD_LOCAL | libc::RTLD_NOLOAD } else { RTLD_LAZY | RTLD_LOCAL };
    // Safety: loading libcupti runs its initialisers, which only set up CUPTI's own state.
    unsafe { Library::open(Some(&c.path), flags) }.map(Into::into).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13
7f0000002000-7f0000003000 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
";

    #[test]
    fn candidate_order_follows_the_documented_search() {
        let c = candidates(MAPS, Some("/custom/libcupti.so.13".into()), Some("/usr/local/cuda-13.0".into()), vec![]);
        let paths: Vec<_> = c.iter().map(|c| (c.path.as_str(), c.no_load)).collect();
        assert_eq!(paths[0], ("libcupti.so.13", true));
        assert_eq!(paths[1], ("libcupti.so", true));
        assert_eq!(paths[2], ("/custom/libcupti.so.13", false));
        assert_eq!(paths[3], ("/usr/local/cuda-13.0/extras/CUPTI/lib64/libcupti.so.13", false));
        let pip = "/opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcupti.so.13";
        let pip_pos = paths.iter().position(|p| p.0 == pip).expect("pip dir next to mapped cudart");
        let ld_pos = paths.iter().position(|p| *p == ("libcupti.so.13", false)).unwrap();
        assert!(pip_pos > 3 && pip_pos < ld_pos, "{paths:?}");
    }

    #[test]
    fn an_already_mapped_copy_comes_first() {
        let maps = format!("{MAPS}7f0000006000-7f0000007000 r-xp 0 08:01 3 /x/nvidia/cu13/lib/libcupti.so.13\n");
        let c = candidates(&maps, Some("/custom/libcupti.so.13".into()), None, vec![]);
        assert_eq!(c[0], Candidate { path: "/x/nvidia/cu13/lib/libcupti.so.13".into(), no_load: true });
    }

    #[test]
    fn missing_library_is_a_clean_error() {
        let err = Cupti::load_path(Path::new("/nonexistent/libcupti.so.13")).err().unwrap();
        assert!(matches!(err, LoadError::NotFound(_)), "{err}");
        assert!(err.to_string().contains(ENV_CUPTI_LIB));
    }

    /// Runs against a real libcupti when `GPUPROF_TEST_CUPTI_LIB` names one (the wheel's copy
    /// works without a GPU): loads it and checks the version is one whose layouts we know.
    #[test]
    fn loads_a_real_libcupti_when_given() {
        let Some(p) = std::env::var_os("GPUPROF_TEST_CUPTI_LIB") else { return };
        let c = Cupti::load_path(Path::new(&p)).expect("load");
        assert!(KNOWN_VERSIONS.contains(&c.version()));
        assert_eq!(c.result_string(39), "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
    }

    #[test]
    fn error_names() {
        assert_eq!(CuptiError(39).name(), "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
        assert_eq!(format!("{}", CuptiError(26)), "CUPTI_ERROR_HARDWARE_BUSY (26)");
    }
}
