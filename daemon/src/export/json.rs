//! Writing JSON by hand: string literals and times from integers.

/// JSON string literal of `s`.
pub(super) fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// ns as µs with three decimals, from integers.
pub(super) fn us(out: &mut Vec<u8>, ns: i64) {
    if ns < 0 {
        out.push(b'-');
    }
    let a = ns.unsigned_abs();
    out.extend_from_slice(itoa::Buffer::new().format(a / 1000).as_bytes());
    let frac = (a % 1000) as u16;
    out.extend_from_slice(&[b'.', b'0' + (frac / 100) as u8, b'0' + (frac / 10 % 10) as u8, b'0' + (frac % 10) as u8]);
}

/// `fmt::Write` over a byte vector.
pub(super) struct Buf<'a>(pub(super) &'a mut Vec<u8>);

impl std::fmt::Write for Buf<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
