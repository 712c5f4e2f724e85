//! Process-wide lifecycle: one initialisation per process (uninitialised → running → exited,
//! or disabled in a forked child), the background thread, `atexit` and `pthread_atfork`.

use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::agent::{Agent, Control, Identity};
use crate::config::Config;
use crate::log::log;
use crate::sys::Wake;
use crate::tracer::{Backend, CuptiBackend, Shared, StartOutcome};

const UNINIT: u8 = 0;
const RUNNING: u8 = 1;
const EXITED: u8 = 2;
const DISABLED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);

struct Global {
    pid: u32,
    control: Arc<Control>,
    wake: Arc<Wake>,
    exit_timeout: Duration,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

/// Starts the injector once per process. Returns at once: CUPTI loading, device discovery
/// and the daemon connection all happen on the background thread, so `cuInit` is not delayed.
pub fn initialize() {
    if STATE.compare_exchange(UNINIT, RUNNING, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return;
    }
    if std::env::var_os("GPUPROF_DISABLE").is_some_and(|v| !v.is_empty() && v != "0") {
        STATE.store(DISABLED, Ordering::SeqCst);
        return;
    }
    let cfg = Config::from_env();
    let job = crate::agent::job::of_this_process();
    let Ok(wake) = Wake::new() else {
        STATE.store(DISABLED, Ordering::SeqCst);
        return;
    };
    let global = GLOBAL.get_or_init(|| Global {
        pid: std::process::id(),
        control: Arc::new(Control::default()),
        wake: Arc::new(wake),
        exit_timeout: cfg.exit_timeout,
    });
    crate::sys::on_exit_and_fork(at_exit, in_fork_child);
    early_api(&cfg);
    let control = global.control.clone();
    let wake = global.wake.clone();
    let spawned = std::thread::Builder::new().name("gpuprof-agent".into()).spawn(move || {
        let control2 = control.clone();
        let r = catch_unwind(std::panic::AssertUnwindSafe(move || background(cfg, job, wake, control)));
        if r.is_err() {
            log!(Error, "background thread panicked; gpuprof is off in this process");
            STATE.store(DISABLED, Ordering::SeqCst);
            control2.connected.store(false, Ordering::SeqCst);
        }
    });
    if spawned.is_err() {
        STATE.store(DISABLED, Ordering::SeqCst);
    }
}

/// True when runtime callback ids switched on later record: the recorded ids were switched on,
/// or the runtime hooked, during initialisation.
static EARLY_API: AtomicBool = AtomicBool::new(false);

/// Switches the recorded runtime callback ids on here, inside `cuInit` and before the CUDA
/// runtime initialises, when a session awaits this process; otherwise, when the daemon asks
/// for it, hooks the runtime's API callbacks so that a later trace can switch them on (see
/// [`gpuprof_proto::hint`]); when a PC-sampling session awaits it, keeps the cubins of the
/// modules it loads from here on. This is the one step taken on the application's thread:
/// CUPTI is loaded only in these cases.
fn early_api(cfg: &Config) {
    // A hint only counts while its daemon listens (a crashed one may have left it). Read only
    // when the environment leaves a choice to it.
    let hint = if cfg.api_at_init.is_none() || cfg.api_hook.is_none() {
        gpuprof_proto::hint::read_hint(&cfg.socket)
            .filter(|_| std::os::unix::net::UnixStream::connect(&cfg.socket).is_ok())
    } else {
        None
    };
    let me = std::cell::OnceCell::new();
    let me = || {
        me.get_or_init(|| {
            let id = Identity::of_this_process(Vec::new());
            let uid = crate::sys::getuid();
            gpuprof_proto::hint::Me { pid: id.pid, uid, exe: id.exe, cmdline: id.cmdline, cgroup: id.cgroup }
        })
    };
    if hint.as_deref().is_some_and(|text| gpuprof_proto::hint::asks_pc(text, me()))
        && let Ok(cupti) = gpuprof_cupti::loader::shared()
    {
        let r = crate::tracer::pc_capture_from_start(cupti);
        log!(Info, "a PC-sampling session awaits this process: module loads kept from initialisation ({r:?})");
    }
    let wanted =
        cfg.api_at_init.unwrap_or_else(|| hint.as_deref().is_some_and(|text| gpuprof_proto::hint::covers(text, me())));
    if wanted {
        let Ok(cupti) = gpuprof_cupti::loader::shared() else { return };
        let on = crate::cbids::RUNTIME.iter().filter(|&&id| cupti.enable_runtime_api(id, true).is_ok()).count();
        EARLY_API.store(on > 0, Ordering::SeqCst);
        log!(Info, "{on} runtime API callback ids switched on at initialisation");
        return;
    }
    if cfg.api_hook.unwrap_or_else(|| hint.as_deref().is_some_and(|text| gpuprof_proto::hint::asks_hook(text, me()))) {
        let Ok(cupti) = gpuprof_cupti::loader::shared() else { return };
        let hooked = crate::tracer::hook_runtime(cupti);
        EARLY_API.store(hooked, Ordering::SeqCst);
        log!(Info, "runtime API callbacks hooked at initialisation: {hooked}");
    }
}

fn background(cfg: Config, job: gpuprof_proto::agent::JobIdentity, wake: Arc<Wake>, control: Arc<Control>) {
    let (tx, rx) = crossbeam_channel::bounded(cfg.max_buffers + 8);
    let devices = crate::devices::query(Duration::from_secs(3));
    let ident = Identity { job: Some(job), ..Identity::of_this_process(devices) };
    let backend = LazyCupti { inner: None, failure: None, tx, wake: wake.clone(), cfg: cfg.clone() };
    Agent::new(cfg, ident, backend, rx, wake, control).run();
}

/// Loads libcupti at the first trace start, not before: an idle process gets no CUPTI
/// initialisation at all (unless the application loaded CUPTI itself, in which case that copy is
/// reused). When libcupti is missing or of an unknown version, every trace start fails with the
/// reason, and the version refused is reported from then on.
struct LazyCupti {
    inner: Option<CuptiBackend>,
    failure: Option<gpuprof_cupti::LoadFailure>,
    tx: crossbeam_channel::Sender<crate::tracer::Completed>,
    wake: Arc<Wake>,
    cfg: Config,
}

impl LazyCupti {
    fn load(&mut self) -> Result<&mut CuptiBackend, String> {
        if self.inner.is_none() {
            match gpuprof_cupti::loader::shared() {
                Ok(cupti) => {
                    log!(Info, "libcupti {} (version {})", cupti.path(), cupti.version());
                    let shared = crate::tracer::install(Arc::new(Shared {
                        pid: std::process::id(),
                        cupti: cupti.clone(),
                        pool: crate::pool::Pool::new(
                            self.cfg.buffer_bytes,
                            self.cfg.max_buffers,
                            self.cfg.zeroed_buffers,
                        ),
                        tx: self.tx.clone(),
                        wake: self.wake.clone(),
                        last_callback_ms: Default::default(),
                        cupti_dropped: Default::default(),
                        queue_dropped: Default::default(),
                        buffers_completed: Default::default(),
                        foreign_buffers: Default::default(),
                    }));
                    let tuning = crate::tracer::Tuning {
                        api_mode: self.cfg.api_mode,
                        early_runtime: EARLY_API.load(Ordering::SeqCst),
                        prefill_buffers: self.cfg.prefill_buffers,
                        pinned: self.cfg.cupti_pinned,
                        device_buffer: self.cfg.cupti_device_buffer,
                        detach: self.cfg.detach,
                    };
                    self.inner = Some(CuptiBackend::new(shared, tuning));
                }
                Err(f) => {
                    log!(Warn, "CUPTI unusable: {}", f.message);
                    self.failure = Some(f.clone());
                    return Err(f.message.clone());
                }
            }
        }
        Ok(self.inner.as_mut().expect("loaded above"))
    }
}

impl Backend for LazyCupti {
    fn cupti_version(&self) -> u32 {
        match (&self.inner, &self.failure) {
            (Some(b), _) => b.cupti_version(),
            (None, Some(f)) => f.version,
            (None, None) => 0,
        }
    }
    fn start(&mut self, cfg: &gpuprof_proto::agent::TraceConfig) -> StartOutcome {
        match self.load() {
            Ok(b) => b.start(cfg),
            Err(why) => StartOutcome::Failed(why),
        }
    }
    fn stop(&mut self) {
        if let Some(b) = &mut self.inner {
            b.stop();
        }
    }
    fn detach(&mut self) -> String {
        self.inner.as_mut().map_or_else(String::new, |b| b.detach())
    }
    fn poll_detach(&mut self) -> Option<String> {
        self.inner.as_mut().and_then(|b| b.poll_detach())
    }
    fn detach_pending(&self) -> bool {
        self.inner.as_ref().is_some_and(|b| b.detach_pending())
    }
    fn tick(&mut self) -> Option<String> {
        self.inner.as_mut().and_then(|b| b.tick())
    }
    fn external_drops(&self) -> ([u64; gpuprof_proto::kinds::SLOTS], u64) {
        self.inner.as_ref().map_or(([0; gpuprof_proto::kinds::SLOTS], 0), |b| b.external_drops())
    }
    fn reapply_api(&mut self) -> bool {
        self.inner.as_mut().is_some_and(|b| b.reapply_api())
    }
}

impl crate::tracer::PcBackend for LazyCupti {
    fn pc_start(&mut self, req: crate::tracer::PcRequest) -> Result<(), String> {
        self.load()?.pc_start(req)
    }
    fn pc_stop(&mut self, device: u32, reason: &str) {
        if let Some(b) = &mut self.inner {
            b.pc_stop(device, reason);
        }
    }
    fn pc_collect(&mut self) -> crate::tracer::PcOutput {
        self.inner.as_mut().map(|b| b.pc_collect()).unwrap_or_default()
    }
    fn pc_finish(&mut self) -> crate::tracer::PcOutput {
        self.inner.as_mut().map(|b| b.pc_finish()).unwrap_or_default()
    }
    fn pc_exit(&mut self) -> crate::tracer::PcOutput {
        self.inner.as_mut().map(|b| b.pc_exit()).unwrap_or_default()
    }
    fn pc_cubin_answer(&mut self, answer: crate::tracer::CubinAnswer) {
        if let Some(b) = &mut self.inner {
            b.pc_cubin_answer(answer);
        }
    }
    fn pc_devices(&self) -> Vec<u32> {
        self.inner.as_ref().map(|b| b.pc_devices()).unwrap_or_default()
    }
    fn device_activity(&mut self, devices: &[u32]) -> Vec<(u32, bool, u64, u64)> {
        self.inner.as_mut().map(|b| b.device_activity(devices)).unwrap_or_default()
    }
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| {
        let Some(g) = GLOBAL.get() else { return };
        if g.pid != std::process::id() {
            return;
        }
        if STATE.compare_exchange(RUNNING, EXITED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            return;
        }
        // A CUDA call made while the process tears down must not finalize CUPTI.
        crate::tracer::detach::disarm();
        // PC sampling is read and disabled here, on an application thread, while its contexts
        // are still there (one destroyed earlier was closed by its destroy callback).
        // Every context PC sampling still has is alive until this call returns.
        crate::tracer::pc_stop_at_exit(&crate::tracer::vouch_at_exit);
        // Flush on this thread, as a plain CUPTI client would in its exit handler: the buffers
        // come back through buffer_completed into the queue. No activity kind is disabled here:
        // with a static CUDA runtime its own exit handler may already have torn CUDA down.
        if crate::tracer::TRACING.load(Ordering::SeqCst)
            && let Ok(cupti) = gpuprof_cupti::loader::shared()
        {
            let _ = cupti.flush_all(true);
        }
        let ok = g.control.request_exit(&g.wake, g.exit_timeout);
        log!(Debug, "exit flush {}", if ok { "done" } else { "timed out" });
    });
}

/// Runs in the child right after fork: only async-signal-safe work. The child has no
/// background thread; it never traces and leaves the parent's connection alone.
extern "C" fn in_fork_child() {
    STATE.store(DISABLED, Ordering::SeqCst);
    crate::tracer::detach::disarm();
    let fd = crate::socket_fd::take();
    if fd >= 0 {
        // The child's copy of the parent's socket: closing it affects only the child.
        crate::sys::close_fd(fd);
    }
}

/// The lifecycle state, for tests and logs.
pub fn state_name() -> &'static str {
    match STATE.load(Ordering::SeqCst) {
        UNINIT => "uninitialized",
        RUNNING => "running",
        EXITED => "exited",
        _ => "disabled",
    }
}
