//! The API on TCP against the real daemon and CLI: TLS only, and every call needs the node's
//! bearer token or a client certificate signed by the configured client CA. Certificates are
//! made in the test (rcgen), so nothing outside the workspace is needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::Result;
use gpuprof_testkit::{TestDaemon, bin_path};
use gpuprofctl::pb;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

const TOKEN: &str = "0f3c9a7e51d24b6c8e2a9d4f7b1c6e3a";

/// A throwaway PKI in a directory: a CA with a server certificate (localhost, 127.0.0.1) and
/// a client certificate, a second CA with its own client certificate, and token files.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Result<Pki> {
        let pki = Pki { dir: dir.to_path_buf() };
        let (ca_pem, ca) = make_ca("gpuprof test CA")?;
        pki.write("ca.pem", &ca_pem)?;
        pki.write_leaf(
            "server",
            &ca,
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        pki.write_leaf("client", &ca, vec!["operator".into()], ExtendedKeyUsagePurpose::ClientAuth)?;
        let (other_pem, other) = make_ca("some other CA")?;
        pki.write("other-ca.pem", &other_pem)?;
        pki.write_leaf("stranger", &other, vec!["stranger".into()], ExtendedKeyUsagePurpose::ClientAuth)?;
        pki.write("token", &format!("{TOKEN}\n"))?;
        pki.write("wrong-token", "not-the-token-of-this-node\n")?;
        Ok(pki)
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// `--cert NAME.pem --key NAME.key`.
    fn cert(&self, name: &str) -> Vec<String> {
        vec!["--cert".into(), self.path(&format!("{name}.pem")), "--key".into(), self.path(&format!("{name}.key"))]
    }

    fn write(&self, name: &str, text: &str) -> Result<()> {
        std::fs::write(self.dir.join(name), text)?;
        Ok(())
    }

    fn write_leaf(
        &self,
        name: &str,
        ca: &Issuer<'_, KeyPair>,
        names: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<()> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, ca)?;
        self.write(&format!("{name}.pem"), &cert.pem())?;
        self.write(&format!("{name}.key"), &key.serialize_pem())
    }
}

