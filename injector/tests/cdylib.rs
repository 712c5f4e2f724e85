//! Checks on the built `libgpuprof_inject.so` itself (CI has no GPU and no CUDA):
//! no undefined CUDA/CUPTI symbols, the injection entry points exported, and a process that
//! loads it and calls `InitializeInjection` keeps its exit code with or without a daemon.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gpuprof_proto::agent::{self as pb, agent_message::Msg as Out};
use gpuprof_proto::frame::{read_message, write_frame};

fn cdylib() -> PathBuf {
    // `cargo test` leaves the cdylib next to the test binary (deps/); `cargo build` one up.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [deps.join("libgpuprof_inject.so"), deps.parent().unwrap().join("libgpuprof_inject.so")];
    candidates.iter().find(|p| p.exists()).cloned().unwrap_or_else(|| panic!("{candidates:?} not built"))
}

fn nm(args: &[&str]) -> String {
    let out = Command::new("nm").args(args).arg(cdylib()).output().expect("nm (binutils) is installed");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn no_undefined_cuda_or_cupti_symbols() {
    let undefined = nm(&["-D", "--undefined-only"]);
    let bad: Vec<&str> = undefined
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| {
            let s = s.split('@').next().unwrap_or(s);
            s.starts_with("cu") && s.chars().nth(2).is_some_and(|c| c.is_ascii_uppercase())
                || s.starts_with("cupti")
                || s.starts_with("cuda")
                || s.starts_with("nvtx")
                || s.starts_with("Nv")
        })
        .collect();
    assert!(bad.is_empty(), "undefined CUDA/CUPTI symbols: {bad:?}");
    // Only the C library and the loader are needed.
    let needed = Command::new("readelf").args(["-d"]).arg(cdylib()).output().expect("readelf");
    let needed = String::from_utf8_lossy(&needed.stdout);
    for line in needed.lines().filter(|l| l.contains("(NEEDED)")) {
        assert!(!line.contains("cuda") && !line.contains("cupti"), "{line}");
    }
}

#[test]
fn exports_the_injection_entry_points() {
    let defined = nm(&["-D", "--defined-only"]);
    for sym in ["InitializeInjection", "InitializeInjectionNvtx2"] {
        assert!(defined.lines().any(|l| l.ends_with(&format!(" {sym}"))), "{sym} not exported:\n{defined}");
    }
}

/// Child mode: load the library like the driver does, initialise, then exit with a code.
#[test]
#[allow(unsafe_code)]
fn child_process_entry() {
    let Ok(code) = std::env::var("GPUPROF_TEST_CHILD_EXIT") else { return };
    // Safety: loading the library under test and calling its C entry point.
    unsafe {
        let lib = libloading::Library::new(cdylib()).unwrap();
        let init: libloading::Symbol<'_, unsafe extern "C" fn() -> i32> = lib.get(b"InitializeInjection\0").unwrap();
        assert_eq!(init(), 1);
        std::mem::forget(lib);
    }
    if let Ok(ms) = std::env::var("GPUPROF_TEST_CHILD_SLEEP_MS") {
        std::thread::sleep(Duration::from_millis(ms.parse().unwrap()));
    }
    if std::env::var_os("GPUPROF_TEST_CHILD_FORK").is_some() {
        // A forked child outliving the parent (a DataLoader worker, say) must not keep the
        // parent's daemon connection open.
        // Safety: fork in a test process; the child only sleeps and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            std::thread::sleep(Duration::from_secs(3));
            // Safety: leaving the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(0) };
        }
    }
    std::process::exit(code.parse().unwrap());
}

fn run_child(socket: &std::path::Path, code: i32, sleep_ms: u64) -> std::process::Child {
    run_child_with(socket, code, sleep_ms, &[])
}

fn run_child_with(socket: &std::path::Path, code: i32, sleep_ms: u64, env: &[(&str, &str)]) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .envs(env.iter().copied())
        .args(["child_process_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env("GPUPROF_TEST_CHILD_EXIT", code.to_string())
        .env("GPUPROF_TEST_CHILD_SLEEP_MS", sleep_ms.to_string())
        .env("GPUPROF_AGENT_SOCKET", socket)
        .env("GPUPROF_CUPTI_LIBRARY", "/nonexistent/libcupti.so.13")
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .unwrap()
}

#[test]
fn without_a_daemon_the_exit_code_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    for code in [0, 3, 7] {
        let t0 = Instant::now();
        let status = run_child(&dir.path().join("absent.sock"), code, 100).wait().unwrap();
        assert_eq!(status.code(), Some(code));
        assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    }
}

