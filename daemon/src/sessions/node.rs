//! The node's always-on PC profile (`[pc] always_on`): a session gpuprofd starts itself,
//! named [`NODE_NAME`], that targets every GPU process and collects only PC samples, in
//! windows. It yields: a process another session targets leaves it for that session (pid
//! targets included) and comes back once that session ends. Its samples are summed per
//! minute (`pc_rollup`) instead of kept per PC, since it never ends.

use gpuprof_proto::api as pb;

use crate::Daemon;
use crate::access::Caller;

/// The always-on session's name.
pub const NODE_NAME: &str = "always-on PC profile";

/// Starts the always-on session when `[pc] always_on` is set (at daemon start; a session of
/// a previous run was marked interrupted by then).
pub async fn start_always_on(d: &Daemon) {
    if !d.config.pc.always_on {
        return;
    }
    let req = pb::StartSessionRequest {
        name: NODE_NAME.into(),
        targets: vec![pb::Target { target: Some(pb::target::Target::All(true)) }],
        collect: Some(pb::CollectOptions {
            preset: "pc".into(),
            pc_sampling: true,
            pc_mode: "windows".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    match super::api::create(d, &Caller::root(), req, true).await {
        Ok(s) => {
            tracing::info!(session = s.id, "always-on PC profile started ([pc] always_on)");
        }
        Err(e) => tracing::error!(error = %e, "always-on PC profile not started"),
    }
}
