use super::*;

fn snap() -> Snapshot {
    let pod = Placement {
        container_id: "7e2b6c0a4f1d3e5b9a8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a".into(),
        container_runtime: "containerd",
        pod_uid: "1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c".into(),
        pod_name: "trainer-0".into(),
        pod_namespace: "ml".into(),
        container_name: "pytorch".into(),
    };
    Snapshot {
        host: "gpu-node-17".into(),
        start_ns: 1_000,
        now_ns: 2_000,
        gpus: vec![
            GpuSnap {
                index: 0,
                uuid: "GPU-0f9e8d7c-6b5a-4321-9876-543210fedcba".into(),
                model: "NVIDIA H100 80GB HBM3".into(),
                latest: Some(Latest {
                    metrics: vec!["sm__cycles_active.avg.pct_of_peak_sustained_elapsed".into()],
                    values: vec![42.5],
                    end_ns: 1_900,
                    samples: 77,
                    ..Default::default()
                }),
            },
            // No sampler data yet: no resource.
            GpuSnap { index: 1, uuid: "GPU-1".into(), ..Default::default() },
        ],
        procs: vec![
            ProcSnap {
                pid: 10,
                exe: "python3".into(),
                placement: pod.clone(),
                tracing: true,
                job_id: "run-7".into(),
                rank: Some(3),
            },
            ProcSnap {
                pid: 11,
                exe: "python3".into(),
                placement: pod,
                tracing: false,
                job_id: String::new(),
                rank: None,
            },
            ProcSnap {
                pid: 12,
                exe: "bench".into(),
                placement: Placement::default(),
                tracing: false,
                job_id: String::new(),
                rank: None,
            },
        ],
        records: vec![("kernel", 5, 1)],
        connected_agents: 4,
    }
}

fn attr(r: &ResourceMetrics, key: &str) -> Option<String> {
    r.resource.as_ref()?.attributes.iter().find(|a| a.key == key).and_then(|a| match &a.value.as_ref()?.value {
        Some(any_value::Value::StringValue(s)) => Some(s.clone()),
        Some(any_value::Value::IntValue(i)) => Some(i.to_string()),
        _ => None,
    })
}

#[test]
fn resources_per_gpu_workload_and_daemon() {
    let (req, points) = request(&snap());
    let rms = &req.resource_metrics;
    // GPU 0, the pod, the process outside containers, the daemon.
    assert_eq!(rms.len(), 4, "{rms:#?}");
    for r in rms {
        assert_eq!(attr(r, "host.name").as_deref(), Some("gpu-node-17"));
        assert_eq!(attr(r, "service.name").as_deref(), Some("gpuprofd"));
    }
    let gpu = &rms[0];
    assert_eq!(attr(gpu, "hw.id").as_deref(), Some("GPU-0f9e8d7c-6b5a-4321-9876-543210fedcba"));
    assert_eq!(attr(gpu, "hw.model").as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(attr(gpu, "gpu.index").as_deref(), Some("0"));
    let m = &gpu.scope_metrics[0].metrics;
    assert_eq!(m[0].name, "gpuprof.pm.value");
    let Some(metric::Data::Gauge(g)) = &m[0].data else { panic!("{m:?}") };
    assert_eq!(g.data_points[0].value, Some(number_data_point::Value::AsDouble(42.5)));
    assert_eq!(g.data_points[0].time_unix_nano, 1_900);
    let Some(metric::Data::Sum(sum)) = &m[1].data else { panic!("{m:?}") };
    assert!(sum.is_monotonic && sum.aggregation_temporality == AggregationTemporality::Cumulative as i32);
    assert_eq!(sum.data_points[0].start_time_unix_nano, 1_000);

    // Processes outside containers sort first (empty pod and container).
    assert_eq!(attr(&rms[1], "k8s.pod.uid"), None);
    let pod = &rms[2];
    assert_eq!(attr(pod, "k8s.pod.uid").as_deref(), Some("1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c"));
    assert_eq!(attr(pod, "k8s.pod.name").as_deref(), Some("trainer-0"));
    assert_eq!(attr(pod, "k8s.namespace.name").as_deref(), Some("ml"));
    assert!(attr(pod, "container.id").unwrap().starts_with("7e2b6c0a4f1d"));
    let Some(metric::Data::Gauge(g)) = &pod.scope_metrics[0].metrics[0].data else { panic!() };
    let tracing: Vec<_> = g.data_points.iter().map(|p| p.value).collect();
    assert_eq!(tracing, [Some(number_data_point::Value::AsInt(1)), Some(number_data_point::Value::AsInt(0))]);
    // The rank's point carries its job; the other has none.
    let keys = |i: usize| g.data_points[i].attributes.iter().map(|a| a.key.as_str()).collect::<Vec<_>>();
    assert_eq!(keys(0), ["process.pid", "process.executable.name", "gpuprof.job.id", "gpuprof.job.rank"]);
    assert_eq!(keys(1), ["process.pid", "process.executable.name"]);
    // 1 PM value + 1 sample count + 1 + 2 process points + 2 record counters + 1 gauge.
    assert_eq!(points, 8);
}

/// The exporter built from its parts, no daemon: a snapshot of empty sources has no GPU or
/// process and a counter per record kind; against a collector that does not answer, each
/// export is counted failed and its points dropped, and the task ends at shutdown.
#[tokio::test(flavor = "multi_thread")]
async fn an_exporter_without_a_daemon() {
    let cfg = crate::config::Config::from_toml("").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pm, registry, stats) = (PmHub::default(), Registry::default(), Arc::new(Stats::default()));
    let gpus = Gpus::from_config_in(&cfg, dir.path());
    let empty = Snapshot::take(Sources { pm: &pm, gpus: &gpus, registry: &registry, stats: &stats });
    assert!(empty.gpus.is_empty() && empty.procs.is_empty(), "{:?}", empty.gpus.len());
    assert_eq!(empty.records.len(), crate::catalog::Kind::ALL.len());
    let mut config = cfg.otlp.clone();
    config.endpoint = "http://127.0.0.1:9".into();
    config.interval = crate::config::Dur(Duration::from_millis(50));
    config.timeout = crate::config::Dur(Duration::from_millis(200));
    let channel = channel(&config).unwrap();
    let exporter = Exporter {
        config,
        stats: stats.clone(),
        snapshot: Box::new(snap),
        pc: Box::new(|| (Taken::default(), HashMap::new())),
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(exporter, channel, shutdown.clone()));
    let t0 = std::time::Instant::now();
    while stats.otlp_failed_exports.load(Relaxed) < 2 && t0.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    let failed = stats.otlp_failed_exports.load(Relaxed);
    assert!(failed >= 2, "{failed} failed exports");
    // `snap()` makes 8 points an export (see resources_per_gpu_workload_and_daemon).
    assert_eq!(stats.otlp_points_dropped.load(Relaxed), 8 * failed);
    assert_eq!(stats.otlp_points_sent.load(Relaxed), 0);
}

#[tokio::test]
async fn tls_files_are_checked_at_start() {
    let mut cfg = crate::config::Config::from_toml("").unwrap().otlp;
    cfg.endpoint = "https://collector:4317".into();
    cfg.ca_file = "/nonexistent/ca.pem".into();
    let e = format!("{:#}", channel(&cfg).unwrap_err());
    assert!(e.contains("otlp.ca_file"), "{e}");
    cfg.ca_file.clear();
    cfg.endpoint = "http://127.0.0.1:4317".into();
    assert!(channel(&cfg).is_ok(), "plain gRPC, connected lazily");
}
