//! Pod names and namespaces from the kubelet's pod list (`[kubernetes] kubelet_url`).
//!
//! Pod UIDs come from the agents' cgroups ([`crate::cgroup`]); this only names them. The list
//! is fetched when an agent from a pod not seen yet connects, at most once per
//! `refresh_min`, with a timeout; a kubelet that cannot be reached costs a warning and an
//! empty name, never a connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Deserialize;
use tokio::net::TcpStream;

use crate::config::KubernetesConfig;

/// A pod's name and namespace, and its containers' names by container id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    /// Container id (without the runtime's `containerd://` prefix) → container name.
    pub containers: HashMap<String, String>,
}

/// The pods this node's kubelet listed, by UID.
pub struct Pods {
    cfg: KubernetesConfig,
    state: tokio::sync::Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    pods: HashMap<String, PodRef>,
    fetched: Option<Instant>,
}

/// Largest pod list accepted (a node runs at most a few hundred pods).
const MAX_BODY: usize = 64 << 20;

impl Pods {
    pub fn new(cfg: &KubernetesConfig) -> Pods {
        Pods { cfg: cfg.clone(), state: Default::default() }
    }

    /// The pod with this UID, fetching the list again if the UID is new and the last fetch is
    /// older than `refresh_min`. `None` when off, unknown, or the kubelet failed.
    pub async fn lookup(&self, uid: &str) -> Option<PodRef> {
        if self.cfg.kubelet_url.is_empty() {
            return None;
        }
        let mut g = self.state.lock().await;
        if let Some(p) = g.pods.get(uid) {
            return Some(p.clone());
        }
        if g.fetched.is_some_and(|t| t.elapsed() < self.cfg.refresh_min.0) {
            return None;
        }
        g.fetched = Some(Instant::now());
        match tokio::time::timeout(self.cfg.timeout.0, fetch(&self.cfg)).await {
            Ok(Ok(body)) => match parse_pod_list(&body) {
                Ok(pods) => g.pods = pods,
                Err(e) => tracing::warn!(url = %self.cfg.kubelet_url, error = %e, "unreadable kubelet pod list"),
            },
            Ok(Err(e)) => tracing::warn!(url = %self.cfg.kubelet_url, error = format!("{e:#}"), "kubelet pod list"),
            Err(_) => {
                tracing::warn!(url = %self.cfg.kubelet_url, timeout = ?self.cfg.timeout.0, "kubelet pod list timed out")
            }
        }
        g.pods.get(uid).cloned()
    }
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Meta,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    #[serde(default)]
    container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    init_container_statuses: Vec<ContainerStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStatus {
    #[serde(default)]
    name: String,
    /// "containerd://<64 hex>", "cri-o://...", "docker://..."; empty before it started.
    #[serde(default, rename = "containerID")]
    container_id: String,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
}

/// The kubelet's `/pods` answer (a `v1.PodList`), by pod UID.
pub fn parse_pod_list(body: &[u8]) -> Result<HashMap<String, PodRef>> {
    let list: PodList = serde_json::from_slice(body).context("not a PodList")?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| !p.metadata.uid.is_empty())
        .map(|p| {
            let containers = p
                .status
                .container_statuses
                .into_iter()
                .chain(p.status.init_container_statuses)
                .filter_map(|c| {
                    let id = c.container_id.rsplit("://").next().unwrap_or_default().to_ascii_lowercase();
                    (!id.is_empty()).then_some((id, c.name))
                })
                .collect();
            let pod = PodRef { name: p.metadata.name, namespace: p.metadata.namespace, containers };
            (p.metadata.uid.to_ascii_lowercase(), pod)
        })
        .collect())
}

/// GET the pod list (HTTP/1.1, TLS for https://, the bearer token when configured).
async fn fetch(cfg: &KubernetesConfig) -> Result<Bytes> {
    let uri: Uri = cfg.kubelet_url.parse().context("kubernetes.kubelet_url")?;
    let https = uri.scheme_str() == Some("https");
    let host = uri.host().context("kubernetes.kubelet_url has no host")?.trim_matches(['[', ']']).to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let mut req = Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(hyper::header::HOST, uri.authority().map_or(host.as_str(), |a| a.as_str()))
        .header(hyper::header::ACCEPT, "application/json");
    if !cfg.token_file.is_empty() {
        let token = std::fs::read_to_string(&cfg.token_file)
            .with_context(|| format!("reading kubernetes.token_file {}", cfg.token_file))?;
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {}", token.trim()));
    }
    let req = req.body(Empty::<Bytes>::new())?;
    let tcp =
        TcpStream::connect((host.as_str(), port)).await.with_context(|| format!("connecting to {host}:{port}"))?;
    if https {
        let tls = tokio_rustls::TlsConnector::from(Arc::new(tls_config(cfg)?));
        let name = ServerName::try_from(host.clone()).context("kubelet host name")?;
        let stream = tls.connect(name, tcp).await.context("TLS handshake with the kubelet")?;
        get(TokioIo::new(stream), req).await
    } else {
        get(TokioIo::new(tcp), req).await
    }
}

async fn get<I>(io: I, req: Request<Empty<Bytes>>) -> Result<Bytes>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    // The connection is driven here, beside the request: no task outlives the fetch.
    let request = async move {
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the body: {e}"))?
            .to_bytes();
        if !status.is_success() {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]).trim());
        }
        Ok(body)
    };
    let (body, _) = tokio::join!(request, conn);
    body
}

