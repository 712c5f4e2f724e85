//! Every rpc, message and field of the public protocols carries a comment.
//!
//! A field counts as documented when a `//` comment stands on the line right above it or at
//! the end of its line; one comment may cover a group of coordinates (grid_x, grid_y, grid_z).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

/// The field name of a declaration such as `repeated uint32 grid_x = 8;`.
fn field_name(t: &str) -> Option<&str> {
    let before_eq = t.split(" = ").next()?;
    before_eq.split_whitespace().last()
}

/// `grid_y` and `grid_z` belong to the group opened by `grid_x`.
fn same_group(prev: &str, cur: &str) -> bool {
    let stem = |n: &str| n.strip_suffix("_x").or(n.strip_suffix("_y")).or(n.strip_suffix("_z")).map(str::to_string);
    matches!((stem(prev), stem(cur)), (Some(a), Some(b)) if a == b)
}

fn undocumented(path: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut missing = Vec::new();
    let mut prev = "";
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        let is_rpc = t.starts_with("rpc ");
        let is_field = !is_rpc
            && t.ends_with(';')
            && t.contains(" = ")
            && !t.starts_with("option ")
            && !t.starts_with("syntax")
            && !t.starts_with("package")
            && t.split_whitespace().count() >= 4;
        if is_rpc || is_field {
            let grouped = is_field
                && field_name(prev).zip(field_name(t)).is_some_and(|(a, b)| same_group(a, b))
                && prev.contains(" = ");
            if !prev.starts_with("//") && !t.contains("//") && !grouped {
                missing.push(format!("{path}:{}: {t}", i + 1));
            }
        }
        prev = t;
    }
    missing
}

#[test]
fn every_rpc_and_field_is_documented() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut missing = undocumented(&format!("{root}/gpuprof/v1/gpuprof.proto"));
    missing.extend(undocumented(&format!("{root}/agent/v1/agent.proto")));
    assert!(missing.is_empty(), "undocumented:\n{}", missing.join("\n"));
}