#[test]
fn with_a_daemon_the_process_says_hello_and_goodbye() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let mut child = run_child(&sock, 5, 400);
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("the child never connected: {e}; exit {:?}", child.try_wait()),
        }
    };
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let m: pb::AgentMessage = read_message(&mut s, 1 << 20).unwrap();
    let Some(Out::Hello(h)) = m.msg else { panic!("{m:?}") };
    assert_eq!(h.pid, child.id());
    assert_eq!(h.cupti_version, 0, "no CUPTI in CI");
    assert!(h.exe.ends_with(std::env::current_exe().unwrap().file_name().unwrap().to_str().unwrap()));
    let welcome = pb::Welcome { protocol_version: 1, process_id: 1, max_frame_bytes: 4 << 20, ..Default::default() };
    write_frame(&mut s, &pb::DaemonMessage { msg: Some(pb::daemon_message::Msg::Welcome(welcome)) }).unwrap();
    // A trace cannot start without CUPTI: the failure is reported, not fatal.
    let start = pb::StartTrace { session_id: 1, config: None };
    write_frame(&mut s, &pb::DaemonMessage { msg: Some(pb::daemon_message::Msg::StartTrace(start)) }).unwrap();
    let mut failed = None;
    let mut goodbye = false;
    while let Ok(m) = read_message::<pb::AgentMessage, _>(&mut s, 1 << 20) {
        match m.msg {
            Some(Out::TraceState(t)) if t.status == pb::TraceStatus::Failed as i32 => failed = Some(t.detail),
            Some(Out::Goodbye(_)) => goodbye = true,
            _ => {}
        }
    }
    assert_eq!(child.wait().unwrap().code(), Some(5));
    let failed = failed.expect("trace start reported as failed");
    assert!(failed.contains("libcupti"), "{failed}");
    assert!(goodbye, "goodbye at exit");
}

/// `LD_PRELOAD` alone never makes the driver call `InitializeInjection`: the constructor points
/// `CUDA_INJECTION64_PATH` at the library, and leaves an existing value alone.
#[test]
fn preloading_points_cuda_injection_at_the_library() {
    let so = std::fs::canonicalize(cdylib()).unwrap();
    let run = |inj: Option<&str>| {
        let mut c = Command::new("env");
        c.env("LD_PRELOAD", &so).env_remove("CUDA_INJECTION64_PATH");
        if let Some(v) = inj {
            c.env("CUDA_INJECTION64_PATH", v);
        }
        let out = c.output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("CUDA_INJECTION64_PATH=").map(str::to_string))
    };
    assert_eq!(run(None).as_deref(), Some(so.to_str().unwrap()));
    assert_eq!(run(Some("/opt/other/libtool.so")).as_deref(), Some("/opt/other/libtool.so"));
}

/// After fork the child closes its copy of the connection: the daemon sees the connection end
/// when the parent exits, not when a long-lived forked child does.
#[test]
fn a_forked_child_does_not_hold_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let mut child = run_child_with(&sock, 0, 300, &[("GPUPROF_TEST_CHILD_FORK", "1")]);
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let m: pb::AgentMessage = read_message(&mut s, 1 << 20).unwrap();
    assert!(matches!(m.msg, Some(Out::Hello(_))));
    let welcome = pb::Welcome { protocol_version: 1, process_id: 1, max_frame_bytes: 4 << 20, ..Default::default() };
    write_frame(&mut s, &pb::DaemonMessage { msg: Some(pb::daemon_message::Msg::Welcome(welcome)) }).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let parent_gone = Instant::now();
    while read_message::<pb::AgentMessage, _>(&mut s, 1 << 20).is_ok() {}
    let waited = parent_gone.elapsed();
    assert!(waited < Duration::from_millis(1500), "connection held {waited:?} after the parent exited");
}

/// NCCL's `ncclProfiler_v5_t` and the head of its Coll event descriptor, as NCCL's
/// `plugins/profiler` headers declare them (written here independently of the library's own).
#[repr(C)]
struct NcclProfilerV5 {
    name: *const std::ffi::c_char,
    init: extern "C" fn(
        *mut *mut std::ffi::c_void,
        u64,
        *mut i32,
        *const std::ffi::c_char,
        i32,
        i32,
        i32,
        *const std::ffi::c_void,
    ) -> i32,
    start_event: extern "C" fn(*mut std::ffi::c_void, *mut *mut std::ffi::c_void, *mut std::ffi::c_void) -> i32,
    stop_event: extern "C" fn(*mut std::ffi::c_void) -> i32,
    record_event_state: extern "C" fn(*mut std::ffi::c_void, i32, *mut std::ffi::c_void) -> i32,
    finalize: extern "C" fn(*mut std::ffi::c_void) -> i32,
}

