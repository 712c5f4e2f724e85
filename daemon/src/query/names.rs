//! Names for stored numbers: interned strings and the CUPTI enums that records keep as integers.

use std::collections::HashMap;

use rusqlite::Connection;

/// An interned string's value ("" for 0 or unknown ids).
pub fn string(c: &Connection, id: i64) -> rusqlite::Result<String> {
    use rusqlite::OptionalExtension;
    if id == 0 {
        return Ok(String::new());
    }
    Ok(c.prepare_cached("SELECT value FROM strings WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?
        .unwrap_or_default())
}

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
pub struct Strings(HashMap<i64, String>);

impl Strings {
    pub fn get(&mut self, c: &Connection, id: i64) -> rusqlite::Result<String> {
        if let Some(s) = self.0.get(&id) {
            return Ok(s.clone());
        }
        let s = string(c, id)?;
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