fn make_ca(cn: &str) -> Result<(String, Issuer<'static, KeyPair>)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

/// A port free right now on 127.0.0.1.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Writes a config with `api` as its `[api]` section (no samplers) and returns its path.
fn config(dir: &Path, api: &str) -> Result<PathBuf> {
    let p = dir.join("gpuprofd.toml");
    std::fs::write(&p, format!("[sampler]\nenabled = false\n[api]\n{api}"))?;
    Ok(p)
}

/// A daemon serving TCP on a free port with the server certificate and `auth` (more `[api]`
/// keys); returns it and its https address.
fn start_tcp(dir: &Path, pki: &Pki, auth: &str) -> Result<(TestDaemon, String)> {
    let port = free_port()?;
    let cfg = config(
        dir,
        &format!(
            "tcp_listen = \"127.0.0.1:{port}\"\ntls_cert_file = {:?}\ntls_key_file = {:?}\n{auth}",
            pki.path("server.pem"),
            pki.path("server.key")
        ),
    )?;
    let d = TestDaemon::start_with(&dir.join("state"), &["--config", &cfg.display().to_string()])?;
    Ok((d, format!("https://127.0.0.1:{port}")))
}

/// `gpuprofctl ARGS` with no remote settings from the environment.
fn ctl(args: &[&str]) -> Output {
    Command::new(bin_path("gpuprofctl"))
        .args(args)
        .env_remove("GPUPROF_ADDR")
        .env_remove("GPUPROF_CA_FILE")
        .env_remove("GPUPROF_TOKEN_FILE")
        .env_remove("GPUPROF_CERT_FILE")
        .env_remove("GPUPROF_KEY_FILE")
        // Without a daemon there: a remote call must not fall back to the socket.
        .env("GPUPROF_API_SOCKET", "/nonexistent/api.sock")
        .output()
        .expect("running gpuprofctl")
}

/// `gpuprofctl --addr ADDR --ca CA AUTH... CMD...`.
fn remote(addr: &str, ca: &str, auth: &[String], cmd: &[&str]) -> Output {
    let mut args = vec!["--addr", addr, "--ca", ca];
    args.extend(auth.iter().map(String::as_str));
    args.extend_from_slice(cmd);
    ctl(&args)
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn assert_ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: gpuprofctl failed ({}): {}", o.status, text(o));
}

fn assert_refused(o: &Output, code: i32, needles: &[&str], what: &str) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(code), "{what}: want exit {code}, got {}: {t}", o.status);
    for n in needles {
        assert!(t.contains(n), "{what}: {n:?} not in: {t}");
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

#[test]
fn token_over_tls_works_and_everything_else_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    let (d, addr) = start_tcp(dir.path(), &pki, &format!("token_file = {:?}\n", pki.path("token")))?;
    let (ca, token) = (pki.path("ca.pem"), pki.path("token"));

    // The right token over TLS.
    let o = ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &token, "status", "--json"]);
    assert_ok(&o, "status with the token");
    let s: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    // By name too (the certificate covers localhost).
    let by_name = addr.replace("127.0.0.1", "localhost");
    assert_ok(&ctl(&["--addr", &by_name, "--ca", &ca, "--token-file", &token, "status"]), "status via localhost");

    // An authenticated TCP caller is an admin of the node, acting as root: its sessions
    // belong to uid 0 and it may pause GPUs (checked by the operator rule before anything).
    let o = ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &token, "--json", "session", "start", "--all"]);
    assert_ok(&o, "session start");
    let sess: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let id = sess["id"].as_u64().expect("session id").to_string();
    let o = ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &token, "--json", "session", "show", &id]);
    assert_ok(&o, "session show");
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"owner_uid\": 0"), "{}", text(&o));
    assert_ok(&ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &token, "session", "stop", &id]), "session stop");
    // The local socket still works as before.
    let local = d.ctl(&["status"]);
    assert!(local.status.success(), "{}", text(&local));

    // A wrong token and no token: UNAUTHENTICATED (exit 5) with what is needed.
    let o = ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &pki.path("wrong-token"), "status"]);
    assert_refused(&o, 5, &["not this node's token", "--token-file"], "wrong token");
    let o = ctl(&["--addr", &addr, "--ca", &ca, "status"]);
    assert_refused(&o, 5, &["needs the node's bearer token", "--token-file"], "no token");
    let o =
        ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &pki.path("wrong-token"), "profile", "--pause", "--all"]);
    assert_refused(&o, 5, &["not this node's token"], "pause with a wrong token");

    // The same through the library, checking the gRPC code itself.
    let remote = |token_file: Option<String>| gpuprofctl::Remote {
        addr: addr.clone(),
        ca: Some(ca.clone().into()),
        token_file: token_file.map(PathBuf::from),
        ..Default::default()
    };
    rt().block_on(async {
        let mut c = gpuprofctl::connect_to(&gpuprofctl::Target::Remote(remote(None))).await?;
        let e = c.get_status(pb::GetStatusRequest {}).await.expect_err("no token must be refused");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
        let e = c.list_sessions(pb::ListSessionsRequest::default()).await.expect_err("no token");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
        let mut c = gpuprofctl::connect_to(&gpuprofctl::Target::Remote(remote(Some(pki.path("token"))))).await?;
        let r = c.list_sessions(pb::ListSessionsRequest::default()).await?.into_inner();
        assert_eq!(r.sessions.len(), 1, "an admin sees every session");
        anyhow::Ok(())
    })?;

    // A server certificate from a CA the client does not trust: no connection (exit 3).
    let o = ctl(&["--addr", &addr, "--ca", &pki.path("other-ca.pem"), "--token-file", &token, "status"]);
    assert_refused(&o, 3, &["cannot connect"], "untrusted server certificate");

    // Plain text: the CLI refuses to send anything, and the server does not speak it.
    let plain = addr.replace("https://", "http://");
    let o = ctl(&["--addr", &plain, "--token-file", &token, "status"]);
    assert_refused(&o, 1, &["TLS only"], "http:// address");
    rt().block_on(async {
        let plaintext = async {
            let ch = tonic::transport::Endpoint::from_shared(plain.clone())?
                .connect_timeout(std::time::Duration::from_secs(5))
                .connect()
                .await?;
            let mut c = pb::gpuprof_client::GpuprofClient::new(ch);
            let mut req = tonic::Request::new(pb::GetStatusRequest {});
            req.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse()?);
            c.get_status(req).await?;
            anyhow::Ok(())
        };
        let r = tokio::time::timeout(std::time::Duration::from_secs(20), plaintext).await;
        assert!(!matches!(r, Ok(Ok(()))), "a plain-text call succeeded");
    });

    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn client_certificate_works_and_a_client_without_one_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    let (d, addr) = start_tcp(dir.path(), &pki, &format!("client_ca_file = {:?}\n", pki.path("ca.pem")))?;
    let ca = pki.path("ca.pem");

    let o = remote(&addr, &ca, &pki.cert("client"), &["status"]);
    assert_ok(&o, "status with a client certificate");
    let o = remote(&addr, &ca, &pki.cert("client"), &["--json", "session", "list"]);
    assert_ok(&o, "session list with a client certificate");

    // No certificate: every call is refused with UNAUTHENTICATED, saying what is needed; a
    // token does not help when only certificates are configured.
    let o = ctl(&["--addr", &addr, "--ca", &ca, "status"]);
    assert_refused(&o, 5, &["client certificate", "--cert"], "no client certificate");
    let o = ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &pki.path("token"), "status"]);
    assert_refused(&o, 5, &["does not accept tokens", "--cert"], "token without a certificate");
    // A certificate from another CA.
    let o = remote(&addr, &ca, &pki.cert("stranger"), &["status"]);
    assert!(!o.status.success(), "certificate of another CA: {}", text(&o));
    assert!(text(&o).contains("api.client_ca_file"), "{}", text(&o));
    // --cert without --key is a usage error.
    let o = ctl(&["--addr", &addr, "--ca", &ca, "--cert", &pki.path("client.pem"), "status"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn with_token_and_client_ca_either_one_is_enough() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    let auth = format!("client_ca_file = {:?}\ntoken_file = {:?}\n", pki.path("ca.pem"), pki.path("token"));
    let (d, addr) = start_tcp(dir.path(), &pki, &auth)?;
    let ca = pki.path("ca.pem");

    assert_ok(&remote(&addr, &ca, &pki.cert("client"), &["status"]), "certificate only");
    assert_ok(&ctl(&["--addr", &addr, "--ca", &ca, "--token-file", &pki.path("token"), "status"]), "token only");
    let o = ctl(&["--addr", &addr, "--ca", &ca, "status"]);
    assert_refused(&o, 5, &["--token-file", "--cert"], "neither");
    // A presented certificate is still verified.
    let token_and_stranger = [vec!["--token-file".into(), pki.path("token")], pki.cert("stranger")].concat();
    let o = remote(&addr, &ca, &token_and_stranger, &["status"]);
    assert!(!o.status.success(), "certificate of another CA: {}", text(&o));

    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn check_config_and_start_refuse_tcp_without_tls_and_authentication() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    let check = |api: &str| -> Result<Output> {
        let cfg = config(dir.path(), api)?;
        Ok(Command::new(bin_path("gpuprofd")).arg("check-config").arg(&cfg).output()?)
    };
    let refused = |api: &str, needles: &[&str]| -> Result<()> {
        let o = check(api)?;
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{api}: {t}");
        for n in needles {
            assert!(t.contains(n), "{api}: {n:?} not in: {t}");
        }
        Ok(())
    };
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let tcp = "tcp_listen = \"127.0.0.1:7461\"\n";

    refused(tcp, &["api.tls_cert_file", "api.tls_key_file", "TLS"])?;
    refused(&format!("{tcp}tls_cert_file = {cert:?}\n"), &["api.tls_key_file"])?;
    let tls = format!("{tcp}tls_cert_file = {cert:?}\ntls_key_file = {key:?}\n");
    refused(&tls, &["api.token_file", "api.client_ca_file"])?;
    // Unreadable files are named with their key and path.
    let missing = dir.path().join("missing.pem").display().to_string();
    refused(&format!("{tls}token_file = {missing:?}\n"), &["api.token_file", &missing])?;
    refused(
        &format!("{tcp}tls_cert_file = {missing:?}\ntls_key_file = {key:?}\ntoken_file = {:?}\n", pki.path("token")),
        &["api.tls_cert_file", &missing],
    )?;
    // Files that are readable but unusable.
    refused(
        &format!(
            "{tcp}tls_cert_file = {:?}\ntls_key_file = {key:?}\ntoken_file = {:?}\n",
            pki.path("token"),
            pki.path("token")
        ),
        &["api.tls_cert_file", "PEM"],
    )?;
    pki.write("short-token", "abc\n")?;
    refused(&format!("{tls}token_file = {:?}\n", pki.path("short-token")), &["api.token_file", "16"])?;
    refused(&format!("{tls}client_ca_file = {:?}\n", pki.path("token")), &["api.client_ca_file"])?;

    // Complete settings pass.
    let o = check(&format!("{tls}token_file = {:?}\n", pki.path("token")))?;
    assert!(o.status.success(), "{}", text(&o));
    let o = check(&format!("{tls}client_ca_file = {:?}\n", pki.path("ca.pem")))?;
    assert!(o.status.success(), "{}", text(&o));

    // The daemon refuses to start with the same error.
    let cfg = config(dir.path(), &tls)?;
    let e = TestDaemon::start_with(&dir.path().join("state"), &["--config", &cfg.display().to_string()])
        .err()
        .expect("gpuprofd started with TCP but no authentication");
    assert!(format!("{e:#}").contains("api.token_file"), "{e:#}");
    Ok(())
}

/// A request carrying the node's bearer token.
fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().expect("a header value"));
    req
}

