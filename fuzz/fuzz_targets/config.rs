//! The configuration parser as `gpuprofd check-config` runs it: a TOML document layered over the
//! built-in defaults, deserialized and validated (`Config::from_toml`). It must never panic, and
//! a configuration it accepts must pass the checks again and satisfy them.
#![no_main]

use std::path::Path;

use gpuprofd::config::Config;
use libfuzzer_sys::fuzz_target;

/// Whether the document names, as an API TLS or token file, something other than a regular
/// file: validation reads those files whole, and a device such as /dev/zero never ends.
fn names_special_files(text: &str) -> bool {
    let Ok(t) = text.parse::<toml::Table>() else { return false };
    let Some(toml::Value::Table(api)) = t.get("api") else { return false };
    ["tls_cert_file", "tls_key_file", "client_ca_file", "token_file"].iter().any(|k| match api.get(*k) {
        Some(toml::Value::String(p)) => !p.is_empty() && !Path::new(p).is_file(),
        _ => false,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if names_special_files(text) {
        return;
    }
    match Config::from_toml(text) {
        Ok(c) => {
            assert!((1024..=256 << 20).contains(&c.agent.max_frame_bytes));
            assert!(c.agent.heartbeat_interval_ms > 0);
            assert!(c.agent.liveness_timeout_ms >= 2 * u64::from(c.agent.heartbeat_interval_ms));
            assert!(c.api.socket_mode <= 0o777);
            assert!(c.ingest.queue_messages > 0 && c.ingest.commit_max_records > 0);
            let _ = c.retention.max_bytes(&c.storage);
            let again = Config::from_toml(text).expect("an accepted configuration is accepted again");
            assert_eq!(format!("{again:?}"), format!("{c:?}"));
        }
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.is_empty());
        }
    }
});
