//! Readable names for mangled symbols: kernels and device functions arrive as the compiler
//! mangled them (`_Z10add_kernelPfS_i`, `_ZN2at6native...`, Rust's `_R...`).

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
    let sym = cpp_demangle::Symbol::new(s).ok()?;
    let text = sym.demangle().ok()?;
    (text != s).then_some(text)
}

/// Fills in `strings.demangled` for mangled names stored without it (by a gpuprofd older than
/// schema version 5); returns how many were filled. Run by the writer at start.
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

#[cfg(test)]
mod tests {
    use super::{demangle, fill_missing};

    #[test]
    fn names_stored_before_the_column_are_filled_in() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL UNIQUE, demangled TEXT);
             INSERT INTO strings(value) VALUES ('_Z11tiny_kernelPf'), ('nvtx range'), ('_Zbroken');
             INSERT INTO strings(value, demangled) VALUES ('_Z3fooi', 'foo(int)');",
        )
        .unwrap();
        assert_eq!(fill_missing(&c).unwrap(), 1);
        let rows: Vec<(String, Option<String>)> = c
            .prepare("SELECT value, demangled FROM strings ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let want = [
            ("_Z11tiny_kernelPf", Some("tiny_kernel(float*)")),
            ("nvtx range", None),
            ("_Zbroken", None),
            ("_Z3fooi", Some("foo(int)")),
        ];
        let want: Vec<(String, Option<String>)> =
            want.iter().map(|(v, d)| (v.to_string(), d.map(str::to_string))).collect();
        assert_eq!(rows, want);
        assert_eq!(fill_missing(&c).unwrap(), 0, "nothing left to do");
    }

    #[test]
    fn cpp_and_rust_symbols_demangle_and_the_rest_is_left_alone() {
        assert_eq!(demangle("_Z10add_kernelPfS_i").as_deref(), Some("add_kernel(float*, float*, int)"));
        assert_eq!(
            demangle("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_")
                .as_deref(),
            Some(
                "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, \
                 at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
            )
        );
        assert_eq!(demangle("_ZN3foo3barE").as_deref(), Some("foo::bar"));
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(), Some("core::fmt::write"));
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo").as_deref(), Some("mycrate::foo"));
        for plain in ["ampere_sgemm_128x64_nn", "forward", "", "_Zzz not a symbol", "_R"] {
            assert_eq!(demangle(plain), None, "{plain:?}");
        }
    }
}
