//! Agent connections served from their parts, without a daemon; binding the sockets.

use gpuprof_proto::agent::{
    AgentKind, CubinAnswer, CubinChunk, CubinQuery, CubinsNotFound, Goodbye, Heartbeat, Hello, MemsetRecord, PmSample,
    PmSampleBatch, RecordBatch,
};
use gpuprof_proto::frame::read_frame_async;

use super::*;
use crate::pcsamp::sched::SchedConfig;

#[tokio::test]
async fn a_stale_socket_is_replaced_and_anything_else_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(bind_unix(&sock, 0o600).is_ok(), "a stale socket (nobody listening) is replaced");
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    let e = bind_unix(&file, 0o600).unwrap_err().to_string();
    assert!(e.contains("is not a Unix socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    let sub = dir.path().join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    assert!(bind_unix(&sub, 0o600).is_err());
    assert!(sub.is_dir());
}

struct Parts {
    _dir: tempfile::TempDir,
    cfg: crate::config::Config,
    writer: crate::ingest::TestWriter,
    stats: Arc<Stats>,
    registry: Registry,
    pods: Pods,
    records: DashMap<u64, AtomicU64>,
    sessions: Sessions,
    pc: PcHub,
    arbiter: Arc<Arbiter>,
    otlp_pc: PcProfiles,
    pm_samples: broadcast::Sender<Arc<PmPublished>>,
    db: std::path::PathBuf,
}

impl Parts {
    fn new() -> Parts {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::from_toml("").unwrap();
        let conn = crate::store::open_writer(&dir.path().join("t.db"), &cfg.storage).unwrap();
        let arbiter = crate::arbiter::open(&conn, &cfg).unwrap();
        let writer = crate::ingest::TestWriter::start(conn, &cfg.ingest);
        let (sessions, _persister) = Sessions::new(writer.handle.clone());
        Parts {
            db: dir.path().join("t.db"),
            _dir: dir,
            pods: Pods::new(&cfg.kubernetes),
            pc: PcHub::new(16, SchedConfig::from_config(&cfg.pc)),
            cfg,
            writer,
            stats: Arc::default(),
            registry: Registry::default(),
            records: DashMap::new(),
            sessions,
            arbiter,
            otlp_pc: Default::default(),
            pm_samples: broadcast::channel(16).0,
        }
    }

    fn connections(&self) -> Connections<'_> {
        Connections {
            agent: &self.cfg.agent,
            otlp_profiles: false,
            writer: &self.writer.handle,
            stats: &self.stats,
            registry: &self.registry,
            pods: &self.pods,
            session_records: &self.records,
            sessions: &self.sessions,
            pc: &self.pc,
            arbiter: &self.arbiter,
            otlp_pc: &self.otlp_pc,
            pm_samples: &self.pm_samples,
            db_path: &self.db,
        }
    }
}

async fn send(s: &mut UnixStream, msg: Msg) {
    let mut buf = Vec::new();
    encode_frame(&AgentMessage { msg: Some(msg) }, &mut buf);
    s.write_all(&buf).await.unwrap();
}

async fn welcome(s: &mut UnixStream) -> wire::Welcome {
    let mut buf = Vec::new();
    read_frame_async(s, &mut buf, 1 << 20, &mut false).await.unwrap();
    match DaemonMessage::decode(buf.as_slice()).unwrap().msg {
        Some(daemon_message::Msg::Welcome(w)) => w,
        other => panic!("{other:?}"),
    }
}

fn hello(kind: AgentKind) -> Msg {
    Msg::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        kind: kind as i32,
        exe: "/usr/bin/app".into(),
        ..Default::default()
    })
}

