//! A session's PC samples as a flame graph: `gpuprofctl export SESSION -o pc.svg` (the format
//! from the name, or `--format svg`), frames function → source line → stall reason, names as
//! c++filt writes them; bad requests refused in words.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::Result;
use gpuprof_testkit::pc_agent::{FakePc, PcAgent, PcCommand, ctl_ok, start_daemon, start_session};

const GEMM: &str = "_Z9gemm_tileILi128EEvPKfS1_Pfi";
const ADD: &str =
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_";
const GEMM_SHOWN: &str = "void gemm_tile<128>(float const*, float const*, float*, int)";
const ADD_SHOWN: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, \
                         std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)";
const LSB: &str = "smsp__pcsamp_warps_issue_stalled_long_scoreboard";
const BAR: &str = "smsp__pcsamp_warps_issue_stalled_barrier";

/// The `<title>` texts of an SVG (a frame's tooltip: "name (N samples, P%)"), failing on XML
/// that does not parse.
fn titles(svg: &str) -> Vec<String> {
    let mut r = quick_xml::Reader::from_str(svg);
    let (mut out, mut in_title) = (Vec::new(), false);
    loop {
        match r.read_event().unwrap_or_else(|e| panic!("not XML at {}: {e}", r.buffer_position())) {
            quick_xml::events::Event::Start(e) => {
                in_title = e.name().as_ref() == b"title";
                if in_title {
                    out.push(String::new());
                }
            }
            quick_xml::events::Event::Text(t) if in_title => {
                out.last_mut().unwrap().push_str(&t.decode().unwrap());
            }
            quick_xml::events::Event::GeneralRef(g) if in_title => {
                // Entities (&lt; &gt; &amp;) come between the text's parts.
                let name: &[u8] = g.as_ref();
                let s = match name {
                    b"lt" => "<",
                    b"gt" => ">",
                    b"amp" => "&",
                    b"quot" => "\"",
                    b"apos" => "'",
                    other => panic!("entity {}", String::from_utf8_lossy(other)),
                };
                out.last_mut().unwrap().push_str(s);
            }
            quick_xml::events::Event::End(_) => in_title = false,
            quick_xml::events::Event::Eof => break,
            _ => {}
        }
    }
    out
}

/// The samples of the frames named `name`, as their titles give them ("name (1,100 samples,
/// 78.57%)"), fewest first.
fn counts_of(titles: &[String], name: &str) -> Vec<u64> {
    let prefix = format!("{name} (");
    let mut n: Vec<u64> = titles
        .iter()
        .filter_map(|t| t.strip_prefix(&prefix)?.split(' ').next()?.replace(',', "").parse().ok())
        .collect();
    n.sort_unstable();
    n
}

/// The samples of the one frame named `name`.
fn samples_of(titles: &[String], name: &str) -> Option<u64> {
    match counts_of(titles, name)[..] {
        [n] => Some(n),
        [] => None,
        ref more => panic!("{name}: {} frames ({more:?})", more.len()),
    }
}

#[test]
fn pc_samples_export_as_a_flame_graph() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let mut a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling", "--pc-period", "11"]);
    assert!(matches!(a.command(Duration::from_secs(5))?, PcCommand::Start(_)));
    a.batch(
        id,
        0,
        &[
            FakePc::new(GEMM, 0x100, LSB, 900, "/src/gemm.cu", 42),
            FakePc::new(GEMM, 0x100, BAR, 100, "/src/gemm.cu", 42),
            FakePc::new(GEMM, 0x180, BAR, 300, "/src/gemm.cu", 57),
            FakePc::new(ADD, 0x20, LSB, 250, "", 0),
        ],
        0,
    )?;
    let sid = id.to_string();
    let t = Instant::now();
    while !ctl_ok(&d, &["pc", "top", &sid]).contains("1550 PC samples") {
        assert!(t.elapsed() < Duration::from_secs(10), "the samples are stored");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The format from the file name.
    let path = dir.path().join("pc.svg");
    let out = ctl_ok(&d, &["export", &sid, "-o", path.to_str().unwrap()]);
    assert!(out.contains("1550 PC samples"), "{out}");
    let svg = std::fs::read_to_string(&path)?;
    if let Some(keep) = std::env::var_os("GPUPROF_KEEP_FLAMEGRAPH") {
        std::fs::write(keep, &svg)?; // to look at it
    }
    let t = titles(&svg);
    // The top function is gemm, the widest frame above the root; its lines and stalls above it.
    assert_eq!(samples_of(&t, GEMM_SHOWN), Some(1300), "{t:#?}");
    assert_eq!(samples_of(&t, ADD_SHOWN), Some(250), "names as c++filt writes them: {t:#?}");
    assert_eq!(samples_of(&t, "gemm.cu:42"), Some(1000), "{t:#?}");
    assert_eq!(samples_of(&t, "gemm.cu:57"), Some(300), "{t:#?}");
    assert_eq!(samples_of(&t, "(no line information)"), Some(250), "{t:#?}");
    assert_eq!(counts_of(&t, "stalled_long_scoreboard"), [250, 900], "{t:#?}");
    assert_eq!(counts_of(&t, "stalled_barrier"), [100, 300], "{t:#?}");
    assert!(!svg.contains("smsp__pcsamp") && !svg.contains(GEMM), "stalls shortened, names demangled");

    // --format svg to stdout, and the same picture.
    let o = d.ctl(&["export", &sid, "--format", "svg", "-o", "-"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8(o.stdout)?, svg, "the same samples draw the same picture");
    // --name: one function.
    let o = d.ctl(&["export", &sid, "--format", "svg", "--name", "*gemm_tile*", "-o", "-"]);
    let only = titles(&String::from_utf8(o.stdout)?);
    assert_eq!(samples_of(&only, GEMM_SHOWN), Some(1300));
    assert_eq!(samples_of(&only, ADD_SHOWN), None);

    // Bad requests: a filter the picture cannot honour, a session without PC samples.
    let o = d.ctl(&["export", &sid, "--device", "0", "-o", dir.path().join("x.svg").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("takes --name"), "{o:?}");
    let o = d.ctl(&["export", &sid, "--name", "nothing*", "-o", dir.path().join("y.svg").to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no PC samples"), "{o:?}");
    assert!(!dir.path().join("y.svg").exists());
    Ok(())
}
