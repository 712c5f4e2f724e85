//! The source tree stays readable: small hand-written files, generated files that name their
//! generator, one crate that declares CUPTI, and crates whose modules do not call each other
//! in circles.

use std::collections::BTreeSet;
use std::path::Path;

use gpuprof_testkit::layout::{cycles, folder_graph, generator, module_folders, module_graph, repo_root, rust_files};

/// Longest hand-written Rust file, in lines.
const MAX_LINES: usize = 600;

fn rel(p: &Path) -> String {
    p.strip_prefix(repo_root()).unwrap_or(p).display().to_string()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn hand_written_rust_files_stay_under_600_lines() {
    let root = repo_root();
    let files = rust_files(&root);
    assert!(files.len() > 50, "the walk found the sources ({} files)", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let text = read(p);
            let n = text.lines().count();
            (n > MAX_LINES && generator(&text).is_none()).then(|| format!("{} ({n} lines)", rel(p)))
        })
        .collect();
    assert!(long.is_empty(), "split these by job (at most {MAX_LINES} lines each): {long:#?}");
}

#[test]
fn generated_files_name_a_generator_in_the_repo() {
    let root = repo_root();
    let mut generated = 0;
    for p in rust_files(&root) {
        let text = read(&p);
        if let Some(g) = generator(&text) {
            generated += 1;
            assert!(root.join(g).is_file(), "{} names generator {g}, which is not in the repo", rel(&p));
        }
    }
    assert!(generated >= 3, "the CUPTI bindings and callback-id names are generated ({generated} found)");
}

#[test]
fn only_the_cupti_bindings_declare_cupti_functions() {
    let declaring: Vec<String> = rust_files(&repo_root())
        .into_iter()
        .filter(|p| {
            // Spelled in two halves so that this file does not match itself.
            let name = concat!("cuptiActivity", "Enable");
            let t = read(p);
            t.contains(&format!("fn {name}(")) || t.contains(&format!("{name}: "))
        })
        .map(|p| rel(&p))
        .collect();
    assert_eq!(declaring, vec!["cupti/src/sys/cupti.rs".to_string()]);
}

#[test]
fn the_old_cupti_variable_name_is_only_the_loaders_alias() {
    let word = concat!("GPUPROF_CUPTI", "_LIB"); // in two halves: this file does not match itself
    let mut places = BTreeSet::new();
    for p in rust_files(&repo_root()) {
        let t = read(&p);
        let mut rest = t.as_str();
        while let Some(i) = rest.find(word) {
            let after = rest[i + word.len()..].chars().next();
            if !after.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                places.insert(rel(&p));
            }
            rest = &rest[i + word.len()..];
        }
    }
    assert_eq!(places, BTreeSet::from(["cupti/src/loader.rs".to_string()]));
}

fn assert_acyclic(crate_dir: &str, min_modules: usize) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let g = module_graph(&repo_root().join(crate_dir).join("src"));
    assert!(g.len() >= min_modules, "{crate_dir}: modules found: {:?}", g.keys());
    let c = cycles(&g);
    assert!(c.is_empty(), "{crate_dir}: modules that use each other in a circle: {c:?}\ngraph: {g:#?}");
    g
}

#[test]
fn daemon_modules_form_no_cycles_and_leaves_stay_leaves() {
    let g = assert_acyclic("daemon", 20);
    // Shared types and helpers everything else may use; they use nothing of the daemon.
    for leaf in ["catalog", "clock", "error", "config", "registry", "cbid"] {
        assert!(g.get(leaf).is_some_and(|u| u.is_empty()), "{leaf} must stay a leaf, uses {:?}", g.get(leaf));
    }
    // Rollups are written in one place and read in another: the writer side knows no reader.
    assert!(!g["rollup"].contains("query"), "rollup must not use query: {:?}", g["rollup"]);
}

#[test]
fn injector_cupti_and_sampler_modules_form_no_cycles() {
    assert_acyclic("injector", 10);
    assert_acyclic("cupti", 8);
    assert_acyclic("sampler", 1);
}

#[test]
fn client_modules_form_layers() {
    let g = assert_acyclic("client", 10);
    // The bottom layer: what every command uses, using no command.
    for leaf in ["output", "outfile"] {
        assert!(g.get(leaf).is_some_and(|u| u.is_empty()), "{leaf} must stay a leaf, uses {:?}", g.get(leaf));
    }
    assert_eq!(g["flame"], BTreeSet::from(["output".to_string()]), "flame draws and asks nothing");
}