/// An injector and a sampler served from their parts: each is welcomed and registered while
/// connected; the injector's records count for their session and its trace state is
/// published, the sampler's PM samples go to the live ring; a peer whose first message is not
/// a Hello is refused and counted as a protocol error.
#[tokio::test]
async fn agent_connections_without_a_daemon() {
    let p = Parts::new();
    let shutdown = CancellationToken::new();

    let (server, mut client) = UnixStream::pair().unwrap();
    let mut events = p.registry.subscribe();
    let drive = async {
        send(&mut client, hello(AgentKind::Injector)).await;
        let w = welcome(&mut client).await;
        assert!(w.process_id > 0 && w.heartbeat_interval_ms == p.cfg.agent.heartbeat_interval_ms, "{w:?}");
        assert!(w.cubin_cache, "this daemon answers cubin queries");
        let a = p.registry.get(w.process_id).expect("registered");
        assert_eq!((a.pid, a.kind), (std::process::id(), "injector"));
        assert_eq!(p.stats.connected_agents.load(Relaxed), 1);
        let batch = RecordBatch { session_id: 3, memsets: vec![MemsetRecord::default(); 2], ..Default::default() };
        send(&mut client, Msg::Records(batch)).await;
        let tracing =
            wire::TraceState { status: wire::TraceStatus::Tracing as i32, session_id: 3, ..Default::default() };
        send(&mut client, Msg::TraceState(tracing)).await;
        send(&mut client, Msg::Goodbye(Goodbye::default())).await;
        w.process_id
    };
    let ((), id) = tokio::join!(handle(server, p.connections(), shutdown.clone()), drive);
    assert_eq!(p.records.get(&3).map(|c| c.load(Relaxed)), Some(2));
    assert!(matches!(events.try_recv(), Ok(AgentEvent::Connected(a)) if a.id == id));
    assert!(matches!(events.try_recv(), Ok(AgentEvent::TraceState { id: i, session_id: 3, .. }) if i == id));
    assert!(
        matches!(events.try_recv(), Ok(AgentEvent::Disconnected { id: i, reason }) if i == id && reason == "goodbye")
    );
    assert!(p.registry.is_empty());
    assert_eq!(p.stats.connected_agents.load(Relaxed), 0);

    let (server, mut client) = UnixStream::pair().unwrap();
    let mut live = p.pm_samples.subscribe();
    let drive = async {
        send(&mut client, hello(AgentKind::Sampler)).await;
        let w = welcome(&mut client).await;
        let sample = PmSample { start_ns: 1, end_ns: 2, values: vec![0.5] };
        let batch = PmSampleBatch { device_id: 0, metrics: vec!["sm".into()], samples: vec![sample] };
        send(&mut client, Msg::PmSamples(batch)).await;
        send(&mut client, Msg::Goodbye(Goodbye::default())).await;
        w.process_id
    };
    let ((), id) = tokio::join!(handle(server, p.connections(), shutdown.clone()), drive);
    let published = live.try_recv().expect("published");
    assert_eq!(
        (published.proc, published.source, published.batch.samples[0].values[0]),
        (id, crate::nvml::Source::CuptiPm, 0.5)
    );
    assert_eq!(p.stats.protocol_errors.load(Relaxed), 0);

    let (server, mut client) = UnixStream::pair().unwrap();
    send(&mut client, Msg::Heartbeat(Heartbeat::default())).await;
    handle(server, p.connections(), shutdown.clone()).await;
    assert_eq!(p.stats.protocol_errors.load(Relaxed), 1);
    assert!(p.registry.is_empty());

    drop(p.sessions);
    p.writer.stop().await;
}

/// Reads daemon messages until a `CubinAnswer`: the cubin pieces before it, put together, and it.
async fn cubin_answer(s: &mut UnixStream) -> (std::collections::HashMap<String, Vec<u8>>, CubinAnswer) {
    let mut cubins: std::collections::HashMap<String, Vec<u8>> = Default::default();
    loop {
        let mut buf = Vec::new();
        read_frame_async(s, &mut buf, 1 << 20, &mut false).await.unwrap();
        match DaemonMessage::decode(buf.as_slice()).unwrap().msg {
            Some(daemon_message::Msg::Cubin(c)) => {
                let got = cubins.entry(c.hash).or_default();
                assert_eq!(c.offset as usize, got.len(), "pieces in order");
                got.extend(c.data);
            }
            Some(daemon_message::Msg::CubinAnswer(a)) => return (cubins, a),
            other => panic!("{other:?}"),
        }
    }
}

