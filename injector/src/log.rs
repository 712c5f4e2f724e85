//! Logging: off unless `GPUPROF_LOG` is set (`error`, `warn`, `info`, `debug`), to stderr or to
//! the file `GPUPROF_LOG_FILE`; never to the host's stdout.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[repr(u8)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
static FILE: OnceLock<Option<std::sync::Mutex<std::fs::File>>> = OnceLock::new();

pub fn parse_level(s: &str) -> Level {
    match s.trim().to_ascii_lowercase().as_str() {
        "error" => Level::Error,
        "warn" | "warning" => Level::Warn,
        "info" | "1" | "on" | "true" => Level::Info,
        "debug" | "trace" => Level::Debug,
        _ => Level::Off,
    }
}

fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != u8::MAX {
        return l;
    }
    let l = std::env::var("GPUPROF_LOG").map(|s| parse_level(&s)).unwrap_or(Level::Off) as u8;
    LEVEL.store(l, Ordering::Relaxed);
    l
}

pub fn enabled(l: Level) -> bool {
    (l as u8) <= level() && l != Level::Off
}

pub fn write(l: Level, args: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    // UTC time of day, to the millisecond: lines of several processes and the application's
    // own output line up.
    let ms = gpuprof_cupti::clock::realtime_ns() / 1_000_000;
    let (h, m, s) = (ms / 3_600_000 % 24, ms / 60_000 % 60, ms / 1000 % 60);
    let line =
        format!("gpuprof-inject[{}] {h:02}:{m:02}:{s:02}.{:03} {:?}: {}\n", std::process::id(), ms % 1000, l, args);
    let file = FILE.get_or_init(|| {
        std::env::var_os("GPUPROF_LOG_FILE")
            .and_then(|p| std::fs::OpenOptions::new().create(true).append(true).open(p).ok().map(std::sync::Mutex::new))
    });
    match file {
        Some(f) => {
            if let Ok(mut f) = f.lock() {
                let _ = f.write_all(line.as_bytes());
            }
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

macro_rules! log {
    ($lvl:ident, $($arg:tt)*) => {
        if $crate::log::enabled($crate::log::Level::$lvl) {
            $crate::log::write($crate::log::Level::$lvl, format_args!($($arg)*))
        }
    };
}
pub(crate) use log;

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn levels_parse() {
        assert_eq!(parse_level("debug"), Level::Debug);
        assert_eq!(parse_level("1"), Level::Info);
        assert_eq!(parse_level(""), Level::Off);
        assert_eq!(parse_level("nonsense"), Level::Off);
    }
}