fn tls_config(cfg: &KubernetesConfig) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    if cfg.insecure_skip_tls_verify {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
            .with_no_client_auth());
    }
    let mut roots = rustls::RootCertStore::empty();
    if cfg.ca_file.is_empty() {
        let found = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(found.certs);
    } else {
        for c in CertificateDer::pem_file_iter(&cfg.ca_file)
            .with_context(|| format!("reading kubernetes.ca_file {}", cfg.ca_file))?
        {
            roots.add(c.with_context(|| format!("kubernetes.ca_file {}", cfg.ca_file))?)?;
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `insecure_skip_tls_verify`: any certificate, but the handshake's signatures are still checked.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        msg: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(msg, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        msg: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(msg, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Pod lists served the way a kubelet serves them, to this module's fetch.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::time::Duration;

    const LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
      {"metadata":{"name":"trainer-0","namespace":"ml","uid":"1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c"},"spec":{},
       "status":{"containerStatuses":[{"name":"pytorch","containerID":"containerd://7E2B6C0A4F1D3E5B9A8C7D6E5F4A3B2C1D0E9F8A7B6C5D4E3F2A1B0C9D8E7F6A"},
                                      {"name":"waiting","containerID":""}],
                 "initContainerStatuses":[{"name":"setup","containerID":"cri-o://0123"}]}},
      {"metadata":{"name":"kube-proxy-x","namespace":"kube-system","uid":"6f8e6f7d3b1c4e2a9d0b5c7e8f1a2b3c"}}]}"#;

    fn cfg(url: &str) -> KubernetesConfig {
        let mut c = Config::from_toml("").unwrap().kubernetes;
        c.kubelet_url = url.into();
        c.refresh_min = crate::config::Dur(Duration::from_secs(3600));
        c
    }

    /// One-connection HTTP/1.1 server answering every request with `body` (chunked, like Go's
    /// net/http for a large answer); returns its address and the requests it saw.
    async fn serve(status: &'static str, body: &'static str) -> (String, tokio::sync::mpsc::Receiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned()).await;
                let (a, b) = body.split_at(body.len() / 2);
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                    a.len(),
                    b.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        (addr, rx)
    }

    #[test]
    fn parses_a_pod_list() {
        let m = parse_pod_list(LIST.as_bytes()).unwrap();
        assert_eq!(m.len(), 2);
        let p = &m["1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c"];
        assert_eq!((p.name.as_str(), p.namespace.as_str()), ("trainer-0", "ml"));
        assert_eq!(p.containers.len(), 2, "started containers only: {:?}", p.containers);
        assert_eq!(p.containers["7e2b6c0a4f1d3e5b9a8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a"], "pytorch");
        assert_eq!(p.containers["0123"], "setup");
        assert!(m["6f8e6f7d3b1c4e2a9d0b5c7e8f1a2b3c"].containers.is_empty());
        assert!(parse_pod_list(b"<html>").is_err());
    }

    #[tokio::test]
    async fn names_pods_from_the_kubelet_and_sends_the_token() {
        let (addr, mut seen) = serve("200 OK", LIST).await;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let mut c = cfg(&format!("http://{addr}/pods"));
        c.token_file = token.display().to_string();
        let pods = Pods::new(&c);
        let p = pods.lookup("1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c").await;
        assert_eq!(p.map(|p| (p.name, p.namespace)), Some(("trainer-0".into(), "ml".into())));
        let req = seen.recv().await.unwrap();
        assert!(req.starts_with("GET /pods HTTP/1.1\r\n"), "{req}");
        assert!(req.contains("authorization: Bearer s3cret\r\n"), "{req}");
        // A known pod is answered from the list; an unknown one waits for refresh_min.
        assert_eq!(pods.lookup("6f8e6f7d3b1c4e2a9d0b5c7e8f1a2b3c").await.unwrap().namespace, "kube-system");
        assert_eq!(pods.lookup("00000000-0000-0000-0000-000000000000").await, None);
        assert!(seen.try_recv().is_err(), "no second fetch within refresh_min");
    }

    #[tokio::test]
    async fn a_failing_kubelet_costs_only_the_name() {
        let (addr, _seen) = serve("403 Forbidden", "{\"message\":\"forbidden: nodes/proxy\"}").await;
        let pods = Pods::new(&cfg(&format!("http://{addr}/pods")));
        assert_eq!(pods.lookup("1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c").await, None);
        // Nothing listens: a refused connection, within the timeout.
        let pods = Pods::new(&cfg("http://127.0.0.1:1/pods"));
        assert_eq!(pods.lookup("1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c").await, None);
        // Off: no fetch at all.
        assert_eq!(Pods::new(&cfg("")).lookup("1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c").await, None);
    }

    #[test]
    fn tls_settings() {
        let mut c = cfg("https://127.0.0.1:10250/pods");
        c.insecure_skip_tls_verify = true;
        assert!(tls_config(&c).is_ok());
        c.insecure_skip_tls_verify = false;
        c.ca_file = "/nonexistent/ca.pem".into();
        let e = format!("{:#}", tls_config(&c).unwrap_err());
        assert!(e.contains("kubernetes.ca_file"), "{e}");
    }
}
