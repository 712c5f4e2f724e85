//! Which of CUPTI's stall reasons a session collects.

use gpuprof_cupti::pcsampling::StallReasons;

/// CUPTI's prefix of every stall reason name.
pub const STALL_PREFIX: &str = "smsp__pcsamp_warps_issue_";

/// The stall indexes to configure for the requested names (empty request: all) and the
/// requested names that matched none. A name matches CUPTI's with or without the prefix, and
/// also its "_not_issued" variant.
pub fn select_stalls(reasons: &StallReasons, wanted: &[String]) -> (Vec<u32>, Vec<String>) {
    if wanted.is_empty() {
        // Every reason but the "_not_issued" variants, which count the same samples again.
        let idx = reasons
            .index
            .iter()
            .zip(&reasons.names)
            .filter(|(_, n)| !n.ends_with("_not_issued"))
            .map(|(i, _)| *i)
            .collect();
        return (idx, Vec::new());
    }
    let mut idx = Vec::new();
    let mut unknown = Vec::new();
    for w in wanted {
        let w = w.strip_prefix(STALL_PREFIX).unwrap_or(w);
        let mut hit = false;
        for (i, n) in reasons.index.iter().zip(&reasons.names) {
            let short = n.strip_prefix(STALL_PREFIX).unwrap_or(n);
            if (short == w || short.strip_suffix("_not_issued") == Some(w)) && !idx.contains(i) {
                idx.push(*i);
                hit = true;
            }
        }
        if !hit {
            unknown.push(w.to_string());
        }
    }
    (idx, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_selection_accepts_short_and_full_names() {
        let r = StallReasons {
            index: vec![1, 2, 3],
            names: vec![
                format!("{STALL_PREFIX}stalled_long_scoreboard"),
                format!("{STALL_PREFIX}stalled_long_scoreboard_not_issued"),
                format!("{STALL_PREFIX}stalled_barrier"),
            ],
        };
        let (i, u) = select_stalls(&r, &["stalled_long_scoreboard".into(), "nope".into()]);
        assert_eq!(i, vec![1, 2]);
        assert_eq!(u, vec!["nope".to_string()]);
        let (i, u) = select_stalls(&r, &[format!("{STALL_PREFIX}stalled_barrier")]);
        assert_eq!((i, u.len()), (vec![3], 0));
        assert_eq!(select_stalls(&r, &[]), (vec![1, 3], vec![]), "all but the _not_issued variants");
    }
}
