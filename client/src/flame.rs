//! PC samples as a flame graph (`export --format svg`, `pc top --since ... --svg`), drawn
//! with inferno from the rows `pc top --by line` shows (QueryPcSamples: demangled function,
//! source line, samples per stall reason). Frames from the bottom: function → source line →
//! stall reason; a frame's width is its samples. It draws and asks nothing of gpuprofd.

use anyhow::{Context, Result};
use gpuprofctl::pb;

use crate::output::short_stall;

/// Rows asked for: QueryPcSamples' most (source lines, hottest first); the samples of the lines
/// beyond them are drawn as one frame.
pub const MAX_ROWS: u32 = 10_000;

/// A frame name as inferno's folded format allows it (`;` separates frames).
fn frame(s: &str) -> String {
    s.replace(';', ":")
}

/// The source line a row is at, as a frame: `file:line`, the file without its directories.
fn line_frame(file: &str, line: u32) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    match (base, line) {
        ("", 0) => "(no line information)".into(),
        ("", l) => format!("?:{l}"),
        (f, 0) => f.to_string(),
        (f, l) => format!("{f}:{l}"),
    }
}

/// The folded stacks of QueryPcSamples rows grouped by line: `function;file:line;stall count`.
pub fn folded(r: &pb::QueryPcSamplesResponse) -> Vec<String> {
    let mut out = Vec::new();
    let mut drawn = 0;
    for row in &r.rows {
        let f = if row.function_name.is_empty() { "(unknown function)" } else { &row.function_name };
        let base = format!("{};{}", frame(f), frame(&line_frame(&row.file, row.line)));
        let mut in_stalls = 0;
        for s in &row.stalls {
            out.push(format!("{base};{} {}", frame(short_stall(&s.reason)), s.count));
            in_stalls += s.count;
        }
        if row.samples > in_stalls {
            out.push(format!("{base} {}", row.samples - in_stalls));
        }
        drawn += row.samples;
    }
    if r.total_samples > drawn {
        let more = r.total_rows.saturating_sub(r.rows.len() as u64);
        let lines = if more == 1 { "line" } else { "lines" };
        out.push(format!("({more} more source {lines}) {}", r.total_samples - drawn));
    }
    out
}

/// The flame graph of the folded stacks, as SVG.
pub fn svg(title: &str, folded: &[String]) -> Result<Vec<u8>> {
    let mut o = inferno::flamegraph::Options::default();
    o.title = title.to_string();
    o.count_name = "samples".into();
    o.name_type = "Frame:".into();
    // A C++ kernel's name says most at its start (`void at::native::reduce_kernel<...`), its
    // parameters come last: a frame too narrow for it keeps the start.
    o.text_truncate_direction = inferno::flamegraph::TextTruncateDirection::Right;
    // The same picture for the same samples, whatever the order of the rows.
    o.deterministic = true;
    o.hash = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut o, folded.iter().map(String::as_str), &mut svg)
        .context("drawing the flame graph")?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fold_into_function_line_and_stall_frames() {
        let row = |f: &str, file: &str, line: u32, samples: u64, stalls: &[(&str, u64)]| pb::PcProfileRow {
            function_name: f.into(),
            file: file.into(),
            line,
            samples,
            stalls: stalls.iter().map(|(r, n)| pb::StallCount { reason: r.to_string(), count: *n }).collect(),
            ..Default::default()
        };
        let r = pb::QueryPcSamplesResponse {
            rows: vec![
                row(
                    "gemm<128u>(float*)",
                    "/src/gemm.cu",
                    42,
                    30,
                    &[("smsp__pcsamp_warps_issue_stalled_long_scoreboard", 20), ("stalled_barrier", 8)],
                ),
                row("a;b", "", 0, 5, &[("", 5)]),
            ],
            total_samples: 40,
            total_rows: 3,
            ..Default::default()
        };
        assert_eq!(
            folded(&r),
            [
                "gemm<128u>(float*);gemm.cu:42;stalled_long_scoreboard 20",
                "gemm<128u>(float*);gemm.cu:42;stalled_barrier 8",
                "gemm<128u>(float*);gemm.cu:42 2",
                "a:b;(no line information);unknown 5",
                "(1 more source line) 5",
            ]
        );
        let svg = String::from_utf8(svg("t", &folded(&r)).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml") && svg.contains("gemm&lt;128u&gt;(float*)"), "{svg}");
    }
}
