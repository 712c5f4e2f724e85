//! Differential flame graphs of a diff (`diff -o diff.svg`, `pc diff -o diff.svg`): each side's
//! folded stacks made from the diff's rows, merged by inferno's `differential` (one line per
//! stack with a's count and b's) and drawn by its flame graph, which colours a frame red where b
//! has more than a and blue where it has less. Frame widths are b's.

use anyhow::{Context, Result};
use gpuprofctl::pb;

use crate::output::short_stall;

/// A frame name as inferno's folded format allows it (`;` separates frames).
fn frame(s: &str) -> String {
    let s = if s.is_empty() { "(unknown)" } else { s };
    s.replace(';', ":")
}

/// The folded stacks of both sides of a kernel diff: one frame per kernel, its GPU time in ns.
pub fn kernel_folded(r: &pb::DiffSummaryResponse) -> (Vec<String>, Vec<String>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for k in &r.kernels {
        if k.total_ns_a > 0 {
            a.push(format!("{} {}", frame(&k.name), k.total_ns_a));
        }
        if k.total_ns_b > 0 {
            b.push(format!("{} {}", frame(&k.name), k.total_ns_b));
        }
    }
    (a, b)
}

/// The folded stacks of both sides of a PC diff: function, then source line (by line) or the
/// stall reason alone (by stall), in samples.
pub fn pc_folded(r: &pb::DiffPcSamplesResponse) -> (Vec<String>, Vec<String>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for row in &r.rows {
        let stack = if !row.stall_reason.is_empty() {
            frame(short_stall(&row.stall_reason))
        } else if !row.file.is_empty() || row.line != 0 {
            let base = row.file.rsplit('/').next().unwrap_or(&row.file);
            format!("{};{}", frame(&row.function_name), frame(&format!("{base}:{}", row.line)))
        } else {
            frame(&row.function_name)
        };
        if row.samples_a > 0 {
            a.push(format!("{stack} {}", row.samples_a));
        }
        if row.samples_b > 0 {
            b.push(format!("{stack} {}", row.samples_b));
        }
    }
    (a, b)
}

/// Draws a differential flame graph of two sides' folded stacks; `normalize` scales a's counts
/// to b's total first (PC samples, compared as shares).
pub fn draw(title: &str, count_name: &str, a: &[String], b: &[String], normalize: bool) -> Result<Vec<u8>> {
    let (a, b) = (a.join("\n"), b.join("\n"));
    let mut merged = Vec::new();
    let opt = inferno::differential::Options { normalize, strip_hex: false };
    inferno::differential::from_readers(opt, a.as_bytes(), b.as_bytes(), &mut merged)
        .context("merging the two sides' stacks")?;
    let merged = String::from_utf8_lossy(&merged);
    let mut o = inferno::flamegraph::Options::default();
    o.title = title.to_string();
    o.subtitle = Some("red: more in b than in a, blue: less; widths are b's".into());
    o.count_name = count_name.into();
    o.name_type = "Frame:".into();
    o.text_truncate_direction = inferno::flamegraph::TextTruncateDirection::Right;
    o.deterministic = true;
    let mut lines: Vec<&str> = merged.lines().collect();
    // inferno's merge writes in hash order: sorted, the same sides draw the same picture.
    lines.sort_unstable();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut o, lines, &mut svg).context("drawing the flame graph")?;
    Ok(svg)
}

/// The differential flame graph of a kernel diff.
pub fn kernels_svg(r: &pb::DiffSummaryResponse) -> Result<Vec<u8>> {
    let (a, b) = kernel_folded(r);
    if b.is_empty() {
        anyhow::bail!("{} has no kernel time to draw", r.label_b);
    }
    draw(&format!("gpuprof diff: {} → {} (GPU time)", r.label_a, r.label_b), "ns", &a, &b, false)
}

/// The differential flame graph of a PC diff.
pub fn pc_svg(r: &pb::DiffPcSamplesResponse) -> Result<Vec<u8>> {
    let (a, b) = pc_folded(r);
    if b.is_empty() {
        anyhow::bail!("{} has no PC samples to draw", r.label_b);
    }
    draw(
        &format!("gpuprof pc diff: {} → {} (PC samples, a scaled to b)", r.label_a, r.label_b),
        "samples",
        &a,
        &b,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_diff_draws_red_and_blue() {
        let k = |name: &str, a: u64, b: u64| pb::KernelDiff {
            name: name.into(),
            total_ns_a: a,
            total_ns_b: b,
            ..Default::default()
        };
        let r = pb::DiffSummaryResponse {
            label_a: "session 1".into(),
            label_b: "session 2".into(),
            kernels: vec![k("gemm<1>;x", 100, 200), k("old", 50, 0), k("new", 0, 70), k("shrunk", 100, 40)],
            ..Default::default()
        };
        let (a, b) = kernel_folded(&r);
        assert_eq!(a, ["gemm<1>:x 100", "old 50", "shrunk 100"]);
        assert_eq!(b, ["gemm<1>:x 200", "new 70", "shrunk 40"]);
        let svg = String::from_utf8(kernels_svg(&r).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml") && svg.contains("gemm&lt;1&gt;:x"), "{svg}");
        // Differential colours: a frame that grew is red (rgb(255,...)), one that shrank blue.
        assert!(svg.contains("rgb(255,"), "no red frame");
        assert!(svg.contains(",255)"), "no blue frame");
    }
}
