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

use crate::error::{CuptiError, check};
use crate::sys::cupti as sys;

/// `cuptiGetVersion` values whose activity record layouts (`CUpti_ActivityKernel10`,
/// `CUpti_ActivityMemcpy6`, ...) match `src/sys/cupti.rs`: CUDA 13.0 GA (130000) and 13.0
/// Update 1/2 (130001). Their `cupti_activity.h` differ in comments only.
pub const KNOWN_VERSIONS: &[u32] = &[130000, 130001];

/// Environment variable naming an exact libcupti to load (the injector and the sampler).
pub const ENV_CUPTI_LIBRARY: &str = "GPUPROF_CUPTI_LIBRARY";
/// Older name of [`ENV_CUPTI_LIBRARY`], still read when that one is unset.
pub const ENV_CUPTI_LIBRARY_ALIAS: &str = "GPUPROF_CUPTI_LIB";

/// The libcupti named by the environment, if any ([`ENV_CUPTI_LIBRARY`], else the alias).
pub fn env_library() -> Option<PathBuf> {
    [ENV_CUPTI_LIBRARY, ENV_CUPTI_LIBRARY_ALIAS]
        .iter()
        .find_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map(PathBuf::from)
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
                write!(f, " set {ENV_CUPTI_LIBRARY} to its path)")
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

/// What a libcupti is loaded for: it decides which functions must resolve and whether the
/// version must be one whose activity record layouts this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Activity tracing (the injector): [`TRACING_SYMBOLS`] and a version in [`KNOWN_VERSIONS`].
    Tracing,
    /// PM sampling (the sampler): no activity records are decoded, so any version loads;
    /// [`Cupti::check_pm_sampling`] checks its functions.
    PmSampling,
}

