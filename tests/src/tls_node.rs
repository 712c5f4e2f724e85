//! gpuprofd as a remote node in tests: TLS and a bearer token on a TCP port of 127.0.0.1, as
//! `gpuprofctl --host` reaches other nodes.

use std::path::Path;

use anyhow::Result;

use crate::TestDaemon;

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Writes the server certificate and key (for 127.0.0.1 and localhost) and the token the nodes
/// share into `dir` (`server.pem`, `server.key`, `token`).
pub fn write_tls_and_token(dir: &Path) -> Result<()> {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
    std::fs::write(dir.join("server.pem"), cert.cert.pem())?;
    std::fs::write(dir.join("server.key"), cert.signing_key.serialize_pem())?;
    std::fs::write(dir.join("token"), "5b0e1c9a7d3f42e8a6c1b9d0e7f3a2c4\n")?;
    Ok(())
}

/// A gpuprofd named `name` (its state in `dir/name`) serving the API on `127.0.0.1:port` with the
/// certificate, key and token [`write_tls_and_token`] wrote into `dir`.
pub fn start_node(dir: &Path, name: &str, port: u16) -> Result<TestDaemon> {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[sampler]\nspawn = false\n[api]\ntcp_listen = \"127.0.0.1:{port}\"\ntls_cert_file = \"{0}/server.pem\"\n\
             tls_key_file = \"{0}/server.key\"\ntoken_file = \"{0}/token\"\n",
            dir.display()
        ),
    )?;
    TestDaemon::start_with(&dir.join(name), &["--config", &cfg.to_string_lossy()])
}
