//! Python for the tests that drive gpuprof from Python (the generated client, an OTLP
//! receiver, DuckDB): `$PYTHON` or `python3`, with the packages a test needs importable,
//! installed with pip into the target directory when they are not.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The interpreter and the directory to put on `PYTHONPATH` so that `check` (Python code,
/// e.g. `"import grpc, duckdb"`) runs; when it does not, `packages` are installed with pip into
/// `tmp/<dir>` first. Panics, saying what is missing, when pip cannot make `check` pass.
pub fn with_packages(tmp: &Path, dir: &str, check: &str, packages: &[&str]) -> (String, PathBuf) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let pydeps = tmp.join(dir);
    let importable = |python: &str| {
        Command::new(python).args(["-c", check]).env("PYTHONPATH", &pydeps).output().is_ok_and(|o| o.status.success())
    };
    if !importable(&python) {
        let out = Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--target"])
            .arg(&pydeps)
            .args(packages)
            .output()
            .expect("running pip");
        assert!(
            out.status.success() && importable(&python),
            "{python} needs {} and pip could not install them:\n{}",
            packages.join(", "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (python, pydeps)
}

/// What DuckDB reads back from a Parquet export directory (`tests/python/parquet_check.py`:
/// rows and columns of each file, top kernels, bad times, each file's process/job/rank
/// triples); DuckDB installed into `tmp/pydeps-duckdb` when it is not importable.
pub fn parquet_check(tmp: &Path, dir: &Path) -> serde_json::Value {
    let (python, pydeps) = with_packages(tmp, "pydeps-duckdb", "import duckdb", &["duckdb"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/parquet_check.py");
    let out = Command::new(python).arg(script).arg(dir).env("PYTHONPATH", pydeps).output().expect("running python");
    assert!(out.status.success(), "parquet_check.py: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("parquet_check.py prints JSON")
}
