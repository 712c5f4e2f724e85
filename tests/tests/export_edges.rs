//! `gpuprofctl export` at its edges: a session without records exports a valid, empty file in
//! every format (a Perfetto trace that trace_processor opens, never 0 bytes; Chrome JSON; a
//! SQLite database; a Parquet file with its columns and no rows); one failure exits with one
//! code whatever the format (no such session 4, no PC samples 6, a path that cannot be
//! written 1); errors name the path the user gave, never the temporary `.part` file.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Output;

use gpuprof_proto::perfetto::{Trace, trace_packet::Data};
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::recorded_session;
use parquet::file::reader::{FileReader, SerializedFileReader};
use prost::Message;

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A session that targets a program never started, stopped: no processes, no records.
fn empty_session(d: &TestDaemon) -> String {
    let out = d.ctl(&["session", "start", "--exe", "never-started", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"].as_u64().unwrap().to_string();
    let out = d.ctl(&["session", "stop", &id]);
    assert!(out.status.success(), "{}", text(&out));
    id
}

fn export(d: &TestDaemon, id: &str, out: &Path, extra: &[&str]) -> Output {
    d.ctl(&[&["export", id, "-o", out.to_str().unwrap()][..], extra].concat())
}

#[test]
fn an_empty_session_exports_valid_empty_files_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let id = empty_session(&d);

    let pftrace = dir.path().join("empty.pftrace");
    let o = export(&d, &id, &pftrace, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let bytes = std::fs::read(&pftrace).unwrap();
    assert!(!bytes.is_empty(), "an empty Perfetto trace is not 0 bytes (trace_processor refuses those)");
    let trace = Trace::decode(bytes.as_slice()).unwrap();
    let names: Vec<_> = trace
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(Data::TrackDescriptor(t)) => t.name.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(names, [format!("gpuprof session {id}: no records")], "{trace:?}");
    assert_eq!(trace.packet[0].sequence_flags, Some(1), "the first packet clears the sequence's state");

    let json = dir.path().join("empty.json");
    let o = export(&d, &id, &json, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(v["traceEvents"].is_array(), "{v}");

    let db = dir.path().join("empty.sqlite");
    let o = export(&d, &id, &db, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let c = rusqlite::Connection::open(&db).unwrap();
    let sessions: i64 = c.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0)).unwrap();
    let kernels: i64 = c.query_row("SELECT count(*) FROM kernel", [], |r| r.get(0)).unwrap();
    assert_eq!((sessions, kernels), (1, 0));

    let pq = dir.path().join("empty-parquet");
    let o = d.ctl(&["--json", "export", &id, "--format", "parquet", "-o", pq.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let said: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(said["files"][0]["file"], "kernel.parquet", "{said}");
    assert_eq!(said["files"][0]["rows"], 0, "{said}");
    let reader = SerializedFileReader::new(std::fs::File::open(pq.join("kernel.parquet")).unwrap()).unwrap();
    let meta = reader.metadata();
    assert_eq!(meta.file_metadata().num_rows(), 0);
    let columns: Vec<_> = meta.file_metadata().schema_descr().columns().iter().map(|c| c.name().to_string()).collect();
    for col in ["host", "name", "start_ns", "duration_ns"] {
        assert!(columns.iter().any(|c| c == col), "{col} in {columns:?}");
    }
    let o = d.ctl(&["export", &id, "--format", "parquet", "-o", pq.to_str().unwrap()]);
    assert!(text(&o).contains("wrote 1 Parquet file to") && text(&o).contains("no rows"), "{}", text(&o));
    assert_eq!(d.terminate().unwrap(), 0);
}

#[test]
fn one_failure_exits_with_one_code_whatever_the_format() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let empty = empty_session(&d);
    let files = ["x.json", "x.json.gz", "x.pftrace", "x.sqlite", "x.pb.gz", "x.svg"];

    // No such session: 4, for every format, Parquet too.
    for f in files {
        let o = export(&d, "987654", &dir.path().join(f), &[]);
        assert_eq!(o.status.code(), Some(4), "{f}: {}", text(&o));
        assert!(text(&o).contains("987654"), "{f}: {}", text(&o));
    }
    let o = export(&d, "987654", &dir.path().join("pq"), &["--format", "parquet"]);
    assert_eq!(o.status.code(), Some(4), "parquet: {}", text(&o));

    // No PC samples: 6, whether gpuprofd (pprof) or gpuprofctl (the flame graph) finds it.
    for f in ["x.pb.gz", "x.svg"] {
        let o = export(&d, &empty, &dir.path().join(f), &[]);
        assert_eq!(o.status.code(), Some(6), "{f}: {}", text(&o));
        assert!(text(&o).contains("no PC samples"), "{f}: {}", text(&o));
    }
    for f in files {
        assert!(!dir.path().join(f).exists(), "{f} written by a failed export");
    }

    // A path that cannot be written: 1, and the error names it, not a temporary file.
    let (id, agent) = recorded_session(&d, 2_000);
    let id = id.to_string();
    let missing = dir.path().join("no-such-dir");
    for f in ["x.json", "x.json.gz", "x.pftrace", "x.sqlite"] {
        let path = missing.join(f);
        let o = export(&d, &id, &path, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{f}: {err}");
        assert!(err.contains(&path.display().to_string()) && !err.contains(".part"), "{f}: {err}");
    }
    let a_file = dir.path().join("a-file");
    std::fs::write(&a_file, "not a directory").unwrap();
    let o = export(&d, &id, &a_file.join("pq"), &["--format", "parquet"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "parquet: {err}");
    assert!(err.contains(&a_file.join("pq").display().to_string()), "parquet: {err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().ends_with(".part")), "{left:?}");
    agent.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0);
}