/// Inside each module folder of the daemon, the injector, the CUPTI crate, the client and the
/// protocol crate, the files (and subfolders) use each other in no circle either: a folder's
/// parts form layers too.
#[test]
fn module_folders_form_no_file_level_cycles() {
    let mut found = Vec::new();
    let mut checked = 0;
    for krate in ["daemon", "injector", "cupti", "client", "proto"] {
        let src = repo_root().join(krate).join("src");
        for (dir, module_path) in module_folders(&src) {
            let rel_dir = rel(&dir);
            checked += 1;
            let c = cycles(&folder_graph(&dir, &module_path));
            if !c.is_empty() {
                found.push(format!("{rel_dir}: {c:?}"));
            }
        }
    }
    assert!(checked >= 10, "module folders checked: {checked}");
    assert!(found.is_empty(), "files that use each other in a circle:\n{}", found.join("\n"));
}

/// The tracer's files call each other one way: `hooks` (the process's one CUPTI subscriber)
/// calls what `pc` and `detach` registered with it instead of naming them.
#[test]
fn the_injectors_tracer_files_form_no_cycles() {
    let g = folder_graph(&repo_root().join("injector/src/tracer"), "crate::tracer::");
    assert!(g.len() >= 7, "tracer files found: {:?}", g.keys());
    let c = cycles(&g);
    assert!(c.is_empty(), "tracer files that use each other in a circle: {c:?}\ngraph: {g:#?}");
    assert!(g["hooks"].is_empty(), "hooks must stay a leaf, uses {:?}", g["hooks"]);
    assert!(g["cupti_backend"].contains("detach") && g["detach"].contains("hooks"), "read the super:: paths: {g:?}");
}

/// Only gpuprof-cupti names the generated bindings; other crates use its typed API and the
/// constants and layouts of `gpuprof_cupti::ids`.
#[test]
fn only_the_cupti_crate_names_its_raw_bindings() {
    let root = repo_root();
    let raw = concat!("gpuprof_cupti", "::sys"); // in two halves: this file does not match itself
    let naming: Vec<String> = rust_files(&root)
        .into_iter()
        .filter(|p| !p.starts_with(root.join("cupti")) && read(p).contains(raw))
        .map(|p| rel(&p))
        .collect();
    assert!(naming.is_empty(), "use gpuprof_cupti's typed API or gpuprof_cupti::ids instead: {naming:?}");
}

/// The injector's files that may use `unsafe`: the C ABI exports, libc calls (at exit: vouching
/// that PC sampling's contexts are alive), the buffer pool, the CUPTI callbacks and the runtime
/// hook. Everything else goes through gpuprof-cupti's safe wrappers (PC sampling included: its
/// calls take a callback's `LiveContext`).
const INJECTOR_UNSAFE: &[&str] =
    &["injector/src/exports.rs", "injector/src/pool.rs", "injector/src/sys.rs", "injector/src/tracer/callbacks.rs"];

#[test]
fn unsafe_code_is_allowed_only_in_the_listed_injector_files() {
    let root = repo_root();
    let allowing: Vec<String> = rust_files(&root.join("injector/src"))
        .into_iter()
        .filter(|p| read(p).contains(concat!("allow(", "unsafe_code)")))
        .map(|p| rel(&p))
        .collect();
    assert_eq!(allowing, INJECTOR_UNSAFE, "unsafe code belongs behind gpuprof-cupti's wrappers");
}

/// gpuprof-cupti's public `unsafe fn`s: each has a contract only the caller can keep (a live
/// context, a buffer kept until disable, a completed buffer, a callback's own arguments).
#[test]
fn cuptis_public_unsafe_functions_are_the_listed_ones() {
    let root = repo_root();
    let mut found = BTreeSet::new();
    for p in rust_files(&root.join("cupti/src")) {
        if p.starts_with(root.join("cupti/src/sys")) {
            continue;
        }
        for line in read(&p).lines() {
            if let Some(rest) = line.trim_start().strip_prefix("pub unsafe fn ") {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                found.insert(format!("{}::{name}", p.file_stem().unwrap_or_default().to_string_lossy()));
            }
        }
    }
    let expected: BTreeSet<String> =
        ["activity::for_each_record", "callback::assume", "callback::from_raw"].iter().map(|s| s.to_string()).collect();
    assert_eq!(found, expected, "a new public unsafe fn: make it safe, or list it here with its contract");
}

