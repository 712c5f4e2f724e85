//! The gRPC API (`gpuprof.v1`) on the api Unix socket, and on TCP when configured.
//!
//! TCP is served with TLS only (`api.tls_cert_file`, `api.tls_key_file`), and every call on
//! it must carry the node's bearer token or come over a connection with a client certificate
//! signed by `api.client_ca_file`; [`crate::access::TcpAuth`] checks that before any handler.
//!
//! Both listeners also serve the standard health service (`grpc.health.v1`) and server
//! reflection (`grpc.reflection.v1` and `v1alpha`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use anyhow::{Context, Result};
use gpuprof_proto::api::{self as pb, gpuprof_server::Gpuprof, gpuprof_server::GpuprofServer};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status};

use crate::Daemon;
use crate::access::TcpAuth;
use crate::catalog::Kind;
use crate::config::ApiConfig;
use crate::uds_authority::UdsConn;

/// How long in-flight calls may run on after shutdown begins before their connections are cut.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A TLS handshake on the TCP API that takes longer is abandoned.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Shortest bearer token accepted in `api.token_file`.
const MIN_TOKEN_LEN: usize = 16;

/// TLS and authentication of the API on TCP, loaded and checked from `[api]`.
#[derive(Debug, Clone)]
pub struct TcpSecurity {
    pub tls: ServerTlsConfig,
    pub auth: TcpAuth,
}

impl TcpSecurity {
    /// Reads and checks the certificate, key, client CA and token named in `[api]` (None when
    /// `tcp_listen` is empty). Every error names the key and the file.
    pub fn load(api: &ApiConfig) -> Result<Option<TcpSecurity>> {
        if api.tcp_listen.is_empty() {
            return Ok(None);
        }
        let is_set = |p: &Path| !p.as_os_str().is_empty();
        let read =
            |key: &str, p: &Path| std::fs::read(p).with_context(|| format!("api.{key}: cannot read {}", p.display()));
        let cert = read("tls_cert_file", &api.tls_cert_file)?;
        let key = read("tls_key_file", &api.tls_key_file)?;
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key)).timeout(TLS_HANDSHAKE_TIMEOUT);
        tonic::transport::Server::builder().tls_config(tls.clone()).map_err(|e| {
            anyhow::Error::new(e).context(format!(
                "api.tls_cert_file {} and api.tls_key_file {} must be a PEM certificate chain and its PEM private key",
                api.tls_cert_file.display(),
                api.tls_key_file.display()
            ))
        })?;
        let token = read_token(api)?;
        let client_certs = is_set(&api.client_ca_file);
        if client_certs {
            let ca = read("client_ca_file", &api.client_ca_file)?;
            // A certificate that is presented must chain to the CA or the handshake fails. One
            // that is missing does not fail the handshake: TcpAuth then refuses each call with
            // UNAUTHENTICATED and says what is needed (or admits it by its token).
            tls = tls.client_ca_root(Certificate::from_pem(ca)).client_auth_optional(true);
            tonic::transport::Server::builder().tls_config(tls.clone()).map_err(|e| {
                anyhow::Error::new(e).context(format!(
                    "api.client_ca_file {} must hold a PEM CA certificate",
                    api.client_ca_file.display()
                ))
            })?;
        }
        Ok(Some(TcpSecurity { tls, auth: TcpAuth::new(token, client_certs) }))
    }
}

/// The bearer token in `api.token_file` (None when unset), checked: read at start and again on
/// SIGHUP.
pub fn read_token(api: &ApiConfig) -> Result<Option<Vec<u8>>> {
    if api.token_file.as_os_str().is_empty() {
        return Ok(None);
    }
    let text = std::fs::read(&api.token_file)
        .with_context(|| format!("api.token_file: cannot read {}", api.token_file.display()))?;
    let token = text.trim_ascii().to_vec();
    if token.len() < MIN_TOKEN_LEN || token.iter().any(|b| !b.is_ascii_graphic()) {
        anyhow::bail!(
            "api.token_file {}: the token must be at least {MIN_TOKEN_LEN} printable characters \
             without spaces (e.g. from `openssl rand -hex 32`)",
            api.token_file.display()
        );
    }
    warn_if_readable_by_others(&api.token_file);
    Ok(Some(token))
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(path = %path.display(), "api.token_file is readable by group or others; chmod 600 it");
    }
}

