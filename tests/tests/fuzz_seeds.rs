//! Writes the seed corpus of the fuzz targets (`fuzz/corpus/<target>/seed-*`) from real
//! messages: what injectors and samplers send (built with gpuprof-proto's types and the fake
//! agents' record generator), the built-in and packaged configurations, and globs. Ignored:
//! run it to write the seeds again after the protocol changes,
//! `cargo test -p gpuprof-testkit --test fuzz_seeds -- --ignored`.

use std::path::Path;

use gpuprof_proto::agent::{self as wire, AgentKind, AgentMessage, PROTOCOL_VERSION, agent_message::Msg};
use gpuprof_proto::frame::encode_frame;
use gpuprof_testkit::fake_agent;
use gpuprof_testkit::layout::repo_root;
use gpuprof_testkit::records::{Mix, RecordGen};

/// Kernel names as CUPTI reports them: mangled C++ (CUTLASS, PyTorch), Rust, and plain C.
const NAMES: &[&str] = &[
    "_ZN7cutlass7Kernel2INS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS5_IJNS4_1CILi128EEES8_NS7_ILi64EEEEEEvEEEEvNT_6ParamsE",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
    "_ZN4core3fmt5write17h0123456789abcdefE",
    "_RNvCs1234_7mycrate4main",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "nvtx",
    "forward",
    "smsp__pcsamp_warps_issue_stalled_long_scoreboard",
    "/workspace/kernels/gemm.cu",
    "0123456789abcdef",
];

fn msg(m: Msg) -> AgentMessage {
    AgentMessage { msg: Some(m) }
}

fn frames(ms: &[AgentMessage]) -> Vec<u8> {
    let mut buf = Vec::new();
    for m in ms {
        encode_frame(m, &mut buf);
    }
    buf
}

fn strings(from: u32, values: &[&str]) -> AgentMessage {
    let strings = values
        .iter()
        .enumerate()
        .map(|(i, v)| wire::InternedString { id: from + i as u32, value: v.to_string() })
        .collect();
    msg(Msg::Strings(wire::StringTable { strings }))
}

fn injector_session() -> Vec<AgentMessage> {
    let mut out = vec![msg(Msg::Hello(fake_agent::hello("/usr/bin/python3")))];
    out.push(strings(1, NAMES));
    let mut g = RecordGen::new(7, Mix::default());
    g.kernel_name_ids = vec![1, 2, 3, 4, 5];
    g.marker_name_ids = vec![6, 7];
    for (session, n) in [(0, 12), (3, 24)] {
        let mut b = wire::RecordBatch { session_id: session, ..Default::default() };
        g.fill(&mut b, n);
        out.push(msg(Msg::Records(b)));
    }
    // NCCL collectives (one timed in the kernel, one not).
    let coll = |seq: u64, gpu: u64| wire::CollectiveRecord {
        start_ns: 1_700_000_000_000_000_000 + seq * 1_000_000,
        end_ns: 1_700_000_000_000_020_000 + seq * 1_000_000,
        gpu_start_ns: gpu,
        gpu_end_ns: if gpu == 0 { 0 } else { gpu + 300_000 },
        name_id: 6,
        datatype_id: 7,
        seq,
        comm_hash: 0x9f3a_0000_0000_0001,
        count: 1 << 20,
        bytes: 4 << 20,
        root: -1,
        rank: 1,
        nranks: 2,
        channels: 2,
        thread_id: 77,
        ..Default::default()
    };
    out.push(msg(Msg::Records(wire::RecordBatch {
        session_id: 3,
        collectives: vec![coll(0, 1_700_000_000_000_100_000), coll(1, 0)],
        ..Default::default()
    })));
    out.push(msg(Msg::TraceState(wire::TraceState {
        status: wire::TraceStatus::Tracing as i32,
        session_id: 3,
        detail: String::new(),
    })));
    out.push(msg(Msg::PcSamplingState(wire::PcSamplingState {
        session_id: 3,
        device_id: 0,
        status: wire::PcSamplingStatus::Sampling as i32,
        ..Default::default()
    })));
    let samples = (0..6)
        .map(|i| wire::PcSample {
            function_name_id: 1 + i % 3,
            pc_offset: 0x80 * u64::from(i),
            stall_reason_id: 8,
            count: 10 + u64::from(i),
            module_id: 10,
            file_id: 9,
            line: 40 + i,
        })
        .collect();
    out.push(msg(Msg::PcSamples(wire::PcSampleBatch {
        session_id: 3,
        device_id: 0,
        samples,
        start_ns: 1_700_000_000_000_000_000,
        end_ns: 1_700_000_000_100_000_000,
        total_samples: 80,
        dropped_samples: 5,
        sampled_ns: 1_000_000,
    })));
    out.push(msg(Msg::DeviceActivity(wire::DeviceActivity {
        devices: vec![wire::DeviceUse { device_id: 0, context: true, syncs: 12, launches: 40 }],
    })));
    let cubin: Vec<u8> = (0..96u8).collect();
    for (i, piece) in cubin.chunks(40).enumerate() {
        out.push(msg(Msg::Cubin(wire::CubinChunk {
            hash: "0123456789abcdef".into(),
            size: cubin.len() as u64,
            offset: (i * 40) as u64,
            data: piece.to_vec(),
        })));
    }
    out.push(msg(Msg::CubinQuery(wire::CubinQuery {
        hashes: vec!["0123456789abcdef".into(), "00000000deadbeef".into()],
    })));
    out.push(msg(Msg::CubinsNotFound(wire::CubinsNotFound { hashes: vec!["00000000deadbeef".into()] })));
    out.push(msg(Msg::Drops(wire::DropReport {
        counts: vec![wire::DropCount { kind: 1, dropped: 4 }, wire::DropCount { kind: 2, dropped: 1 }],
        cupti_dropped: 2,
    })));
    out.push(msg(Msg::Heartbeat(wire::Heartbeat {
        clock: Some(wire::ClockPair { realtime_ns: 1_700_000_000_000_000_000, monotonic_ns: 123_456_789 }),
    })));
    out.push(msg(Msg::Drops(wire::DropReport {
        counts: vec![wire::DropCount { kind: 1, dropped: 9 }],
        cupti_dropped: 2,
    })));
    out.push(msg(Msg::Goodbye(wire::Goodbye { reason: "exit".into() })));
    out
}

