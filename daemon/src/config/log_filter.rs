//! `log_level` checks beyond tracing's own parser.

/// Checks that every span field value in a log filter (`target[span{field=value}]=level`) is
/// plain text. tracing reads such a value as a regular expression and compiles it to a DFA up
/// front, which for some patterns of a few hundred characters (`.*` followed by many `.`) takes
/// minutes and memory without bound; plain text compiles in linear time.
///
/// Also that the whole filter is ASCII: tracing-subscriber 0.3's directive parser slices a
/// directive at byte offsets and panics inside a multi-byte character (found by the `config`
/// fuzz target); targets, span names and levels are ASCII anyway.
pub(super) fn check_field_values(filter: &str) -> Result<(), String> {
    if let Some(c) = filter.chars().find(|c| !c.is_ascii()) {
        return Err(format!("must be ASCII (targets, span names, fields and levels), found {c:?}"));
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':' | '/' | ' ' | '"');
    let mut rest = filter;
    while let Some(open) = rest.find('{') {
        let fields = &rest[open + 1..];
        let end = fields.find('}').unwrap_or(fields.len());
        for field in fields[..end].split(',') {
            if let Some((name, value)) = field.split_once('=')
                && !value.chars().all(plain)
            {
                return Err(format!(
                    "the value of span field {:?} must be plain text (letters, digits, _ - : / and spaces), got {value:?}",
                    name.trim()
                ));
            }
        }
        rest = &fields[end..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `config` fuzz target (fuzz/): this `log_level` kept `check-config` (and the
    /// daemon's start) busy for minutes compiling the field value as a regular expression.
    #[test]
    fn regex_field_values_are_refused() {
        let found = include_str!("../../../fuzz/regressions/config-log-level-regex-timeout");
        let e = crate::config::Config::from_toml(found).unwrap_err();
        assert!(format!("{e:#}").contains("must be plain text"), "{e:#}");
        let slow = format!("gpuprofd=debug,[conn{{={}{}{}}}]=trace", "h".repeat(30), ".*", ".".repeat(60));
        assert!(check_field_values(&slow).is_err());
        let e = crate::config::Config::from_toml(&format!("log_level = {slow:?}\n")).unwrap_err();
        assert!(format!("{e:#}").contains("log_level"), "{e:#}");
        for ok in
            ["info", "gpuprofd=debug,tower=warn", "[conn{peer=1}]=trace", "[agent{kind=injector}]=debug", "[x{a}]=info"]
        {
            assert_eq!(check_field_values(ok), Ok(()), "{ok}");
            assert!(crate::config::Config::from_toml(&format!("log_level = {ok:?}\n")).is_ok(), "{ok}");
        }
    }

    /// Found by the `config` fuzz target: tracing-subscriber's directive parser panicked on
    /// this `log_level` ("byte index is not a char boundary") instead of refusing it.
    #[test]
    fn non_ascii_filters_are_refused_not_a_panic() {
        let found = include_str!("../../../fuzz/regressions/config-log-level-non-ascii-panic");
        let e = crate::config::Config::from_toml(found).unwrap_err();
        assert!(format!("{e:#}").contains("must be ASCII"), "{e:#}");
        assert!(check_field_values("gpuprofd=débug").is_err());
        assert!(check_field_values("[conn{peer=ü}]=trace").is_err());
    }
}
