//! gpuprofctl's client library: connecting to gpuprofd's gRPC API, on its Unix socket
//! ([`connect`]) or remotely over TLS ([`connect_to`] with [`Target::Remote`]).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gpuprof_proto::api::gpuprof_client::GpuprofClient;
use hyper_util::rt::TokioIo;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

pub use gpuprof_proto::api as pb;

/// Whether gpuprofd refused the export `format` (its number) as one it does not know: a
/// gpuprofd built before EXPORT_FORMAT_CHROME_JSON_GZ, for which `gpuprofctl export -o x.json.gz`
/// asks for Chrome JSON and gzips it itself.
pub fn format_unknown_to_gpuprofd(s: &tonic::Status, format: i32) -> bool {
    s.code() == tonic::Code::InvalidArgument
        && s.message().contains(&format!("format: {format} is not an export format"))
}

/// Default API socket of a system-wide gpuprofd.
pub const DEFAULT_API_SOCKET: &str = "/run/gpuprof/api.sock";

/// Largest response message accepted.
const MAX_MESSAGE: usize = 64 << 20;

/// A client for either transport: requests carry the bearer token when one is configured.
pub type Client = GpuprofClient<InterceptedService<Channel, BearerToken>>;

/// Where gpuprofd is and how to prove who we are.
#[derive(Debug, Clone)]
pub enum Target {
    /// The api Unix socket (the daemon identifies us by our uid).
    Socket(PathBuf),
    /// The API on TCP, over TLS.
    Remote(Remote),
}

/// A remote gpuprofd (`[api] tcp_listen` on the server).
#[derive(Debug, Clone, Default)]
pub struct Remote {
    /// `https://HOST:PORT`.
    pub addr: String,
    /// CA certificate (PEM) that signed the server's certificate; None: the system's roots.
    pub ca: Option<PathBuf>,
    /// File holding the bearer token (`api.token_file` on the server).
    pub token_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mTLS (`api.client_ca_file` on the server).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Adds `authorization: Bearer TOKEN` to every request (nothing when there is no token).
#[derive(Debug, Clone, Default)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Connects to gpuprofd's API on a Unix socket.
pub async fn connect(socket: &Path) -> Result<GpuprofClient<Channel>> {
    Ok(GpuprofClient::new(unix_channel(socket).await?).max_decoding_message_size(MAX_MESSAGE))
}

/// Connects to gpuprofd on its Unix socket or remotely.
pub async fn connect_to(target: &Target) -> Result<Client> {
    let (channel, token) = match target {
        Target::Socket(path) => (unix_channel(path).await?, BearerToken::default()),
        Target::Remote(r) => remote_channel(r).await?,
    };
    Ok(GpuprofClient::with_interceptor(channel, token).max_decoding_message_size(MAX_MESSAGE))
}

/// How much of a response stream gpuprofd may send ahead of what the client has read (HTTP/2
/// flow control): enough for an export to go on while the client writes or compresses.
const STREAM_WINDOW: u32 = 8 << 20;

/// A channel to gpuprofd's api Unix socket, for any service it serves (the API, health,
/// reflection).
pub async fn unix_channel(socket: &Path) -> Result<Channel> {
    let path: PathBuf = socket.to_path_buf();
    let display = path.display().to_string();
    // The URI is ignored by the connector; tonic needs a syntactically valid one.
    Endpoint::try_from("http://gpuprofd.local")?
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(STREAM_WINDOW * 2)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| {
            if io_kind(&e) == Some(std::io::ErrorKind::PermissionDenied) {
                anyhow::Error::new(e).context(format!(
                    "permission denied on gpuprofd's socket {display}: it is open to root and the `gpuprof` group; \
                     ask an admin to add you (`sudo usermod -aG gpuprof $USER`, then log in again)"
                ))
            } else {
                anyhow::Error::new(e)
                    .context(format!("cannot connect to gpuprofd at {display} (is it running? use --socket PATH)"))
            }
        })
}

/// The kind of the first I/O error among an error's sources.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = c.source();
    }
    None
}

fn read_file(flag: &str, p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("{flag} {}: cannot read", p.display()))
}

/// A TLS channel to `r.addr` and the token interceptor; the TLS handshake happens here, so
/// certificate problems are reported as connection errors.
async fn remote_channel(r: &Remote) -> Result<(Channel, BearerToken)> {
    let uri: Uri =
        r.addr.parse().with_context(|| format!("--addr {:?} is not a URL like https://HOST:PORT", r.addr))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") => bail!(
            "--addr {}: gpuprofd serves TCP with TLS only; use https://{}",
            r.addr,
            uri.authority().map(|a| a.as_str()).unwrap_or("HOST:PORT")
        ),
        _ => bail!("--addr {:?} is not a URL like https://HOST:PORT", r.addr),
    }
    let mut tls = ClientTlsConfig::new();
    tls = match &r.ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read_file("--ca", ca)?)),
        None => tls.with_native_roots(),
    };
    match (&r.cert, &r.key) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(read_file("--cert", cert)?, read_file("--key", key)?));
        }
        (None, None) => {}
        _ => bail!("--cert and --key go together (a client certificate and its private key, PEM)"),
    }
    let token = match &r.token_file {
        Some(p) => {
            let text = read_file("--token-file", p)?;
            let token = String::from_utf8(text.trim_ascii().to_vec())
                .ok()
                .filter(|t| !t.is_empty())
                .with_context(|| format!("--token-file {}: must hold the token as one line of text", p.display()))?;
            let v: MetadataValue<Ascii> = format!("Bearer {token}").parse().with_context(|| {
                format!("--token-file {}: the token has characters not allowed in a header", p.display())
            })?;
            BearerToken(Some(v))
        }
        None => BearerToken::default(),
    };
    let channel = Endpoint::from(uri)
        .tls_config(tls)
        .with_context(|| format!("TLS settings for {}", r.addr))?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("cannot connect to gpuprofd at {} (TLS; check --addr and --ca)", r.addr))?;
    Ok((channel, token))
}
