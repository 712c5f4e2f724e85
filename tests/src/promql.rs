//! The metric names a PromQL expression reads, for checking a dashboard against a scrape: every
//! identifier that is not a function or aggregation (`rate(`, `sum by (...)`), a keyword
//! (`and`, `or`, `unless`, `bool`, `offset`), a label name (inside `{...}` or the lists after
//! `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`), a duration (`[5m]`), a
//! string, a number or a Grafana variable (`$host`, `${datasource}`).
#![allow(dead_code)]

use std::collections::BTreeSet;

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Followed by a list of label names in parentheses (`group_left` and `group_right` may have none).
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "Inf", "NaN"];

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The index after the string literal that starts at `i` (its quote).
fn skip_string(b: &[u8], i: usize) -> Result<usize, String> {
    let q = b[i];
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' if q != b'`' => j += 2,
            c if c == q => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err(format!("unterminated string at byte {i}"))
}

/// The index after the bracket group that opens at `i`, strings inside skipped.
fn skip_group(b: &[u8], i: usize, open: u8, close: u8) -> Result<usize, String> {
    let mut depth = 0;
    let mut j = i;
    while j < b.len() {
        match b[j] {
            b'"' | b'\'' | b'`' => {
                j = skip_string(b, j)?;
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Ok(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    Err(format!("unclosed {:?} at byte {i}", open as char))
}

fn next_non_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The metric names `expr` reads; an error for unbalanced brackets or strings.
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let b = expr.as_bytes();
    let mut out = BTreeSet::new();
    let mut parens = 0i32;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => i = skip_string(b, i)?,
            b'{' => i = skip_group(b, i, b'{', b'}')?,
            b'[' => i = skip_group(b, i, b'[', b']')?,
            b'}' | b']' => return Err(format!("unbalanced {:?} at byte {i}", c as char)),
            b'#' => i = b[i..].iter().position(|&x| x == b'\n').map_or(b.len(), |p| i + p),
            b'$' => {
                i += 1;
                if b.get(i) == Some(&b'{') {
                    i = skip_group(b, i, b'{', b'}')?;
                } else {
                    while i < b.len() && ident_char(b[i]) {
                        i += 1;
                    }
                }
            }
            b'(' | b')' => {
                parens += if c == b'(' { 1 } else { -1 };
                if parens < 0 {
                    return Err(format!("unbalanced ')' at byte {i}"));
                }
                i += 1;
            }
            c if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) => {
                // Numbers, with exponents, hex digits or duration units.
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
            }
            c if ident_start(c) => {
                let start = i;
                while i < b.len() && ident_char(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = next_non_space(b, i);
                let call = b.get(next) == Some(&b'(');
                if LABEL_LISTS.contains(&word) {
                    if call {
                        i = skip_group(b, next, b'(', b')')?;
                    }
                } else if word == "offset" {
                    i = next_non_space(b, i);
                    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'-') {
                        i += 1;
                    }
                } else if call || AGGREGATIONS.contains(&word) || KEYWORDS.contains(&word) {
                    // A function, an aggregation (its modifier may come first), a keyword.
                } else {
                    out.insert(word.to_string());
                }
            }
            _ => i += 1,
        }
    }
    if parens != 0 {
        return Err(format!("{parens} unclosed '(' in {expr}"));
    }
    Ok(out)
}

/// The metric names a Grafana query variable reads: `label_values(SELECTOR, label)` (the label
/// is not a metric) or a plain expression.
pub fn variable_metric_names(query: &str) -> Result<BTreeSet<String>, String> {
    let q = query.trim();
    match q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
        Some(args) => {
            let (sel, label) = args.rsplit_once(',').ok_or(format!("label_values without a label: {q}"))?;
            if !label.trim().bytes().all(ident_char) {
                return Err(format!("bad label name in {q}"));
            }
            metric_names(sel)
        }
        None => metric_names(q),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(e: &str) -> Vec<String> {
        metric_names(e).unwrap().into_iter().collect()
    }

    #[test]
    fn finds_metrics_and_only_metrics() {
        assert_eq!(
            names(
                r#"sum by (Hostname, kind) (rate(a_total{x="}{(", y=~"$host"}[$__rate_interval])
                   * on(instance) group_left(Hostname) b_info{Hostname=~"$host"})"#
            ),
            ["a_total", "b_info"]
        );
        assert_eq!(names("floor(c{d=\"e\"} / 4) % 2 or vector(0)"), ["c"]);
        assert_eq!(names("-x offset 5m > bool 1e3 unless ignoring (a) y"), ["x", "y"]);
        assert_eq!(names("count without(gpu) (z) # a comment naming w\n"), ["z"]);
        assert_eq!(names("increase(m:rule[${__range}]) + max(n) by (gpu)"), ["m:rule", "n"]);
        assert!(names("vector(1) + time()").is_empty());
    }

    #[test]
    fn rejects_unbalanced_expressions() {
        for bad in ["rate(a[5m]", "a{b=\"c\"", "a)", "a{b=\"c}", "a]"] {
            assert!(metric_names(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_values_names_its_metric_not_its_label() {
        let v = |q: &str| variable_metric_names(q).unwrap().into_iter().collect::<Vec<_>>();
        assert_eq!(v(r#"label_values(m{Hostname=~"$host"}, gpu)"#), ["m"]);
        assert_eq!(v("label_values(m, Hostname)"), ["m"]);
        assert_eq!(v("query_result(max(x))"), ["x"]);
    }
}