#[repr(C)]
struct CollDescrV5 {
    ty: u64,
    parent: *mut std::ffi::c_void,
    rank: i32,
    seq: u64,
    func: *const std::ffi::c_char,
    send: *const std::ffi::c_void,
    recv: *mut std::ffi::c_void,
    count: usize,
    root: i32,
    datatype: *const std::ffi::c_char,
    n_channels: u8,
    n_warps: u8,
    algo: *const std::ffi::c_char,
    proto: *const std::ffi::c_char,
    parent_group: *mut std::ffi::c_void,
}

/// Child mode: NCCL's side of the profiler plugin interface, played against the library. Exits
/// 0 when every check held (a failed check panics: exit code 101).
#[test]
#[allow(unsafe_code)]
fn nccl_plugin_child_entry() {
    if std::env::var_os("GPUPROF_TEST_NCCL_CHILD").is_none() {
        return;
    }
    // Safety: loading the library under test, reading its exported tables and calling their
    // entry points with arguments laid out as NCCL lays them out.
    unsafe {
        let lib = libloading::Library::new(cdylib()).unwrap();
        let v5: libloading::Symbol<'_, *const NcclProfilerV5> = lib.get(b"ncclProfiler_v5\0").unwrap();
        let p = &**v5;
        assert_eq!(std::ffi::CStr::from_ptr(p.name).to_str().unwrap(), "gpuprof");
        let v4: libloading::Symbol<'_, *const NcclProfilerV5> = lib.get(b"ncclProfiler_v4\0").unwrap();
        assert_eq!(std::ffi::CStr::from_ptr((**v4).name).to_str().unwrap(), "gpuprof");
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        let mask: &'static mut i32 = Box::leak(Box::new(-1));
        // Before the injector runs (no CUDA initialized it), NCCL is told to disable the plugin.
        assert_eq!((p.init)(&mut ctx, 42, mask, c"c".as_ptr(), 1, 2, 0, std::ptr::null()), 3);
        let init: libloading::Symbol<'_, unsafe extern "C" fn() -> i32> = lib.get(b"InitializeInjection\0").unwrap();
        assert_eq!(init(), 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while (p.init)(&mut ctx, 42, mask, c"c".as_ptr(), 1, 2, 0, std::ptr::null()) != 0 {
            assert!(Instant::now() < deadline, "the plugin never initialized");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!ctx.is_null());
        assert_eq!(*mask, 0, "no trace runs: NCCL is asked for no events");
        // Events while no trace runs: no handle, no harm; unknown handles and states ignored.
        let mut d = CollDescrV5 {
            ty: 1 << 1,
            parent: std::ptr::null_mut(),
            rank: 0,
            seq: 7,
            func: c"AllReduce".as_ptr(),
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count: 1024,
            root: -1,
            datatype: c"ncclFloat32".as_ptr(),
            n_channels: 2,
            n_warps: 16,
            algo: c"Ring".as_ptr(),
            proto: c"Simple".as_ptr(),
            parent_group: std::ptr::null_mut(),
        };
        let mut h: *mut std::ffi::c_void = 0x1234 as *mut _;
        assert_eq!((p.start_event)(ctx, &mut h, (&raw mut d).cast()), 0);
        assert!(h.is_null(), "no trace: no event");
        d.ty = 1 << 9; // a CollApi event: not one gpuprof follows
        assert_eq!((p.start_event)(ctx, &mut h, (&raw mut d).cast()), 0);
        assert!(h.is_null());
        assert_eq!((p.start_event)(ctx, &mut h, std::ptr::null_mut()), 0);
        assert_eq!((p.stop_event)(std::ptr::null_mut()), 0);
        assert_eq!((p.stop_event)(0xdead_0001 as *mut _), 0);
        let mut args = 5u64;
        assert_eq!((p.record_event_state)(0xdead_0002 as *mut _, 22, (&raw mut args).cast()), 0);
        assert_eq!((p.record_event_state)(std::ptr::null_mut(), 22, std::ptr::null_mut()), 0);
        assert_eq!((p.finalize)(ctx), 0);
        std::mem::forget(lib);
    }
    std::process::exit(0);
}

#[test]
fn nccl_finds_the_profiler_plugin_and_an_idle_process_reports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["nccl_plugin_child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env("GPUPROF_TEST_NCCL_CHILD", "1")
        .env("GPUPROF_AGENT_SOCKET", dir.path().join("absent.sock"))
        .env("GPUPROF_CUPTI_LIBRARY", "/nonexistent/libcupti.so.13")
        .env_remove("CUDA_INJECTION64_PATH")
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "the plugin's checks failed (see the output above)");
    let defined = nm(&["-D", "--defined-only"]);
    for sym in ["ncclProfiler_v5", "ncclProfiler_v4"] {
        assert!(defined.lines().any(|l| l.ends_with(&format!(" {sym}"))), "{sym} not exported:\n{defined}");
    }
}
