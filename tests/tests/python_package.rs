//! The `gpuprof` Python package (python/): its generated protocol code matches the .proto, and,
//! installed with `pip install ./python` into a fresh venv, its `Client` talks to gpuprofd.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{TracedAgent, TracedConfig};

/// The grpcio-tools that made the committed code (its version is in the generated files);
/// another version may generate other text, so the check installs this one.
const GRPCIO_TOOLS: &str = "grpcio-tools==1.85.1";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn generated_python_code_matches_the_proto() {
    let check = format!(
        "import grpc_tools.protoc, importlib.metadata as m; assert m.version('grpcio-tools') == '{}'",
        GRPCIO_TOOLS.trim_start_matches("grpcio-tools==")
    );
    let (python, tools) = gpuprof_testkit::python::with_packages(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "pydeps-generate",
        &check,
        &[GRPCIO_TOOLS],
    );
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(repo().join("python/generate.sh"))
        .arg(out_dir.path())
        .env("PYTHON", &python)
        .env("PYTHONPATH", &tools)
        .output()
        .unwrap();
    assert!(out.status.success(), "generate.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    for f in ["gpuprof_pb2.py", "gpuprof_pb2.pyi", "gpuprof_pb2_grpc.py"] {
        let fresh = std::fs::read(out_dir.path().join("gpuprof/v1").join(f)).unwrap();
        let committed = std::fs::read(repo().join("python/src/gpuprof/v1").join(f)).unwrap();
        assert!(fresh == committed, "python/src/gpuprof/v1/{f} is out of date: run python/generate.sh and commit it");
    }
}

#[test]
#[ignore = "needs GPUPROF_VENV_PYTHON, the python of a fresh venv with `pip install ./python`; \
            .ci/run makes one and runs this with --ignored"]
fn python_package_in_a_fresh_venv_talks_to_gpuprofd() {
    let python = std::env::var("GPUPROF_VENV_PYTHON")
        .expect("GPUPROF_VENV_PYTHON: the python of a venv where `pip install ./python` ran (see .ci/run)");
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let agent = TracedAgent::start(&d.agent_socket, TracedConfig::default()).unwrap();
    // Run from outside the source tree, so `import gpuprof` can only find the installed copy.
    let out = Command::new(&python)
        .arg(repo().join("python/tests/test_client.py"))
        .current_dir(dir.path())
        .env("GPUPROF_API_SOCKET", &d.api_socket)
        .env("GPUPROF_TEST_PROCESS_ID", agent.process_id.to_string())
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the package's test failed:\n{text}\ndaemon log:\n{}", d.log_text());
    assert!(text.contains("Ran 2 tests") && text.contains("OK"), "{text}");
    agent.finish().unwrap();
}