/// The modules that still take the whole `Daemon` (`lib.rs`) instead of the configuration and
/// handles they use; none may be added. Only `api` and `runtime` keep it.
const DAEMON_USERS: &[&str] = &["api.rs", "runtime.rs"];

#[test]
fn no_more_modules_take_the_whole_daemon() {
    let src = repo_root().join("daemon/src");
    let using: Vec<String> = rust_files(&src)
        .into_iter()
        .filter(|p| !p.ends_with("tests.rs") && !p.components().any(|c| c.as_os_str() == "tests"))
        .filter(|p| {
            let code = read(p);
            // `crate::Daemon`, or `Daemon` among the items of a `crate::{...}` group.
            code.contains("crate::Daemon")
                || code
                    .split("crate::{")
                    .skip(1)
                    .any(|g| g.split('}').next().unwrap_or_default().split(',').any(|item| item.trim() == "Daemon"))
        })
        .map(|p| p.strip_prefix(&src).unwrap_or(&p).display().to_string())
        .collect();
    let new: Vec<&String> = using.iter().filter(|f| !DAEMON_USERS.contains(&f.as_str())).collect();
    assert!(new.is_empty(), "pass these the configuration and handles they use, not the Daemon: {new:?}");
    let gone: Vec<&&str> = DAEMON_USERS.iter().filter(|f| !using.iter().any(|u| u == *f)).collect();
    assert!(gone.is_empty(), "these no longer take the Daemon: take them off DAEMON_USERS: {gone:?}");
}