#[test]
fn health_and_reflection_on_tcp_need_the_token() -> Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
    use tonic_reflection::pb::v1;
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    let (d, addr) = start_tcp(dir.path(), &pki, &format!("token_file = {:?}\n", pki.path("token")))?;
    rt().block_on(async {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(pki.path("ca.pem"))?));
        let ch = tonic::transport::Endpoint::from_shared(addr.clone())?.tls_config(tls)?.connect().await?;

        let mut health = HealthClient::new(ch.clone());
        let e = health.check(HealthCheckRequest { service: String::new() }).await.expect_err("no token");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
        let r = health.check(authed(HealthCheckRequest { service: "gpuprof.v1.Gpuprof".into() })).await?.into_inner();
        assert_eq!(r.status(), ServingStatus::Serving);

        let list = || v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(String::new())),
        };
        let mut reflection = v1::server_reflection_client::ServerReflectionClient::new(ch);
        let e = reflection.server_reflection_info(tokio_stream::iter([list()])).await.expect_err("no token");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
        let answer = reflection
            .server_reflection_info(authed(tokio_stream::iter([list()])))
            .await?
            .into_inner()
            .message()
            .await?;
        let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
            answer.and_then(|a| a.message_response)
        else {
            anyhow::bail!("list_services answered with something else");
        };
        let names: Vec<String> = l.service.into_iter().map(|s| s.name).collect();
        assert!(
            names.contains(&"gpuprof.v1.Gpuprof".into()) && names.contains(&"grpc.health.v1.Health".into()),
            "{names:?}"
        );
        anyhow::Ok(())
    })?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
