//! `gpuprofctl export` by format: the Perfetto trace decodes as Perfetto `Trace` packets with
//! the session's records as slices on process, thread, GPU and stream tracks and a flow from
//! each launch to its activity; `.json.gz` gunzips to the Chrome JSON; `-o -` streams to
//! stdout; a name that says no format is refused with the list of formats.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::EVENT_TABLES;
use std::collections::{HashMap, HashSet};
use std::io::Read;

use gpuprof_proto::perfetto::{Trace, TrackDescriptor, trace_packet::Data, track_event::Type};
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{recorded_session, stored_rows};
use gpuprofctl::pb;
use prost::Message;

fn export(d: &TestDaemon, args: &[&str]) -> std::process::Output {
    let out = d.ctl(&[&["export"], args].concat());
    assert!(out.status.success(), "export {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn perfetto_trace_has_the_sessions_slices_tracks_and_flows() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let (id, agent) = recorded_session(&d, 20_000);
    let file = dir.path().join("trace.pftrace");
    export(&d, &[&id.to_string(), "-o", file.to_str().unwrap()]);
    let trace = Trace::decode(std::fs::read(&file).unwrap().as_slice()).expect("a Perfetto Trace");
    assert!(trace.packet.iter().all(|p| p.trusted_packet_sequence_id == Some(1)));
    assert_eq!(trace.packet[0].sequence_flags, Some(1), "the first packet clears the sequence's state");

    // Tracks: described once, before their first event; parents described before children.
    let mut tracks: HashMap<u64, TrackDescriptor> = HashMap::new();
    let mut by_cat: HashMap<String, u64> = HashMap::new();
    let (mut begins, mut ends) = (0u64, 0u64);
    let mut flow_starts: HashMap<u64, u64> = HashMap::new();
    let mut flow_ends: HashMap<u64, u64> = HashMap::new();
    let mut open: HashMap<u64, u64> = HashMap::new();
    // Interned names, by iid: defined (once) in or before the packet of the first event using them.
    let (mut cats, mut names, mut arg_names) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut args_seen: HashSet<String> = HashSet::new();
    for p in &trace.packet {
        if let Some(i) = &p.interned_data {
            for (map, entries) in [
                (&mut cats, i.event_categories.iter().map(|c| (c.iid, c.name.clone())).collect::<Vec<_>>()),
                (&mut names, i.event_names.iter().map(|c| (c.iid, c.name.clone())).collect()),
                (&mut arg_names, i.debug_annotation_names.iter().map(|c| (c.iid, c.name.clone())).collect()),
            ] {
                for (iid, name) in entries {
                    let (iid, name) = (iid.expect("an iid"), name.expect("a name"));
                    assert!(map.insert(iid, name).is_none(), "iid {iid} interned twice");
                }
            }
        }
        match p.data.as_ref().expect("a packet with data") {
            Data::TrackDescriptor(t) => {
                let uuid = t.uuid.unwrap();
                if let Some(parent) = t.parent_uuid {
                    assert!(tracks.contains_key(&parent), "track {uuid}'s parent {parent} is not described yet");
                }
                assert!(tracks.insert(uuid, t.clone()).is_none(), "track {uuid} described twice");
            }
            Data::TrackEvent(e) => {
                let track = e.track_uuid.unwrap();
                assert!(tracks.contains_key(&track), "event on undescribed track {track}");
                let ts = p.timestamp.unwrap();
                match e.r#type() {
                    Type::SliceBegin | Type::Instant => {
                        assert_eq!(
                            p.sequence_flags,
                            Some(2),
                            "an event with interned names needs the sequence's state"
                        );
                        assert_eq!(e.category_iids.len(), 1);
                        let cat = cats.get(&e.category_iids[0]).expect("an interned category");
                        *by_cat.entry(cat.clone()).or_default() += 1;
                        let name = names.get(&e.name_iid.expect("an interned name")).expect("an interned name");
                        assert!(!name.is_empty(), "an unnamed event");
                        for a in &e.debug_annotations {
                            args_seen
                                .insert(arg_names.get(&a.name_iid.unwrap()).expect("an interned argument").clone());
                        }
                        if e.r#type() == Type::SliceBegin {
                            begins += 1;
                            assert!(open.insert(track, ts).is_none(), "a slice begins before the last one ended");
                        }
                        for f in &e.flow_ids {
                            assert!(flow_starts.insert(*f, track).is_none(), "flow {f} starts twice");
                        }
                        for f in &e.terminating_flow_ids {
                            assert!(flow_ends.insert(*f, track).is_none(), "flow {f} ends twice");
                        }
                    }
                    Type::SliceEnd => {
                        ends += 1;
                        let began = open.remove(&track).expect("an end without a begin");
                        assert!(ts >= began, "a slice ends before it begins");
                    }
                    Type::Counter => assert!(e.counter_value.is_some(), "a counter event without a value"),
                    Type::Unspecified => panic!("an event without a type"),
                }
            }
        }
    }
    assert_eq!(begins, ends);
    for arg in ["correlation", "grid", "block", "registers", "bytes", "cbid", "domain"] {
        assert!(args_seen.contains(arg), "no event has a {arg} argument: {args_seen:?}");
    }
    let mut shown: Vec<&String> = names.values().collect();
    shown.sort();
    assert!(names.values().any(|n| n == "cudaLaunchKernel"), "API calls are named by their cbid: {shown:?}");

    // Every record is there, per kind.
    let db = rusqlite::Connection::open(d.db_path()).unwrap();
    let rows: u64 = EVENT_TABLES.iter().map(|t| stored_rows(&db, t, id)).sum();
    assert!(rows > 15_000, "{rows}");
    assert_eq!(by_cat.values().sum::<u64>(), rows, "{by_cat:?}");
    for (t, cat) in [("kernel", "kernel"), ("memcpy", "memcpy"), ("memset", "memset"), ("marker", "nvtx")] {
        assert_eq!(by_cat.get(cat).copied().unwrap_or(0), stored_rows(&db, t, id), "{t}");
    }

    // The process track, its threads, and GPU tracks whose children are the streams.
    let name = |t: &TrackDescriptor| t.name.clone().unwrap_or_default();
    let processes: Vec<&TrackDescriptor> = tracks.values().filter(|t| t.process.is_some()).collect();
    assert_eq!(processes.len(), 1);
    assert_eq!(processes[0].process.as_ref().unwrap().process_name.as_deref(), Some("python3"));
    let process = processes[0].uuid.unwrap();
    let gpus: HashSet<u64> = tracks.values().filter(|t| name(t).starts_with("GPU ")).map(|t| t.uuid.unwrap()).collect();
    assert!(!gpus.is_empty());
    assert!(gpus.iter().all(|g| tracks[g].parent_uuid == Some(process)));
    // GPUs are named by model and UUID, as the process reported them.
    for g in &gpus {
        let n = name(&tracks[g]);
        assert!(n.contains("NVIDIA H100 80GB HBM3 (GPU-fake0000-0000-0000-0000-00000000000"), "{n}");
    }
    let streams: HashSet<u64> = tracks
        .values()
        .filter(|t| name(t).starts_with("stream ") && t.parent_uuid.is_some_and(|p| gpus.contains(&p)))
        .map(|t| t.uuid.unwrap())
        .collect();
    assert!(!streams.is_empty());
    let threads: HashSet<u64> = tracks
        .values()
        .filter(|t| t.thread.is_some() && t.parent_uuid == Some(process))
        .map(|t| t.uuid.unwrap())
        .collect();
    assert!(!threads.is_empty());

    // Flows: from a host thread to a stream, one per activity whose launch call is recorded.
    assert!(!flow_starts.is_empty());
    assert_eq!(flow_starts.keys().collect::<HashSet<_>>(), flow_ends.keys().collect::<HashSet<_>>());
    for (f, from) in &flow_starts {
        assert!(threads.contains(from), "flow {f} starts off a thread track");
        assert!(streams.contains(&flow_ends[f]), "flow {f} ends off a stream track");
    }
    let linked: u64 = ["kernel", "memcpy", "memset"]
        .iter()
        .map(|t| {
            db.query_row(
                &format!(
                    "SELECT count(*) FROM {t} k WHERE k.session = ?1 AND k.corr != 0 AND EXISTS
                       (SELECT 1 FROM api a WHERE a.session = ?1 AND a.proc = k.proc AND a.corr = k.corr)"
                ),
                [id as i64],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
        })
        .sum();
    assert_eq!(flow_starts.len() as u64, linked);
    agent.finish().unwrap();
}