/// Long-lived tasks start in `runtime`; the other modules that spawn do so per connection or
/// per stream, for as long as that connection or stream lives.
#[test]
fn long_lived_daemon_tasks_start_in_runtime() {
    // Tasks and threads per connection or per request, ended with it.
    let per_connection = ["agent.rs", "pmstream.rs", "prometheus.rs", "export/out.rs"];
    // The writer's WAL-checkpoint thread: started and joined by the writer thread itself.
    let writer_helper = ["ingest/writer.rs"];
    let src = repo_root().join("daemon/src");
    let mut spawning = BTreeSet::new();
    for p in rust_files(&src) {
        let rel = p.strip_prefix(&src).unwrap_or(&p).display().to_string();
        if rel.ends_with("tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let code: String =
            read(&p).lines().take_while(|l| !l.trim_start().starts_with("#[cfg(test)]")).collect::<Vec<_>>().join("\n");
        let starts = ["tokio::spawn(", "tokio::task::spawn(", "std::thread::spawn(", "thread::Builder::new("];
        if starts.iter().any(|s| code.contains(s)) {
            spawning.insert(rel);
        }
    }
    let unexpected: Vec<&String> = spawning
        .iter()
        .filter(|f| *f != "runtime.rs" && !per_connection.contains(&f.as_str()) && !writer_helper.contains(&f.as_str()))
        .collect();
    assert!(unexpected.is_empty(), "tasks or threads started outside runtime.rs: {unexpected:?}");
    assert!(spawning.contains("runtime.rs"), "runtime.rs starts the tasks: {spawning:?}");
}

/// Every file and folder under the repository (relative, `/`-separated), as `rust_files` walks.
fn all_paths(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || ["target", "node_modules", "venv", "build"].contains(&name.as_str()) {
                continue;
            }
            out.insert(rel(&e.path()));
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    out
}

/// ARCHITECTURE.md names files and folders as they are: every `code span` that looks like a
/// path (`daemon/src/store.rs`, `ingest/writer.rs`, `sessions/`, `lib.rs`) is one in the tree.
#[test]
fn the_paths_architecture_md_names_exist() {
    let root = repo_root();
    let paths = all_paths(&root);
    let doc = read(&root.join("ARCHITECTURE.md"));
    let exts = [".rs", ".sql", ".toml", ".sh", ".py", ".proto", ".md", ".cu", ".c"];
    let mut checked = 0;
    let mut missing = BTreeSet::new();
    for (i, span) in doc.split('`').enumerate() {
        let looks_like_path = i % 2 == 1
            && !span.is_empty()
            && !span.starts_with('.')
            && span.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
            && (exts.iter().any(|e| span.ends_with(e)) || (span.ends_with('/') && span.len() > 1));
        if !looks_like_path {
            continue;
        }
        checked += 1;
        let want = span.trim_end_matches('/');
        let found = paths.iter().any(|p| {
            p == want || p.ends_with(&format!("/{want}")) || (!want.contains('/') && p.rsplit('/').next() == Some(want))
        });
        if !found {
            missing.insert(span.to_string());
        }
    }
    assert!(checked > 80, "the check found the paths ({checked})");
    assert!(missing.is_empty(), "ARCHITECTURE.md names paths that are not in the tree: {missing:?}");
}

/// Whether a source file is a test (an integration test, a `tests.rs` or a `tests/` module).
fn is_test(rel: &str) -> bool {
    rel.starts_with("tests/tests/") || rel.contains("/tests/") || rel.ends_with("/tests.rs")
}

/// The record kinds are defined once, in the daemon's catalogue (`daemon/src/catalog.rs`) on top
/// of the protocol's `proto/src/kinds.rs`: other code takes its lists of kinds from there. A
/// kind's name stays only where the code does something of that kind's own (its SQL columns,
/// labels, a CLI's rows), in the files below; a new place that needs a list of the kinds imports
/// it instead.
#[test]
fn record_kinds_are_listed_only_in_the_catalogue() {
    let allowed: BTreeSet<&str> = [
        "proto/src/kinds.rs",
        // Per-kind SQL, labels and Parquet columns.
        "daemon/src/export/chrome.rs",
        "daemon/src/export/flows.rs",
        "daemon/src/export/parquet_files.rs",
        "daemon/src/export/perfetto.rs",
        "daemon/src/export/scan.rs",
        "daemon/src/query/filter.rs",
        "daemon/src/query/records.rs",
        "daemon/src/query/summary.rs",
        "daemon/src/rollup.rs",
        // The CLI's rows of each kind; the tracer's config names the CUPTI kinds it enables.
        "client/src/records.rs",
        "injector/src/tracer/trace_config.rs",
    ]
    .into();
    let mut naming = BTreeSet::new();
    for p in rust_files(&repo_root()) {
        let r = rel(&p);
        if is_test(&r) {
            continue;
        }
        let t = read(&p);
        // Kinds named nowhere else than in kind-specific code.
        if ["memset", "overhead", "external_correlation"].iter().any(|k| t.contains(&format!("\"{k}\""))) {
            naming.insert(r);
        }
    }
    let extra: Vec<&String> = naming.iter().filter(|r| !allowed.contains(r.as_str())).collect();
    assert!(
        extra.is_empty(),
        "these files name record kinds: take the lists from gpuprofd::catalog or gpuprof_proto::kinds \
         (or, for code of one kind's own, add the file here): {extra:?}"
    );
    assert!(naming.contains("proto/src/kinds.rs"), "the check finds the names: {naming:?}");
}

/// Per-kind arrays (stats, counters, buffers) are sized by `Kind::COUNT` or
/// `gpuprof_proto::kinds::SLOTS`, never by a number that goes stale when a kind is added.
#[test]
fn per_kind_arrays_are_not_sized_by_a_number() {
    let count = gpuprof_testkit::kinds::COUNT;
    let mut magic = Vec::new();
    for dir in ["daemon/src", "proto/src", "injector/src/convert", "tests/src"] {
        for p in rust_files(&repo_root().join(dir)) {
            let r = rel(&p);
            if is_test(&r) {
                continue;
            }
            for (i, line) in read(&p).lines().enumerate() {
                for part in line.split('[').skip(1) {
                    let Some((ty, n)) = part.split(']').next().and_then(|a| a.split_once("; ")) else { continue };
                    let counter = ["u64", "AtomicU64", "KindCounters", "0", "0u64"].contains(&ty.trim());
                    if counter && n.parse::<usize>().is_ok_and(|n| (count..=count + 2).contains(&n)) {
                        magic.push(format!("{r}:{}: {}", i + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(magic.is_empty(), "size these by Kind::COUNT or gpuprof_proto::kinds::SLOTS: {magic:#?}");
}