/// Functions that must resolve for tracing to work.
const TRACING_SYMBOLS: &[&str] = &[
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
        Cupti::load(Purpose::Tracing).map(std::sync::Arc::new).map_err(|e| LoadFailure {
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
    pub(crate) raw: sys::Cupti,
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
    /// Finds and loads libcupti in the documented order and checks it for `purpose`.
    pub fn load(purpose: Purpose) -> Result<Cupti, LoadError> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let env = |k: &str| std::env::var_os(k).map(PathBuf::from);
        let candidates =
            candidates(&maps, env_library(), env("CUDA_HOME").or_else(|| env("CUDA_PATH")), python_prefixes());
        let mut tries = Vec::new();
        for c in candidates {
            match open(&c) {
                Ok(lib) => return Cupti::from_library(lib, c.path, purpose),
                Err(e) => tries.push((c.path, e)),
            }
        }
        Err(LoadError::NotFound(tries))
    }

    /// Loads exactly `path` (tests, and the sampler when its config names a library).
    pub fn load_path(path: &Path, purpose: Purpose) -> Result<Cupti, LoadError> {
        let c = Candidate { path: path.display().to_string(), no_load: false };
        let lib = open(&c).map_err(|e| LoadError::NotFound(vec![(c.path.clone(), e)]))?;
        Cupti::from_library(lib, c.path, purpose)
    }

    fn from_library(lib: libloading::Library, path: String, purpose: Purpose) -> Result<Cupti, LoadError> {
        // Safety: `from_library` resolves symbols by name; nothing is called yet. Missing
        // symbols are stored as errors and checked right below.
        let raw = unsafe { sys::Cupti::from_library(lib) }
            .map_err(|_| LoadError::MissingSymbol { path: path.clone(), symbol: "(library)" })?;
        let required: &[&'static str] = match purpose {
            Purpose::Tracing => TRACING_SYMBOLS,
            Purpose::PmSampling => &TRACING_SYMBOLS[..2],
        };
        for &symbol in required {
            if !has_symbol(&raw, symbol) {
                return Err(LoadError::MissingSymbol { path, symbol });
            }
        }
        let mut version = 0u32;
        // Safety: `version` is a valid out pointer; cuptiGetVersion only writes it.
        check(unsafe { raw.cuptiGetVersion(&mut version) }).map_err(LoadError::Version)?;
        if purpose == Purpose::Tracing && !KNOWN_VERSIONS.contains(&version) {
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

    /// `cuptiGetResultString(code)`.
    pub fn result_string(&self, code: u32) -> String {
        let mut s: *const c_char = std::ptr::null();
        // Safety: `s` is a valid out pointer; CUPTI returns a static string.
        let r = unsafe { self.raw.cuptiGetResultString(code, &mut s) };
        if r != sys::CUPTI_SUCCESS || s.is_null() {
            return CuptiError::new(code).name().to_string();
        }
        // Safety: CUPTI returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
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
    for root in ["/usr/local/cuda", "/usr/local/cuda-13.0"] {
        for sub in ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"] {
            push(format!("{root}/{sub}/{SONAME}"), false);
        }
    }
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
        let err = Cupti::load_path(Path::new("/nonexistent/libcupti.so.13"), Purpose::Tracing).err().unwrap();
        assert!(matches!(err, LoadError::NotFound(_)), "{err}");
        assert!(err.to_string().contains(ENV_CUPTI_LIBRARY));
    }

    /// Needs a real libcupti: the CUDA 13.0 wheel's copy works without a GPU (`.ci/run`
    /// downloads it and runs this test).
    #[test]
    #[ignore = "needs a libcupti.so.13 (no GPU needed): GPUPROF_CUPTI_LIBRARY=/path/libcupti.so.13 cargo test -p gpuprof-cupti -- --ignored"]
    fn loads_a_real_libcupti() {
        let p = env_library().expect("set GPUPROF_CUPTI_LIBRARY to a libcupti.so.13 to run this test");
        let c = Cupti::load_path(&p, Purpose::Tracing).expect("load");
        assert!(KNOWN_VERSIONS.contains(&c.version()));
        assert_eq!(c.result_string(39), "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
        let pm = Cupti::load_path(&p, Purpose::PmSampling).expect("load for PM sampling");
        pm.check_pm_sampling().expect("PM sampling functions");
    }

    /// What gives PC samples their source lines, without a GPU: CUPTI's CRC of a cubin (the key
    /// of gpuprof's cubins, in the injector and in gpuprofd's cache) and the line of a PC
    /// offset in a function, on a real sm_90 cubin built by `ptxas -lineinfo` from
    /// `tests/data/gather.ptx` (`ptxas -arch=sm_90 -lineinfo -O3 -o tests/data/gather_sm90.cubin
    /// tests/data/gather.ptx`; ptxas from the `nvidia-cuda-nvcc` 13.0 wheel).
    #[test]
    #[ignore = "needs a libcupti.so.13 (no GPU needed): GPUPROF_CUPTI_LIBRARY=/path/libcupti.so.13 cargo test -p gpuprof-cupti -- --ignored"]
    fn a_real_cubin_has_a_crc_and_the_lines_of_its_pcs() {
        let p = env_library().expect("set GPUPROF_CUPTI_LIBRARY to a libcupti.so.13 to run this test");
        let c = Cupti::load_path(&p, Purpose::Tracing).expect("load");
        let cubin = include_bytes!("../tests/data/gather_sm90.cubin");
        let crc = c.cubin_crc(cubin).expect("cuptiGetCubinCrc");
        assert_ne!(crc, 0);
        let copy = cubin.to_vec();
        assert_eq!(c.cubin_crc(&copy).unwrap(), crc, "the CRC is of the content, wherever it lies");
        let mut other = cubin.to_vec();
        let text = other.len() / 2;
        other[text] ^= 0xff;
        assert_ne!(c.cubin_crc(&other).ok(), Some(crc), "another content, another CRC");
        // Each SASS instruction is 16 bytes on sm_90: the lines of the function's PCs.
        let f = c"gather";
        let mut lines = std::collections::BTreeSet::new();
        for pc in (0..512).step_by(16) {
            if let Ok(Some((file, line))) = c.sass_to_source(cubin, f, pc) {
                assert_eq!(file, "/src/gather.cu", "pc {pc:#x}");
                lines.insert(line);
            }
        }
        for want in [14, 15, 16] {
            assert!(lines.contains(&want), "line {want} (the loads and the store) among the PCs' lines {lines:?}");
        }
        assert!(lines.iter().all(|l| (10..=18).contains(l)), "only the PTX's .loc lines: {lines:?}");
        let unknown = c.sass_to_source(cubin, c"no_such_function", 0);
        assert!(!matches!(unknown, Ok(Some(_))), "no line for a function the cubin lacks: {unknown:?}");
    }
}