fn sampler_session() -> Vec<AgentMessage> {
    let mut h = fake_agent::hello("/usr/bin/gpuprof-sampler");
    h.kind = AgentKind::Sampler as i32;
    h.sampler_device = 1;
    let metrics =
        vec!["sm__cycles_active.avg".to_string(), "dram__throughput.avg.pct_of_peak_sustained_elapsed".into()];
    let samples = (0..4)
        .map(|i| wire::PmSample { start_ns: 1000 * i, end_ns: 1000 * i + 900, values: vec![0.5 * i as f64, 97.25] })
        .collect();
    vec![
        msg(Msg::Hello(h)),
        msg(Msg::SamplerState(wire::SamplerState {
            device_id: 1,
            status: wire::SamplerStatus::Sampling as i32,
            detail: String::new(),
        })),
        msg(Msg::PmSamples(wire::PmSampleBatch { device_id: 1, metrics, samples })),
        msg(Msg::Goodbye(wire::Goodbye::default())),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("creating the corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("writing a seed");
}

#[test]
#[ignore = "writes fuzz/corpus; run it after protocol changes"]
fn write_fuzz_seeds() {
    let root = repo_root();
    let corpus = root.join("fuzz/corpus");
    let injector = injector_session();
    let sampler = sampler_session();
    assert_eq!(
        injector[0].msg.as_ref().map(|m| matches!(m, Msg::Hello(h) if h.protocol_version == PROTOCOL_VERSION)),
        Some(true)
    );
    for target in ["frame", "agent"] {
        let dir = corpus.join(target);
        write(&dir, "injector-session", &frames(&injector));
        write(&dir, "sampler-session", &frames(&sampler));
        // A session cut short, and one that breaks the rules half way (a string used before it is defined).
        write(&dir, "injector-hello-strings", &frames(&injector[..2]));
        let mut bad = injector[..1].to_vec();
        bad.extend(injector[2..4].iter().cloned());
        write(&dir, "injector-undefined-strings", &frames(&bad));
    }
    // Single frames for the decoder.
    for (i, m) in injector.iter().chain(sampler.iter()).enumerate() {
        write(&corpus.join("frame"), &format!("message-{i:02}"), &frames(std::slice::from_ref(m)));
    }
    let config = corpus.join("config");
    write(&config, "default-toml", std::fs::read(root.join("daemon/src/default.toml")).unwrap().as_slice());
    write(&config, "deploy-gpuprofd-toml", std::fs::read(root.join("deploy/gpuprofd.toml")).unwrap().as_slice());
    for (i, text) in [
        "[ingest]\ncommit_max_records = 10\n",
        "[agent]\nmax_frame_bytes = 1048576\nheartbeat_interval_ms = 1000\nliveness_timeout_ms = 2000\n",
        "[retention]\nsessions_max_age = \"7days\"\ndatabase_max_size = \"1.5 GiB\"\n",
        "[storage]\nmax_database_mib = 1000\n[retention]\ndatabase_max_size = 0\n",
        "log_level = \"gpuprofd=debug,tower=warn,[conn{peer=1}]=trace\"\n",
        "[api]\ntcp_listen = \"0.0.0.0:7461\"\ntls_cert_file = \"cert.pem\"\ntls_key_file = \"key.pem\"\n",
        "[sampler]\ninterval = \"10ms\"\nmetrics = [\"sm__cycles_active.avg\", \"sm__cycles_active.avg\"]\n",
        "[otlp]\nendpoint = \"https://collector:4317\"\ninterval = \"15s\"\n[kubernetes]\nkubelet_url = \"https://127.0.0.1:10250/pods\"\n",
        "[prometheus]\nlisten = \"127.0.0.1:9464\"\n[metrics]\ninterval = \"1s\"\nstore_interval = \"10s\"\n",
    ]
    .iter()
    .enumerate()
    {
        write(&config, &format!("snippet-{i:02}"), text.as_bytes());
    }
    let globs = corpus.join("glob");
    for (i, g) in [
        "*gemm*\nsm90_xmma_gemm_f32",
        "*train*.py\npython3 /home/a/train_gpt.py",
        "python?\npython3",
        "[a-c]x\nbx",
        "[^a-c]x\nbx",
        "a[]]b\na]b",
        "[]-a]\n-",
        "/usr/*/python3\n/usr/local/bin/python3",
        "*_ZN7cutlass*Gemm*\n_ZN7cutlass7Kernel2INS_4gemm6kernel13GemmUniversalE",
        "[abc\na",
        "*[!-z]?*\nxyz",
    ]
    .iter()
    .enumerate()
    {
        write(&globs, &format!("{i:02}"), g.as_bytes());
    }
}