/// A process attached late asks for cubins before reading its libraries: one an earlier
/// process sent goes back whole (in pieces the injector accepts), one an earlier process found
/// in none of its mapped files is answered as such, the rest are unknown; a query naming
/// something other than a cubin hash drops that connection only.
#[tokio::test]
async fn cubin_queries_are_answered_from_what_earlier_processes_sent_and_reported() {
    let p = Parts::new();
    let shutdown = CancellationToken::new();
    let cubin: Vec<u8> = (0..(1 << 20) + 7).map(|i| (i % 253) as u8).collect();
    let (aa, bb, cc) = ("00000000000000aa".to_string(), "00000000000000bb".to_string(), "00000000000000cc".to_string());

    let (server, mut client) = UnixStream::pair().unwrap();
    let drive = async {
        send(&mut client, hello(AgentKind::Injector)).await;
        welcome(&mut client).await;
        for (i, piece) in cubin.chunks(1 << 20).enumerate() {
            let c = CubinChunk {
                hash: aa.clone(),
                size: cubin.len() as u64,
                offset: (i << 20) as u64,
                data: piece.to_vec(),
            };
            send(&mut client, Msg::Cubin(c)).await;
        }
        send(&mut client, Msg::CubinsNotFound(CubinsNotFound { hashes: vec![bb.clone()] })).await;
        send(&mut client, Msg::Goodbye(Goodbye::default())).await;
    };
    tokio::join!(handle(server, p.connections(), shutdown.clone()), drive);

    let (server, mut client) = UnixStream::pair().unwrap();
    let drive = async {
        send(&mut client, hello(AgentKind::Injector)).await;
        welcome(&mut client).await;
        // The writer stores the cubin in its own time: asked again until it is there.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            send(&mut client, Msg::CubinQuery(CubinQuery { hashes: vec![aa.clone(), bb.clone(), cc.clone()] })).await;
            let (got, a) = cubin_answer(&mut client).await;
            if a.sent.is_empty() && std::time::Instant::now() < deadline {
                assert_eq!(a.unknown, [aa.clone(), cc.clone()], "{a:?}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
            assert_eq!(a.sent, [aa.as_str()], "{a:?}");
            assert_eq!((a.nowhere, a.unknown), (vec![bb.clone()], vec![cc.clone()]));
            assert!(got[&aa] == cubin, "the cubin comes back whole");
            assert_eq!(got.len(), 1);
            break;
        }
        // Two queries at once: two answers, one after the other, each whole.
        for _ in 0..2 {
            send(&mut client, Msg::CubinQuery(CubinQuery { hashes: vec![aa.clone()] })).await;
        }
        for _ in 0..2 {
            let (got, a) = cubin_answer(&mut client).await;
            assert_eq!(a.sent, [aa.as_str()]);
            assert!(got.len() == 1 && got[&aa] == cubin, "each answer's pieces come together");
        }
        send(&mut client, Msg::Goodbye(Goodbye::default())).await;
    };
    tokio::join!(handle(server, p.connections(), shutdown.clone()), drive);
    assert_eq!(p.stats.protocol_errors.load(Relaxed), 0);

    let (server, mut client) = UnixStream::pair().unwrap();
    let drive = async {
        send(&mut client, hello(AgentKind::Injector)).await;
        welcome(&mut client).await;
        send(&mut client, Msg::CubinQuery(CubinQuery { hashes: vec!["../etc/passwd".into()] })).await;
    };
    tokio::join!(handle(server, p.connections(), shutdown.clone()), drive);
    assert_eq!(p.stats.protocol_errors.load(Relaxed), 1, "the bad query dropped its connection");
    assert!(p.registry.is_empty());

    drop(p.sessions);
    p.writer.stop().await;
}
