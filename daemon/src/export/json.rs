//! Writing JSON by hand: string literals and times from integers.

use std::fmt::Write as _;

/// JSON string literal of `s`.
pub(super) fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// ns as µs with three decimals, from integers.
pub(super) fn us(out: &mut Vec<u8>, ns: i64) {
    let neg = ns < 0;
    let a = ns.unsigned_abs();
    let _ = write!(Buf(out), "{}{}.{:03}", if neg { "-" } else { "" }, a / 1000, a % 1000);
}

/// `fmt::Write` over a byte vector.
pub(super) struct Buf<'a>(pub(super) &'a mut Vec<u8>);

impl std::fmt::Write for Buf<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
