//! The Python client (client/python), generated in the test from the repository's .proto
//! with grpcio-tools, starts, lists and stops a session against a running gpuprofd; stock
//! grpcio channels with no options call the API, the health service and server reflection
//! over the socket.
//!
//! Needs `python3` with `grpcio`, `grpcio-tools`, `grpcio-health-checking` and
//! `grpcio-reflection`; when they are not importable the test installs them with pip into the
//! target directory first (and fails if it cannot).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{TracedAgent, TracedConfig};

#[test]
fn python_client_starts_lists_and_stops_a_session() {
    let (python, pydeps) = gpuprof_testkit::python::with_packages(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "pydeps",
        "import grpc, grpc_tools, grpc_health.v1, grpc_reflection.v1alpha",
        &["grpcio", "grpcio-tools", "grpcio-health-checking", "grpcio-reflection", "protobuf"],
    );
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let agent = TracedAgent::start(&d.agent_socket, TracedConfig::default()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../client/python/tests/test_sessions.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("GPUPROF_API_SOCKET", &d.api_socket)
        .env("GPUPROF_TEST_PROCESS_ID", agent.process_id.to_string())
        .env("GPUPROF_GEN_DIR", dir.path().join("gen"))
        .env("PYTHONPATH", &pydeps)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "python client test failed:\n{text}\ndaemon log:\n{}", d.log_text());
    assert!(text.contains("Ran 4 tests") && text.contains("OK"), "{text}");
    agent.finish().unwrap();
}
