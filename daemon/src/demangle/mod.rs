//! Readable names for mangled symbols: kernels and device functions arrive as the compiler
//! mangled them (`_Z10add_kernelPfS_i`, `_ZN2at6native...`, Rust's `_R...`).
//! C++ names are written as c++filt writes them ([`cxxfilt`]): a name copied from
//! torch.profiler, Nsight Systems or c++filt finds the same kernels.

mod cxxfilt;
#[cfg(test)]
mod tests;

/// The demangled form of a mangled C++ (Itanium ABI) or Rust symbol; None for anything else
/// (NVTX messages, metric names, ...) and for symbols that do not demangle.
pub fn demangle(s: &str) -> Option<String> {
    if !(s.starts_with("_Z") || s.starts_with("_R")) {
        return None;
    }
    // Rust first: legacy Rust symbols are valid Itanium names too, but only rustc-demangle
    // drops their hash.
    if let Ok(d) = rustc_demangle::try_demangle(s) {
        return Some(format!("{d:#}"));
    }
    let text = cxxfilt::demangle(s)?;
    (text != s).then_some(text)
}

/// Fills in `strings.demangled` for mangled names stored without it (by a gpuprofd older than
/// schema version 6, or cleared by version 13 to be written as c++filt writes them); returns
/// how many were filled. Run by the writer at start.
pub fn fill_missing(conn: &rusqlite::Connection) -> rusqlite::Result<usize> {
    let todo: Vec<(i64, String)> = conn
        .prepare("SELECT id, value FROM strings WHERE demangled IS NULL AND (value GLOB '_Z*' OR value GLOB '_R*')")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut update = conn.prepare("UPDATE strings SET demangled = ?2 WHERE id = ?1")?;
    let mut n = 0;
    for (id, value) in todo {
        if let Some(d) = demangle(&value) {
            n += update.execute(rusqlite::params![id, d])?;
        }
    }
    Ok(n)
}
