//! The node's always-on PC profile (`[pc] always_on`): a session gpuprofd starts itself,
//! named [`NODE_NAME`], that targets every GPU process and collects only PC samples, in
//! windows. It yields: a process another session targets leaves it for that session (pid
//! targets included) and comes back once that session ends. Its samples are summed per
//! minute (`pc_rollup`) instead of kept per PC, since it never ends.

use gpuprof_proto::api as pb;

use super::api::Handlers;
use crate::access::Caller;

/// The always-on session's name.
pub const NODE_NAME: &str = "always-on PC profile";

/// Starts the always-on session when `always_on` (`[pc] always_on`) is set (at daemon start;
/// a session of a previous run was marked interrupted by then).
pub(crate) async fn start_always_on(d: Handlers<'_>, always_on: bool) {
    if !always_on {
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

#[cfg(test)]
mod tests {
    use super::super::api::tests::Parts;
    use super::*;

    /// Built from the handlers' parts, no daemon: nothing starts unless `[pc] always_on`; when
    /// set, the always-on session is active, named, collects PC samples in windows, and is the
    /// sessions' node profile.
    #[tokio::test]
    async fn always_on_profile_without_a_daemon() {
        let p = Parts::new();
        start_always_on(p.handlers(), false).await;
        assert_eq!((p.sessions.open_count(), p.sessions.node()), (0, 0));
        start_always_on(p.handlers(), true).await;
        let id = p.sessions.node();
        assert!(id != 0 && p.sessions.is_open(id));
        let s = super::super::api::get(p.handlers(), &Caller::root(), id).await.unwrap();
        assert_eq!((s.name.as_str(), s.state), (NODE_NAME, pb::SessionState::Active as i32));
        let collect = s.collect.unwrap_or_default();
        assert!(collect.pc_sampling && collect.pc_mode == "windows", "{collect:?}");
        p.stop().await;
    }
}
