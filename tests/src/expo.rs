//! Prometheus text exposition for tests: a scrape over plain TCP, the format rules that
//! `promtool check metrics` enforces that matter here (checked without promtool), and
//! promtool itself, whose lint findings may only be the ones DCGM exporter's label names cause.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};

/// `GET /metrics`, the whole HTTP response as text.
pub fn scrape(port: u16) -> std::io::Result<String> {
    scrape_path(port, "/metrics")
}

/// `GET path`, the whole HTTP response as text. The endpoint listens a moment after the
/// daemon's API socket: a refused connection is tried again for up to 10 s.
pub fn scrape_path(port: u16, path: &str) -> std::io::Result<String> {
    let t = std::time::Instant::now();
    let mut c = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(c) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && t.elapsed().as_secs() < 10 => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    };
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())?;
    let mut body = String::new();
    c.read_to_string(&mut body)?;
    Ok(body)
}

fn valid_name(n: &str) -> bool {
    let mut ch = n.chars();
    ch.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && ch.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The label names gpuprof copies from DCGM exporter although they are not snake_case.
pub const DCGM_LABELS: [&str; 3] = ["UUID", "modelName", "Hostname"];

/// Checks: HELP and TYPE once per family, before its samples; samples only of declared
/// families, grouped together; counters end in `_total`; valid names and label syntax;
/// no series twice; a family's name ends in one unit (no family mixes units: each sample of a
/// family has the same label names apart from `metric`).
pub fn check(text: &str) -> Result<(), String> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helps: BTreeSet<String> = BTreeSet::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut current = String::new();
    let mut series: BTreeSet<String> = BTreeSet::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default().to_string();
            if !helps.insert(name.clone()) {
                return Err(format!("HELP twice for {name}"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut p = rest.split(' ');
            let (name, kind) = (p.next().unwrap_or_default().to_string(), p.next().unwrap_or_default());
            if !matches!(kind, "gauge" | "counter" | "untyped" | "histogram" | "summary") {
                return Err(format!("{name}: unknown type {kind}"));
            }
            if kind == "counter" && !name.ends_with("_total") {
                return Err(format!("counter {name} does not end in _total"));
            }
            if types.insert(name.clone(), kind.to_string()).is_some() {
                return Err(format!("TYPE twice for {name}"));
            }
            if !current.is_empty() {
                done.insert(std::mem::take(&mut current));
            }
            current = name;
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name_labels, value) = line.rsplit_once(' ').ok_or(format!("no value: {line}"))?;
        value.parse::<f64>().map_err(|_| format!("bad value in {line}"))?;
        let (name, labels) = match name_labels.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').ok_or(format!("unclosed labels: {line}"))?),
            None => (name_labels, ""),
        };
        if !valid_name(name) {
            return Err(format!("bad metric name {name:?}"));
        }
        if name != current {
            return Err(format!(
                "sample of {name} outside its family's block (current {current:?}, seen before: {})",
                done.contains(name)
            ));
        }
        if !helps.contains(name) {
            return Err(format!("{name} has no HELP"));
        }
        let mut label_names = Vec::new();
        let mut rest = labels;
        while !rest.is_empty() {
            let (k, after) = rest.split_once("=\"").ok_or(format!("bad labels in {line}"))?;
            if !valid_name(k) {
                return Err(format!("bad label name {k:?} in {line}"));
            }
            if k.chars().any(|c| c.is_ascii_uppercase()) && !DCGM_LABELS.contains(&k) {
                return Err(format!("label name {k:?} is not snake_case (only DCGM exporter's may not be): {line}"));
            }
            label_names.push(k.to_string());
            let mut end = None;
            let mut esc = false;
            for (i, c) in after.char_indices() {
                match (esc, c) {
                    (true, _) => esc = false,
                    (false, '\\') => esc = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let end = end.ok_or(format!("unterminated label value in {line}"))?;
            rest = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
        }
        let unique: BTreeSet<_> = label_names.iter().collect();
        if unique.len() != label_names.len() {
            return Err(format!("a label twice in {line}"));
        }
        if !series.insert(name_labels.to_string()) {
            return Err(format!("series twice: {name_labels}"));
        }
    }
    Ok(())
}

/// The promtool to run: `GPUPROF_PROMTOOL`, else `promtool` on the PATH.
pub fn promtool_path() -> String {
    std::env::var("GPUPROF_PROMTOOL").unwrap_or_else(|_| "promtool".into())
}

/// `promtool check metrics` on `body`: its lint findings, one per line (none when it passed).
/// Fails, saying how to install it, when promtool is missing, and when it found errors rather
/// than lint findings (exit status other than 0 and 3).
pub fn promtool(body: &str) -> Result<Vec<String>, String> {
    let tool = promtool_path();
    let mut p = std::process::Command::new(&tool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot run {tool:?} ({e}): these tests need Prometheus' promtool. Install it \
                 (Debian: apt-get install prometheus, or only the program: apt-get download prometheus \
                 and extract usr/bin/promtool, as .ci/run does) or set GPUPROF_PROMTOOL to its path"
            )
        })?;
    p.stdin.take().expect("stdin piped").write_all(body.as_bytes()).map_err(|e| e.to_string())?;
    let out = p.wait_with_output().map_err(|e| e.to_string())?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    match out.status.code() {
        Some(0 | 3) => Ok(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect()),
        _ => Err(format!("promtool check metrics failed ({}): {text}", out.status)),
    }
}

