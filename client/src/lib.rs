//! gpuprofctl's client library: connecting to gpuprofd's gRPC API.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gpuprof_proto::api::gpuprof_client::GpuprofClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

pub use gpuprof_proto::api as pb;

/// Default API socket of a system-wide gpuprofd.
pub const DEFAULT_API_SOCKET: &str = "/run/gpuprof/api.sock";

/// Connects to gpuprofd's API on a Unix socket.
pub async fn connect(socket: &Path) -> Result<GpuprofClient<Channel>> {
    let path: PathBuf = socket.to_path_buf();
    let display = path.display().to_string();
    // The URI is ignored by the connector; tonic needs a syntactically valid one.
    let channel = Endpoint::try_from("http://gpuprofd.local")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
        .with_context(|| format!("cannot connect to gpuprofd at {display} (is it running? use --socket PATH)"))?;
    Ok(GpuprofClient::new(channel).max_decoding_message_size(64 << 20))
}
