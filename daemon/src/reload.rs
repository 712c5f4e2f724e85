//! SIGHUP: read the configuration again and apply what can change while running — the log
//! filter (`log_level`), `[retention]`, the database size cap (`storage.max_database_mib`), and
//! the TCP API's bearer token (`api.token_file`, the file read again even when its path is the
//! same). Every change is logged; a changed setting
//! that only takes effect at a restart is logged as such and left as it was. A file that does
//! not load changes nothing.

use std::path::PathBuf;

use crate::access::TcpAuth;
use crate::config::{Config, Overrides};
use crate::ingest::WriterHandle;
use crate::retention::Live;

/// Sets the log filter (from `main`, which owns the subscriber).
pub type SetLogFilter = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Where the configuration came from, to read it again the same way.
#[derive(Default)]
pub struct Source {
    pub file: Option<PathBuf>,
    pub overrides: Overrides,
    pub set_log: Option<SetLogFilter>,
}

/// Reloads on SIGHUP; remembers the settings in force.
pub struct Reloader {
    source: Source,
    current: Config,
    tcp_auth: Option<TcpAuth>,
}

impl Reloader {
    pub fn new(source: Source, current: Config, tcp_auth: Option<TcpAuth>) -> Reloader {
        Reloader { source, current, tcp_auth }
    }

    /// Reads the configuration again and applies what may change: `live` holds the reloadable
    /// settings that retention and the daemon read; `writer` sets the database size cap.
    pub async fn reload(&mut self, writer: &WriterHandle, live: &Live) {
        let file = self.source.file.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "(none)".into());
        let new = match Config::load(self.source.file.as_deref(), &self.source.overrides) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(config = %file, error = %format!("{e:#}"), "SIGHUP: configuration not reloaded; nothing changed");
                return;
            }
        };
        let mut applied: Vec<String> = Vec::new();
        let mut failed: Vec<String> = Vec::new();
        if new.log_level != self.current.log_level {
            match self.source.set_log.as_ref().map(|set| set(&new.log_level)) {
                Some(Ok(())) => {
                    applied.push(format!("log_level {:?} -> {:?}", self.current.log_level, new.log_level));
                    self.current.log_level = new.log_level.clone();
                }
                Some(Err(e)) => failed.push(format!("log_level {:?}: {e}", new.log_level)),
                None => failed.push("log_level: this process cannot change its log filter".into()),
            }
        }
        let (old_r, new_r) = (format!("{:?}", self.current.retention), format!("{:?}", new.retention));
        if old_r != new_r {
            live.set_retention(new.retention.clone());
            applied.push(format!("retention {old_r} -> {new_r}"));
            self.current.retention = new.retention.clone();
        }
        let (old_cap, new_cap) = (self.current.storage.max_database_mib, new.storage.max_database_mib);
        if old_cap != new_cap {
            match writer.call(move |c| crate::store::set_max_database_mib(c, new_cap)).await {
                Ok(Ok(())) => {
                    live.set_max_database_mib(new_cap);
                    self.current.storage.max_database_mib = new_cap;
                    applied.push(format!("storage.max_database_mib {old_cap} -> {new_cap}"));
                }
                Ok(Err(e)) => failed.push(format!("storage.max_database_mib {new_cap}: {e}")),
                Err(_) => failed.push("storage.max_database_mib: the database writer has stopped".into()),
            }
        }
        if let Some(auth) = &self.tcp_auth {
            match crate::api::read_token(&new.api) {
                Ok(token) => {
                    if token != auth.current_token() {
                        applied.push(format!("api.token_file {}: token replaced", new.api.token_file.display()));
                    }
                    auth.set_token(token);
                    self.current.api.token_file = new.api.token_file.clone();
                }
                Err(e) => failed.push(format!("{e:#} (the previous token stays)")),
            }
        }
        let restart = needs_restart(&self.current, &new);
        tracing::info!(
            config = %file,
            applied = %if applied.is_empty() { "nothing changed".into() } else { applied.join("; ") },
            "SIGHUP: configuration reloaded"
        );
        for f in failed {
            tracing::error!(setting = %f, "SIGHUP: not applied");
        }
        if !restart.is_empty() {
            tracing::warn!(
                settings = %restart.join(", "),
                "SIGHUP: changed settings that only take effect when gpuprofd restarts; still running with the old values"
            );
        }
    }
}