/// The API's TCP listener and its security, bound before the daemon reports ready.
#[derive(Debug)]
pub struct TcpApi {
    pub listener: TcpListener,
    pub security: TcpSecurity,
}

/// Loads the TCP security settings and binds `api.tcp_listen` (None when it is empty).
pub async fn bind_tcp(api: &ApiConfig) -> Result<Option<TcpApi>> {
    let Some(security) = TcpSecurity::load(api)? else {
        return Ok(None);
    };
    let addr: std::net::SocketAddr =
        api.tcp_listen.parse().with_context(|| format!("api.tcp_listen: {:?} is not an address", api.tcp_listen))?;
    let listener = TcpListener::bind(addr).await.with_context(|| format!("api.tcp_listen: cannot listen on {addr}"))?;
    tracing::info!(
        addr = %listener.local_addr().unwrap_or(addr),
        token = !api.token_file.as_os_str().is_empty(),
        client_certificates = !api.client_ca_file.as_os_str().is_empty(),
        "serving the API on TCP with TLS; authenticated callers are admins"
    );
    Ok(Some(TcpApi { listener, security }))
}

/// Serves the API until `shutdown` fires, then lets in-flight calls finish for at most
/// [`SHUTDOWN_GRACE`] (a client that stops reading must not hold the daemon up).
pub async fn serve(
    listener: UnixListener,
    tcp: Option<TcpApi>,
    d: Arc<Daemon>,
    shutdown: CancellationToken,
) -> Result<()> {
    let grace = {
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    tokio::select! {
        r = serve_until(listener, tcp, d, shutdown) => r,
        _ = grace => {
            tracing::warn!("API connections still open {SHUTDOWN_GRACE:?} after shutdown began; closing them");
            Ok(())
        }
    }
}

async fn serve_until(
    listener: UnixListener,
    tcp: Option<TcpApi>,
    d: Arc<Daemon>,
    shutdown: CancellationToken,
) -> Result<()> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<GpuprofServer<Api>>().await;
    let svc = GpuprofServer::new(Api { d: d.clone() });
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    // Each socket connection is read through UdsConn, which stands in `localhost` for the socket
    // path that gRPC C-core clients send as :authority (see uds_authority).
    let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(UdsConn::new));
    let uds = tonic::transport::Server::builder()
        .add_service(health_service.clone())
        .add_service(reflection_v1.clone())
        .add_service(reflection_v1alpha.clone())
        .add_service(svc.clone())
        .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
    match tcp {
        None => uds.await?,
        Some(TcpApi { listener, security }) => {
            // Every service on TCP, health and reflection included, sits behind the
            // authentication check.
            let tcp = tonic::transport::Server::builder()
                .tls_config(security.tls)?
                .layer(tonic::service::InterceptorLayer::new(security.auth))
                .add_service(health_service)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha)
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown.cancelled_owned(),
                );
            tokio::try_join!(uds, tcp)?;
        }
    }
    Ok(())
}

/// Server reflection (`grpc.reflection.v1` and the older `v1alpha` that many tools still ask
/// for): `grpcurl`, `grpcui`, Postman and the like list and call the API without the `.proto`.
fn reflection() -> Result<(
    tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    tonic_reflection::server::v1alpha::ServerReflectionServer<impl tonic_reflection::server::v1alpha::ServerReflection>,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((
        builder().build_v1().context("server reflection (v1)")?,
        builder().build_v1alpha().context("server reflection (v1alpha)")?,
    ))
}

/// The service implementation.
pub struct Api {
    pub d: Arc<Daemon>,
}

impl Api {
    /// Who is calling (SO_PEERCRED of the api socket connection, or an authenticated TCP caller).
    fn caller<T>(&self, req: &Request<T>) -> crate::access::Caller {
        crate::access::Caller::of(req, &self.d.config.api.admin_group)
    }