#[test]
fn json_gz_and_stdout_hold_the_chrome_json_and_unknown_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let (id, agent) = recorded_session(&d, 5_000);
    let id = id.to_string();
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_string();

    export(&d, &[&id, "-o", &path("t.json")]);
    let plain = std::fs::read(path("t.json")).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > 5_000);

    let out = export(&d, &[&id, "-o", &path("t.json.gz"), "--json"]);
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["format"], "chrome-gz");
    let gz = std::fs::read(path("t.json.gz")).unwrap();
    assert!(gz.len() * 3 < plain.len(), "gzip shrinks the JSON ({} vs {})", gz.len(), plain.len());
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice()).read_to_end(&mut unzipped).unwrap();
    serde_json::from_slice::<serde_json::Value>(&unzipped).expect("the gunzipped export is JSON");
    assert!(unzipped == plain, "the gunzipped export is the Chrome JSON");
    // gzip's own level: smaller than the default (fastest) level, the same JSON inside.
    export(&d, &[&id, "-o", &path("t9.json.gz"), "--gzip-level", "9"]);
    let gz9 = std::fs::read(path("t9.json.gz")).unwrap();
    assert!(gz9.len() < gz.len(), "level 9: {} bytes, default: {}", gz9.len(), gz.len());
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(gz9.as_slice()).read_to_end(&mut unzipped).unwrap();
    assert!(unzipped == plain, "the level-9 export is the Chrome JSON");
    // A level out of range, or for a format that is not gzipped: usage errors, nothing written.
    let (p0, p1) = (path("t0.json.gz"), path("t1.json"));
    for (args, says, file) in [
        (["-o", p0.as_str(), "--gzip-level", "0"], "0 is not in 1..=9", "t0.json.gz"),
        (["-o", p1.as_str(), "--gzip-level", "1"], "applies to chrome-gz (.json.gz) only", "t1.json"),
    ] {
        let out = d.ctl(&[&["export", id.as_str()][..], &args[..]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!dir.path().join(file).exists(), "{args:?} wrote a file");
    }

    // `-o -`: the trace on stdout, the summary on stderr.
    let out = export(&d, &[&id, "-o", "-"]);
    assert!(out.stdout == plain, "stdout holds the Chrome JSON");
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrote -"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = export(&d, &[&id, "-o", "-", "--format", "perfetto"]);
    assert!(!Trace::decode(out.stdout.as_slice()).unwrap().packet.is_empty());

    // A full disk under the output, gzipped or not: the export fails and says so.
    for format in ["chrome", "chrome-gz"] {
        let out = std::process::Command::new(gpuprof_testkit::bin_path("gpuprofctl"))
            .arg("--socket")
            .arg(&d.api_socket)
            .args(["export", &id, "-o", "-", "--format", format])
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{format} to /dev/full: {err}");
        assert!(err.contains("No space left on device"), "{format} to /dev/full: {err}");
    }

    // The RPC: EXPORT_FORMAT_CHROME_JSON_GZ is the Chrome JSON gzipped by gpuprofd, its
    // progress the same; a gzip level out of range or for another format is INVALID_ARGUMENT.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        let session_id: u64 = id.parse().unwrap();
        let (mut events, mut last) = (Vec::new(), Vec::new());
        for format in [pb::ExportFormat::ChromeJson, pb::ExportFormat::ChromeJsonGz] {
            let req = pb::ExportTraceRequest { session_id, format: format as i32, ..Default::default() };
            let mut st = c.export_trace(req).await.unwrap().into_inner();
            let (mut data, mut written) = (Vec::new(), 0);
            while let Some(m) = st.message().await.unwrap() {
                data.extend_from_slice(&m.data);
                written = m.events_written;
            }
            events.push(data);
            last.push(written);
        }
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(events[1].as_slice()).read_to_end(&mut unzipped).unwrap();
        assert!(unzipped == plain && events[0] == plain, "the RPC's gzipped Chrome JSON gunzips to the Chrome JSON");
        assert!(events[1].len() * 3 < plain.len(), "{} bytes gzipped, {} plain", events[1].len(), plain.len());
        let slices = v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count() as u64;
        assert_eq!(last[0], slices, "events_written: the trace's slices");
        assert_eq!(last[0], last[1], "events_written of the last chunk, plain and gzipped");
        for (format, level, says) in [
            (pb::ExportFormat::ChromeJsonGz, 10, "10 is not a gzip level: use 1 (fastest) to 9 (smallest)"),
            (pb::ExportFormat::Perfetto, 3, "gzip_level 3 applies to EXPORT_FORMAT_CHROME_JSON_GZ only"),
            (pb::ExportFormat::ChromeJson, 1, "this export is EXPORT_FORMAT_CHROME_JSON"),
        ] {
            let req =
                pb::ExportTraceRequest { session_id, format: format as i32, gzip_level: level, ..Default::default() };
            let e = c.export_trace(req).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{format:?} at {level}: {e:?}");
            assert!(e.message().starts_with("gzip_level: ") && e.message().contains(says), "{}", e.message());
            assert!(!gpuprofctl::format_unknown_to_gpuprofd(&e, format as i32));
        }
        // A format gpuprofd does not know, as one built before EXPORT_FORMAT_CHROME_JSON_GZ
        // answers it: what gpuprofctl falls back on (Chrome JSON, gzipped by the client).
        let e =
            c.export_trace(pb::ExportTraceRequest { session_id, format: 99, ..Default::default() }).await.unwrap_err();
        assert!(gpuprofctl::format_unknown_to_gpuprofd(&e, 99), "{e:?}");
    });

    // A name that says no format: usage error, the formats listed, nothing written.
    let out = d.ctl(&["export", &id, "-o", &path("t.txt")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for ending in [".json", ".json.gz", ".pftrace", ".perfetto-trace", ".sqlite", "--format"] {
        assert!(err.contains(ending), "{ending} not listed: {err}");
    }
    assert!(!dir.path().join("t.txt").exists());
    // --format overrides the name.
    export(&d, &[&id, "-o", &path("t.txt"), "--format", "perfetto"]);
    assert!(!Trace::decode(std::fs::read(path("t.txt")).unwrap().as_slice()).unwrap().packet.is_empty());
    agent.finish().unwrap();
}