/// The settings that differ between `old` and `new` and that only a restart applies.
pub fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut api_old = old.api.clone();
    let mut api_new = new.api.clone();
    // The token file is reloaded; the rest of [api] is not. Likewise the size cap of [storage].
    api_old.token_file = PathBuf::new();
    api_new.token_file = PathBuf::new();
    let mut storage_old = old.storage.clone();
    let mut storage_new = new.storage.clone();
    storage_old.max_database_mib = 0;
    storage_new.max_database_mib = 0;
    let sections: [(&'static str, String, String); 11] = [
        ("state_dir", format!("{:?}", old.state_dir), format!("{:?}", new.state_dir)),
        ("agent_socket", format!("{:?}", old.agent_socket), format!("{:?}", new.agent_socket)),
        ("api_socket", format!("{:?}", old.api_socket), format!("{:?}", new.api_socket)),
        ("[agent]", format!("{:?}", old.agent), format!("{:?}", new.agent)),
        ("[ingest]", format!("{:?}", old.ingest), format!("{:?}", new.ingest)),
        ("[storage] (except max_database_mib)", format!("{storage_old:?}"), format!("{storage_new:?}")),
        ("[api] (except token_file)", format!("{api_old:?}"), format!("{api_new:?}")),
        ("[sampler]", format!("{:?}", old.sampler), format!("{:?}", new.sampler)),
        ("[metrics]", format!("{:?}", old.metrics), format!("{:?}", new.metrics)),
        ("[arbiter]", format!("{:?}", old.arbiter), format!("{:?}", new.arbiter)),
        ("[prometheus]", format!("{:?}", old.prometheus), format!("{:?}", new.prometheus)),
    ];
    sections.into_iter().filter(|(_, a, b)| a != b).map(|(name, _, _)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload built from its parts, no daemon: a changed file applies `[retention]` and the
    /// size cap (through the writer, to the database), and a file that does not load changes
    /// nothing.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_reload_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let file = dir.path().join("gpuprofd.toml");
        std::fs::write(&file, "").unwrap();
        let cfg = Config::from_toml("").unwrap();
        let writer =
            crate::ingest::TestWriter::start(crate::store::open_writer(&db, &cfg.storage).unwrap(), &cfg.ingest);
        let live = Live::new(cfg.retention.clone(), cfg.storage.max_database_mib);
        let source = Source { file: Some(file.clone()), ..Default::default() };
        let mut r = Reloader::new(source, Config::load(Some(&file), &Overrides::default()).unwrap(), None);
        std::fs::write(&file, "[retention]\nsessions_max_age = \"2h\"\n[storage]\nmax_database_mib = 64\n").unwrap();
        r.reload(&writer.handle, &live).await;
        assert_eq!(live.retention().sessions_max_age.0, std::time::Duration::from_secs(7200));
        assert_eq!(live.max_database_mib(), 64);
        // The cap is the writer connection's.
        let (pages, page): (i64, i64) = writer
            .handle
            .call(|c| {
                let pages = c.query_row("PRAGMA max_page_count", [], |r| r.get(0))?;
                Ok::<_, rusqlite::Error>((pages, c.query_row("PRAGMA page_size", [], |r| r.get(0))?))
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pages * page, 64 << 20, "max_page_count {pages} x page_size {page}");
        std::fs::write(&file, "[retention]\nsessions_max_age = ").unwrap();
        r.reload(&writer.handle, &live).await;
        assert_eq!(live.retention().sessions_max_age.0, std::time::Duration::from_secs(7200));
    }

    #[test]
    fn only_settings_without_reload_need_a_restart() {
        let old = Config::from_toml("").unwrap();
        let reloadable = Config::from_toml(
            "log_level = \"debug\"\n[retention]\nsessions_max_age = \"1h\"\n[api]\ntoken_file = \"/t\"\n\
             [storage]\nmax_database_mib = 64\n",
        )
        .unwrap();
        assert!(needs_restart(&old, &reloadable).is_empty());
        let fixed =
            Config::from_toml("[ingest]\nqueue_messages = 17\n[storage]\ncache_mib = 8\n[api]\nsocket_mode = 384\n")
                .unwrap();
        assert_eq!(
            needs_restart(&old, &fixed),
            ["[ingest]", "[storage] (except max_database_mib)", "[api] (except token_file)"]
        );
    }
}
