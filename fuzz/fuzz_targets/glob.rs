//! Globs (`gpuprof_proto::glob`) and the API's filter check (`query::check_filter`): the input
//! is a pattern and a text separated by the first newline. A pattern `check` refuses matches
//! nothing and makes `check_filter` fail; one without wildcards matches exactly its own text;
//! a well-formed one matches exactly what SQLite's GLOB matches, since queries hand name
//! patterns to SQLite while streams match them with `glob::matches`.
#![no_main]

use std::cell::RefCell;

use gpuprof_proto::api::{RecordFilter, TimeRange};
use gpuprof_proto::glob;
use gpuprofd::query::check_filter;
use libfuzzer_sys::fuzz_target;

thread_local! {
    static DB: RefCell<rusqlite::Connection> =
        RefCell::new(rusqlite::Connection::open_in_memory().expect("an in-memory database"));
}

fn sqlite_glob(pattern: &str, text: &str) -> bool {
    DB.with(|db| {
        db.borrow().query_row("SELECT ?1 GLOB ?2", [text, pattern], |r| r.get::<_, bool>(0)).expect("GLOB evaluates")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let (pattern, text) = s.split_once('\n').unwrap_or((s, ""));
    let well_formed = glob::check(pattern).is_ok();
    let m = glob::matches(pattern, text);
    if !well_formed {
        assert!(!m, "a malformed pattern matched {text:?}");
    }
    if !pattern.contains(['*', '?', '[']) {
        assert!(well_formed);
        assert_eq!(m, pattern == text, "a pattern without wildcards matches its own text only");
        assert!(glob::matches(pattern, pattern));
    }
    // SQLite stops a string at NUL and reads U+FFFE and U+FFFF as U+FFFD.
    let sqlite_reads_as_is = |s: &str| !s.contains(['\0', '\u{fffe}', '\u{ffff}']);
    if well_formed && sqlite_reads_as_is(pattern) && sqlite_reads_as_is(text) {
        assert_eq!(m, sqlite_glob(pattern, text), "{pattern:?} on {text:?}: gpuprof and SQLite disagree");
    }
    let mut f = RecordFilter { name_pattern: pattern.to_string(), ..Default::default() };
    assert_eq!(check_filter(&f).is_ok(), pattern.is_empty() || well_formed);
    let n = text.len() as u64;
    f.time_range = Some(TimeRange { start_ns: n, end_ns: n / 2 });
    let times_ok = n / 2 == 0;
    assert_eq!(check_filter(&f).is_ok(), (pattern.is_empty() || well_formed) && times_ok);
});