    /// GPU commands fail at once, with the reason, where there is no GPU to act on.
    fn gpu_precondition(&self) -> Result<(), Status> {
        match self.d.no_gpu_reason() {
            Some(why) if self.d.arbiter.devices().is_empty() => {
                Err(crate::error::ApiError::FailedPrecondition(format!("this gpuprofd manages no GPU: {why}")).into())
            }
            _ => Ok(()),
        }
    }
}

/// The session a side of a diff reads (0: none).
fn side_session(s: &Option<pb::DiffSide>) -> u64 {
    s.as_ref().map_or(0, |s| s.session_id)
}

type Stream<T> = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Gpuprof for Api {
    async fn get_status(&self, _: Request<pb::GetStatusRequest>) -> Result<Response<pb::GetStatusResponse>, Status> {
        let s = &self.d.stats;
        let records = Kind::ALL
            .iter()
            .map(|k| {
                let c = s.kind(*k);
                pb::RecordKindCount {
                    kind: k.name().to_string(),
                    ingested: c.ingested.load(Relaxed),
                    dropped: c.dropped_by_agents.load(Relaxed) + c.dropped_by_daemon.load(Relaxed),
                }
            })
            .collect();
        Ok(Response::new(pb::GetStatusResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_seconds: s.started.elapsed().as_secs(),
            connected_agents: s.connected_agents.load(Relaxed) as u32,
            records,
            database_bytes: crate::store::database_bytes(&self.d.db_path),
            database_path: self.d.db_path.display().to_string(),
            ingest_queue_depth: s.queued_records.load(Relaxed),
            gpu_count: self.d.gpus.summary(&self.d.arbiter).0,
            gpu_note: self.d.gpus.summary(&self.d.arbiter).1,
            protocol_errors: s.protocol_errors.load(Relaxed),
            active_sessions: self.d.sessions.open_count() as u32,
            storage_error: s.storage_error(),
            expired_sessions: s.expired_sessions.load(Relaxed),
            expired_records: s.expired_records.load(Relaxed),
            cupti_dropped: s.cupti_dropped.load(Relaxed),
            now_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        }))
    }

    async fn list_devices(
        &self,
        _: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        Ok(Response::new(
            crate::query::list_devices(&self.d.db_path, &self.d.nvml, &self.d.gpus, &self.d.arbiter).await?,
        ))
    }

    async fn list_processes(
        &self,
        req: Request<pb::ListProcessesRequest>,
    ) -> Result<Response<pb::ListProcessesResponse>, Status> {
        let caller = self.caller(&req);
        Ok(Response::new(
            crate::query::list_processes(&self.d.db_path, &self.d.registry, &caller, req.into_inner()).await?,
        ))
    }

    async fn start_session(&self, req: Request<pb::StartSessionRequest>) -> Result<Response<pb::Session>, Status> {
        let caller = self.caller(&req);
        Ok(Response::new(crate::sessions::start(self.d.session_api(), &caller, req.into_inner()).await?))
    }

    async fn stop_session(&self, req: Request<pb::StopSessionRequest>) -> Result<Response<pb::Session>, Status> {
        let caller = self.caller(&req);
        Ok(Response::new(crate::sessions::stop(self.d.session_api(), &caller, req.into_inner().session_id).await?))
    }

    async fn get_session(&self, req: Request<pb::GetSessionRequest>) -> Result<Response<pb::Session>, Status> {
        let caller = self.caller(&req);
        Ok(Response::new(crate::sessions::get(self.d.session_api(), &caller, req.into_inner().session_id).await?))
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let caller = self.caller(&req);
        Ok(Response::new(crate::sessions::list(self.d.session_api(), &caller, req.into_inner()).await?))
    }

    type QueryRecordsStream = Stream<pb::QueryRecordsResponse>;
    async fn query_records(
        &self,
        req: Request<pb::QueryRecordsRequest>,
    ) -> Result<Response<Self::QueryRecordsStream>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        let rx = crate::query::query_records(self.d.reads(req.session_id), &caller, req).await?;
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn get_summary(
        &self,
        req: Request<pb::GetSummaryRequest>,
    ) -> Result<Response<pb::GetSummaryResponse>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        Ok(Response::new(crate::query::get_summary(self.d.reads(req.session_id), &caller, req).await?))
    }

    async fn get_job_summary(
        &self,
        req: Request<pb::GetJobSummaryRequest>,
    ) -> Result<Response<pb::JobSummary>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        Ok(Response::new(crate::query::get_job_summary(self.d.reads(req.session_id), &caller, req).await?))
    }

    type ExportTraceStream = Stream<pb::ExportTraceResponse>;
    async fn export_trace(
        &self,
        req: Request<pb::ExportTraceRequest>,
    ) -> Result<Response<Self::ExportTraceStream>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        let rx = crate::export::export(self.d.reads(req.session_id), &caller, req).await?;
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type StreamPmSamplesStream = Stream<pb::StreamPmSamplesResponse>;
    async fn stream_pm_samples(
        &self,
        req: Request<pb::StreamPmSamplesRequest>,
    ) -> Result<Response<Self::StreamPmSamplesStream>, Status> {
        if req.get_ref().cupti_rate_hz > 0 {
            // CUPTI PM sampling takes the GPU's performance monitor from everyone else.
            crate::access::require_operator(&self.caller(&req), "start CUPTI PM sampling")?;
        }
        let s = crate::pmstream::subscribe(self.d.pm_streams(), req.into_inner())?;
        Ok(Response::new(Box::pin(s)))
    }

    type StreamPcSamplesStream = Stream<pb::StreamPcSamplesResponse>;
    async fn stream_pc_samples(
        &self,
        req: Request<pb::StreamPcSamplesRequest>,
    ) -> Result<Response<Self::StreamPcSamplesStream>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        let s = crate::pmstream::pc_stream(self.d.pc_streams(req.session_id), &caller, req).await?;
        Ok(Response::new(Box::pin(s)))
    }

    async fn query_pc_samples(
        &self,
        req: Request<pb::QueryPcSamplesRequest>,
    ) -> Result<Response<pb::QueryPcSamplesResponse>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        Ok(Response::new(crate::query::query_pc_samples(self.d.reads(req.session_id), &caller, req).await?))
    }

    async fn diff_summary(
        &self,
        req: Request<pb::DiffSummaryRequest>,
    ) -> Result<Response<pb::DiffSummaryResponse>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        let (a, b) = (side_session(&req.a), side_session(&req.b));
        Ok(Response::new(crate::query::diff_summary(self.d.reads(a), self.d.reads(b), &caller, req).await?))
    }

    async fn diff_pc_samples(
        &self,
        req: Request<pb::DiffPcSamplesRequest>,
    ) -> Result<Response<pb::DiffPcSamplesResponse>, Status> {
        let caller = self.caller(&req);
        let req = req.into_inner();
        let (a, b) = (side_session(&req.a), side_session(&req.b));
        Ok(Response::new(crate::query::diff_pc_samples(self.d.reads(a), self.d.reads(b), &caller, req).await?))
    }

    async fn pause(&self, req: Request<pb::PauseRequest>) -> Result<Response<pb::PauseResponse>, Status> {
        let uid = crate::access::require_operator(&self.caller(&req), "pause GPUs")?;
        self.gpu_precondition()?;
        let r = req.into_inner();
        let ttl = (r.duration_seconds > 0).then(|| std::time::Duration::from_secs(r.duration_seconds));
        let reservations = self.d.arbiter.pause(&r.devices, r.all, uid, &r.reason, ttl)?;
        Ok(Response::new(pb::PauseResponse { reservations }))
    }

    async fn resume(&self, req: Request<pb::ResumeRequest>) -> Result<Response<pb::ResumeResponse>, Status> {
        let uid = crate::access::require_operator(&self.caller(&req), "resume GPUs")?;
        self.gpu_precondition()?;
        let r = req.into_inner();
        let devices = self.d.arbiter.resume(&r.devices, r.all, uid)?;
        Ok(Response::new(pb::ResumeResponse { devices }))
    }

    async fn list_reservations(
        &self,
        _: Request<pb::ListReservationsRequest>,
    ) -> Result<Response<pb::ListReservationsResponse>, Status> {
        Ok(Response::new(pb::ListReservationsResponse { devices: self.d.arbiter.reservations() }))
    }
}
