//! Names for stored numbers: interned strings and the CUPTI enums that records keep as integers.

use std::collections::HashMap;

use rusqlite::Connection;

/// An interned string as it is shown: demangled when it is a mangled symbol ("" for 0 or
/// unknown ids).
pub fn string(c: &Connection, id: i64) -> rusqlite::Result<String> {
    Ok(names(c, id)?.0)
}

/// An interned string as shown, and as stored when that differs (a mangled symbol), else "".
pub fn names(c: &Connection, id: i64) -> rusqlite::Result<(String, String)> {
    use rusqlite::OptionalExtension;
    if id == 0 {
        return Ok((String::new(), String::new()));
    }
    Ok(c.prepare_cached("SELECT value, demangled FROM strings WHERE id = ?1")?
        .query_row([id], |r| {
            let value: String = r.get(0)?;
            Ok(match r.get::<_, Option<String>>(1)? {
                Some(d) => (d, value),
                None => (value, String::new()),
            })
        })
        .optional()?
        .unwrap_or_default())
}

/// The SQL condition on `strings` (alias-free) that a name filter matches: the stored value
/// or its demangled form; bind the pattern twice.
pub const NAME_GLOB: &str = "(value GLOB ? OR demangled GLOB ?)";

/// CUpti_ActivityMemcpyKind as a short name.
pub fn copy_kind_name(k: i64) -> String {
    match k {
        1 => "HtoD".into(),
        2 => "DtoH".into(),
        3 => "HtoA".into(),
        4 => "AtoH".into(),
        5 => "AtoA".into(),
        6 => "AtoD".into(),
        7 => "DtoA".into(),
        8 => "DtoD".into(),
        9 => "HtoH".into(),
        10 => "PtoP".into(),
        other => format!("kind{other}"),
    }
}

/// Interned strings, cached for one query.
#[derive(Default)]
pub struct Strings(HashMap<i64, (String, String)>);

impl Strings {
    /// As shown (demangled where it is a mangled symbol).
    pub fn get(&mut self, c: &Connection, id: i64) -> rusqlite::Result<String> {
        // Only the shown form copied (a mangled name is often the longer one).
        if let Some(s) = self.0.get(&id) {
            return Ok(s.0.clone());
        }
        Ok(self.both(c, id)?.0)
    }

    /// As shown, and as stored when that differs (else "").
    pub fn both(&mut self, c: &Connection, id: i64) -> rusqlite::Result<(String, String)> {
        if let Some(s) = self.0.get(&id) {
            return Ok(s.clone());
        }
        let s = names(c, id)?;
        self.0.insert(id, s.clone());
        Ok(s)
    }
}

/// CUpti_ActivitySynchronizationType as a name.
pub fn sync_type_name(t: i64) -> &'static str {
    match t {
        1 => "event",
        2 => "stream_wait_event",
        3 => "stream",
        4 => "context",
        _ => "unknown",
    }
}