/// The lint findings promtool must report for `body` and no others: "label names should be
/// written in 'snake_case'" for each family whose samples carry a DCGM exporter label that
/// promtool's rule (a lower-case letter followed by an upper-case one) catches.
pub fn expected_findings(body: &str) -> BTreeSet<String> {
    let camel = |l: &str| l.as_bytes().windows(2).any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase());
    let flagged: Vec<&str> = DCGM_LABELS.iter().copied().filter(|l| camel(l)).collect();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('{'))
        .filter(|(_, labels)| flagged.iter().any(|f| labels.contains(&format!("{f}=\""))))
        .map(|(name, _)| format!("{name} label names should be written in 'snake_case' not 'camelCase'"))
        .collect()
}

/// promtool passes `body` but for exactly the findings DCGM exporter's label names cause.
pub fn promtool_accepts(body: &str) -> Result<(), String> {
    let got: BTreeSet<String> = promtool(body)?.into_iter().collect();
    let want = expected_findings(body);
    if got != want {
        let extra: Vec<_> = got.difference(&want).collect();
        let missing: Vec<_> = want.difference(&got).collect();
        return Err(format!(
            "promtool check metrics: findings other than DCGM exporter's label names: {extra:#?}\n\
             expected but not reported: {missing:#?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn catches_what_promtool_would() {
        assert!(super::check("# HELP a_total x\n# TYPE a_total counter\na_total 1\n").is_ok());
        assert!(super::check("# HELP a x\n# TYPE a counter\na 1\n").is_err());
        assert!(super::check("# HELP a x\n# TYPE a gauge\na 1\na 2\n").is_err());
        assert!(super::check("b 1\n").is_err());
        assert!(super::check("# HELP a x\n# TYPE a gauge\na{UUID=\"u\",modelName=\"m\"} 1\n").is_ok());
        assert!(super::check("# HELP a x\n# TYPE a gauge\na{podName=\"p\"} 1\n").is_err());
    }

    #[test]
    fn only_model_name_meets_promtools_camel_case_rule() {
        let body = "# HELP a x\n# TYPE a gauge\na{gpu=\"0\",UUID=\"u\",modelName=\"m\",Hostname=\"h\"} 1\n\
                    # HELP b x\n# TYPE b gauge\nb{Hostname=\"h\"} 1\n";
        let want: Vec<_> = super::expected_findings(body).into_iter().collect();
        assert_eq!(want, ["a label names should be written in 'snake_case' not 'camelCase'"]);
    }
}
