//! `gpuprofctl export --format parquet -o DIR`: the files read back with DuckDB's Python
//! package (tests/python/parquet_check.py) hold as many rows per record kind as the daemon
//! stored, one file per kind present; the top kernels by total time computed by DuckDB are
//! gpuprof's own (`gpuprofctl top`); a name filter applies; `-o -` or a file is refused.
//!
//! Needs `python3` with `duckdb`; when it is not importable the test installs it with pip into
//! the target directory first (and fails if that does not work either).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::{PARQUET_KINDS as KINDS, mix_tables};
use std::path::Path;

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{recorded_session, stored_rows};
use serde_json::Value;

/// What DuckDB reads from the export directory.
fn duckdb_read(dir: &Path) -> Value {
    gpuprof_testkit::python::parquet_check(Path::new(env!("CARGO_TARGET_TMPDIR")), dir)
}

/// `gpuprofctl export ... --json` into `dir`: file name → rows, as gpuprofctl reports them.
fn export(d: &TestDaemon, id: u64, dir: &Path, extra: &[&str]) -> Vec<(String, u64)> {
    let out = d.ctl(
        &[&["--json", "export", &id.to_string(), "--format", "parquet", "-o", dir.to_str().unwrap()], extra].concat(),
    );
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "parquet");
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["file"].as_str().unwrap().to_string(), f["rows"].as_u64().unwrap()))
        .collect()
}

/// (name, launches, total ns) of every kernel, longest total first (ties by name).
fn by_total(list: &Value) -> Vec<(String, u64, u64)> {
    let mut v: Vec<(String, u64, u64)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (k["name"].as_str().unwrap().to_string(), k["count"].as_u64().unwrap(), k["total_ns"].as_u64().unwrap())
        })
        .collect();
    v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    v
}

#[test]
fn parquet_files_read_back_with_duckdb_match_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&tmp.path().join("state")).unwrap();
    let (id, _agent) = recorded_session(&d, 30_000);
    let dir = tmp.path().join("out/parquet");
    let files = export(&d, id, &dir, &[]);

    // One file per kind the daemon stored, with its rows (gpuprofctl's count and DuckDB's).
    let c = rusqlite::Connection::open(d.db_path()).unwrap();
    let expected: Vec<(String, u64)> =
        KINDS.iter().map(|k| (format!("{k}.parquet"), stored_rows(&c, k, id))).filter(|(_, n)| *n > 0).collect();
    for kind in mix_tables() {
        assert!(expected.iter().any(|(f, _)| *f == format!("{kind}.parquet")), "the session has no {kind} rows");
    }
    assert_eq!(files, expected, "gpuprofctl's files and rows");
    let read = duckdb_read(&dir);
    for (file, n) in &expected {
        let kind = file.trim_end_matches(".parquet");
        assert_eq!(read["rows"][kind].as_u64(), Some(*n), "{kind}: rows DuckDB reads");
    }
    assert_eq!(read["rows"].as_object().unwrap().len(), expected.len(), "{}", read["rows"]);
    assert_eq!(read["kernel_bad_times"], 0, "end_ns - start_ns = duration_ns");
    let kernel_cols: Vec<&str> =
        read["columns"]["kernel"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    for col in
        ["session_id", "process_id", "pid", "device_id", "stream_id", "start_ns", "end_ns", "name", "mangled_name"]
    {
        assert!(kernel_cols.contains(&col), "kernel.parquet has no {col}: {kernel_cols:?}");
    }

    // DuckDB's top kernels are gpuprof's.
    let out = d.ctl(&["--json", "top", &id.to_string(), "--top", "1000"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let top: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = by_total(&top["top_kernels"]);
    assert!(ours.len() > 1, "{top}");
    assert_eq!(by_total(&read["top_kernels"]), ours, "top kernels by total time");
    assert_eq!(ours.iter().map(|k| k.1).sum::<u64>(), stored_rows(&c, "kernel", id));

    // A name filter applies to the kernels (and to nothing without names).
    let gemm = tmp.path().join("gemm");
    let files = export(&d, id, &gemm, &["--name", "*gemm*"]);
    let want: u64 = ours.iter().filter(|k| k.0.contains("gemm")).map(|k| k.1).sum();
    assert!(want > 0);
    assert_eq!(files.iter().find(|f| f.0 == "kernel.parquet").map(|f| f.1), Some(want), "{files:?}");
    let read = duckdb_read(&gemm);
    assert!(read["top_kernels"].as_array().unwrap().iter().all(|k| k["name"].as_str().unwrap().contains("gemm")));
}

#[test]
fn parquet_needs_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&tmp.path().join("state")).unwrap();
    let out = d.ctl(&["export", "1", "--format", "parquet", "-o", "-"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("directory"), "{err}");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = d.ctl(&["export", "1", "--format", "parquet", "-o", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("directory"));
    assert_eq!(std::fs::read(&file).unwrap(), b"x", "the file is left alone");
}
