//! PM and PC streams built from their parts, without a daemon.

use std::time::Duration;

use gpuprof_proto::agent::{PmSample, PmSampleBatch};
use tokio_stream::StreamExt;

use super::*;
use crate::pcsamp::sched::SchedConfig;

struct Parts {
    _dir: tempfile::TempDir,
    cfg: crate::config::Config,
    arbiter: Arc<Arbiter>,
    samples: broadcast::Sender<Arc<PmPublished>>,
    hub: Arc<PmHub>,
    nvml: NvmlState,
    shutdown: CancellationToken,
}

impl Parts {
    fn new() -> Parts {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::from_toml("").unwrap();
        let conn = crate::store::open_writer(&dir.path().join("t.db"), &cfg.storage).unwrap();
        let arbiter = crate::arbiter::open(&conn, &cfg).unwrap();
        arbiter.add_device(0);
        Parts {
            _dir: dir,
            cfg,
            arbiter,
            samples: broadcast::channel(64).0,
            hub: Arc::default(),
            nvml: NvmlState::default(),
            shutdown: CancellationToken::new(),
        }
    }

    fn streams(&self) -> Streams<'_> {
        Streams {
            sampler: &self.cfg.sampler,
            samples: &self.samples,
            hub: &self.hub,
            arbiter: &self.arbiter,
            nvml: &self.nvml,
            no_gpu: None,
            shutdown: &self.shutdown,
        }
    }

    fn publish(&self, device_id: u32, values: Vec<f64>) {
        let batch = PmSampleBatch {
            device_id,
            metrics: vec!["a".into(), "b".into()],
            samples: vec![PmSample { start_ns: 1, end_ns: 2, values }],
        };
        self.samples.send(Arc::new(PmPublished { proc: 1, source: Source::CuptiPm, batch })).unwrap();
    }
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen");
}

fn refused(p: &Parts, no_gpu: Option<&str>, req: pb::StreamPmSamplesRequest) -> String {
    let d = Streams { no_gpu: no_gpu.map(Into::into), ..p.streams() };
    subscribe(d, req).expect_err("refused").message().to_string()
}

/// A PM stream from its parts: refused without a GPU, for a long window, an unmanaged GPU or an
/// unknown source; a subscriber gets its GPU's samples with the metrics it asked for, counted
/// in the hub, and at shutdown an UNAVAILABLE end.
#[tokio::test]
async fn pm_stream_without_a_daemon() {
    let p = Parts::new();
    let any = pb::StreamPmSamplesRequest::default();
    assert!(refused(&p, Some("no NVIDIA driver"), any.clone()).contains("no GPU to stream: no NVIDIA driver"));
    let long = pb::StreamPmSamplesRequest { downsample_ms: MAX_DOWNSAMPLE_MS + 1, ..Default::default() };
    assert!(refused(&p, None, long).contains("downsample_ms"));
    let gpu3 = pb::StreamPmSamplesRequest { devices: vec![3], ..Default::default() };
    assert!(refused(&p, None, gpu3).contains("GPU 3 is not managed"));
    let bogus = pb::StreamPmSamplesRequest { sources: vec!["bogus".into()], ..Default::default() };
    assert!(refused(&p, None, bogus).contains("\"bogus\" is not one of"));

    let req = pb::StreamPmSamplesRequest { devices: vec![0], metrics: vec!["b".into()], ..Default::default() };
    let mut s = subscribe(p.streams(), req).unwrap();
    assert_eq!(p.hub.subscribers.load(Relaxed), 1);
    p.publish(1, vec![5.0, 6.0]);
    p.publish(0, vec![1.0, 2.0]);
    let m = tokio::time::timeout(Duration::from_secs(5), s.next()).await.unwrap().unwrap().unwrap();
    let Some(pb::stream_pm_samples_response::Event::Sample(pt)) = m.event else { panic!("{m:?}") };
    assert_eq!(pt.device, 0);
    assert_eq!(pt.values, [pb::PmValue { metric: "b".into(), value: 2.0 }]);
    assert_eq!(p.hub.messages_sent.load(Relaxed), 1);

    p.shutdown.cancel();
    let end = tokio::time::timeout(Duration::from_secs(5), s.next()).await.unwrap().unwrap().unwrap_err();
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end}");
    assert!(tokio::time::timeout(Duration::from_secs(5), s.next()).await.unwrap().is_none());
    eventually("the subscriber's end", || p.hub.subscribers.load(Relaxed) == 0).await;
}

/// The latest-value tracker from its parts: the hub holds the last published values.
#[tokio::test]
async fn latest_values_without_a_daemon() {
    let p = Parts::new();
    let task = tokio::spawn(track_latest(p.samples.subscribe(), p.hub.clone(), p.shutdown.clone()));
    p.publish(0, vec![1.0, 2.0]);
    p.publish(0, vec![3.0, 4.0]);
    eventually("the latest values", || p.hub.latest().get(&0).is_some_and(|l| l.values == [3.0, 4.0])).await;
    assert_eq!(p.hub.latest()[&0].samples, 2);
    p.shutdown.cancel();
    task.await.unwrap();
}

/// A PC stream from its parts: a bad kernel glob and another user are refused; a session
/// that is not open streams nothing; the subscriber is counted while its stream lives.
#[tokio::test]
async fn pc_stream_without_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::config::Config::from_toml("").unwrap();
    let db = dir.path().join("t.db");
    let writer = crate::ingest::TestWriter::start(crate::store::open_writer(&db, &cfg.storage).unwrap(), &cfg.ingest);
    let (sessions, _persister) = Sessions::new(writer.handle.clone());
    let hub = Arc::new(PcHub::new(16, SchedConfig::from_config(&cfg.pc)));
    let d = || PcStreams {
        owners: SessionOwners { live: Some(1000), db_path: &db, admin_group: "gpuprof" },
        hub: &hub,
        sessions: &sessions,
    };
    let req = |kernel: &str| pb::StreamPcSamplesRequest { session_id: 4, kernel: kernel.into() };
    let root = Caller::root();
    let e = pc_stream(d(), &root, req("gemm[")).await.err().unwrap();
    assert!(e.message().contains("unclosed '['"), "{e}");
    let other = Caller { uid: 2000, gid: 2000, pid: None, admin: false, authenticated: true };
    let e = pc_stream(d(), &other, req("")).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert_eq!(hub.subscribers.load(Relaxed), 0);

    let owner = Caller { uid: 1000, ..other };
    let s = pc_stream(d(), &owner, req("")).await.unwrap();
    assert_eq!(hub.subscribers.load(Relaxed), 1);
    let mut s = Box::pin(s);
    assert!(tokio::time::timeout(Duration::from_secs(5), s.next()).await.unwrap().is_none());
    drop(s);
    assert_eq!(hub.subscribers.load(Relaxed), 0);
    drop(sessions);
    writer.stop().await;
}
