//! `gpuprofctl export`: a session to a file, or to stdout, in the format its name or
//! `--format` asks for; Parquet to one file per record kind in a directory; the SVG flame graph
//! of its PC samples, drawn here (`flame`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use gpuprofctl::{Client, pb};

use crate::outfile::{PartPath, part_file};
use crate::output::{Usage, WrongState, human_bytes};
use crate::records::FilterArgs;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Chrome trace JSON (.json): ui.perfetto.dev, chrome://tracing.
    Chrome,
    /// Chrome trace JSON, gzipped (.json.gz); ui.perfetto.dev opens it as it is.
    ChromeGz,
    /// Perfetto's protobuf trace (.pftrace, .perfetto-trace): ui.perfetto.dev, trace_processor.
    Perfetto,
    /// A standalone SQLite database (.sqlite, .sqlite3, .db).
    Sqlite,
    /// The session's PC samples as a gzipped pprof profile (.pb.gz, .pprof): go tool pprof,
    /// Pyroscope, Speedscope.
    Pprof,
    /// Apache Parquet, one file per record kind present (kernel.parquet, api.parquet, ...) in
    /// the directory `-o` names (created if missing; files of the same names are replaced):
    /// DuckDB, Spark, ClickHouse, pandas.
    Parquet,
    /// The session's PC samples as a flame graph (.svg; function, source line, stall reason),
    /// for a browser.
    Svg,
}

/// File name endings and the format each means, longest first.
const ENDINGS: &[(&str, Format)] = &[
    (".pb.gz", Format::Pprof),
    (".pprof", Format::Pprof),
    (".perfetto-trace", Format::Perfetto),
    (".pftrace", Format::Perfetto),
    (".json.gz", Format::ChromeGz),
    (".json", Format::Chrome),
    (".sqlite3", Format::Sqlite),
    (".sqlite", Format::Sqlite),
    (".db", Format::Sqlite),
    (".svg", Format::Svg),
];

/// The format a file name asks for.
pub fn format_of(path: &Path) -> Result<Format, Usage> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_ascii_lowercase();
    ENDINGS.iter().find(|(end, _)| name.ends_with(end)).map(|(_, f)| *f).ok_or_else(|| {
        Usage(format!(
            "-o {}: cannot tell the format from the name; use --format, or a name ending in \
             .json (chrome), .json.gz (chrome-gz), .pftrace or .perfetto-trace (perfetto), \
             .sqlite, .sqlite3 or .db (sqlite), .pb.gz or .pprof (pprof), .svg (svg); Parquet files go into a \
             directory: --format parquet -o DIR",
            path.display()
        ))
    })
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Session id.
    pub session: u64,
    /// Output file, written beside itself under a temporary name and then renamed; `-` writes
    /// to stdout. With `--format parquet`, the directory for the files.
    #[arg(short, long, value_name = "FILE|DIR")]
    pub output: PathBuf,
    /// File format (default: from the file name; chrome for `-o -`).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// No progress bar (there is one only when stderr is a terminal).
    #[arg(long, short)]
    pub quiet: bool,
    /// gzip level of chrome-gz (.json.gz), from 1 (fastest, the default: about an eighth of
    /// the JSON's size) to 9 (smallest, several times slower); 6 is gzip's own default.
    #[arg(long, value_name = "1-9", value_parser = clap::value_parser!(u32).range(1..=9))]
    pub gzip_level: Option<u32>,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// gzip level of chrome-gz without `--gzip-level` (and of a fleet trace's): level 1 keeps up with the daemon's export
/// (level 6 took about 4 times its CPU).
pub(crate) const GZIP_LEVEL: u32 = 1;

pub async fn export(c: &mut Client, a: ExportArgs, json: bool) -> Result<()> {
    let to_stdout = a.output.as_os_str() == "-";
    let format = match a.format {
        Some(f) => f,
        None if to_stdout => Format::Chrome,
        None => format_of(&a.output)?,
    };
    if a.gzip_level.is_some() && format != Format::ChromeGz {
        return Err(Usage(format!(
            "--gzip-level applies to chrome-gz (.json.gz) only, and this export is {}",
            format_name(format)
        ))
        .into());
    }
    if format == Format::Parquet {
        return export_parquet(c, a, json).await;
    }
    if format == Format::Svg {
        return export_svg(c, a, json).await;
    }
    let Some(wire) = format.wire() else { unreachable!("drawn by this client") };
    let req = pb::ExportTraceRequest {
        session_id: a.session,
        format: wire as i32,
        filter: Some(a.filter.to_pb()?),
        gzip_level: if format == Format::ChromeGz { a.gzip_level.unwrap_or(0) } else { 0 },
    };
    let level = a.gzip_level.unwrap_or(GZIP_LEVEL);
    let (mut stream, gzip_here) = match c.export_trace(req.clone()).await {
        Ok(s) => (s.into_inner(), false),
        Err(s) if format == Format::ChromeGz && gpuprofctl::format_unknown_to_gpuprofd(&s, wire as i32) => {
            let req = pb::ExportTraceRequest { format: pb::ExportFormat::ChromeJson as i32, gzip_level: 0, ..req };
            (c.export_trace(req).await?.into_inner(), true)
        }
        Err(s) => return Err(s.into()),
    };
    let mut part = None;
    let sink: Box<dyn Write + Send> = if to_stdout {
        Box::new(std::io::stdout())
    } else {
        let (path, file) = part_file(&a.output)?;
        part = Some(path);
        Box::new(file)
    };
    let mut sink = if gzip_here { Sink::gzip(sink, level) } else { Sink::Plain(sink) };
    let progress = (!a.quiet && std::io::stderr().is_terminal()).then(progress_bar);
    let started = Instant::now();
    let dest = if to_stdout { "stdout".to_string() } else { a.output.display().to_string() };
    let writing = || format!("writing {dest}");
    let (mut bytes, mut events) = (0u64, 0u64);
    while let Some(m) = stream.message().await? {
        let n = m.data.len() as u64;
        sink.write(m.data).with_context(writing)?;
        bytes += n;
        events = m.events_written.max(events);
        if let Some(p) = &progress {
            p.set_length(m.events_total.max(events));
            p.set_position(events);
            p.set_message(human_bytes(bytes));
        }
    }
    sink.finish().with_context(writing)?;
    if let Some(p) = &progress {
        p.finish_and_clear();
    }
    if let (true, Some(part)) = (gzip_here, &part) {
        // The bytes of the file, as when gpuprofd gzips.
        bytes = std::fs::metadata(part.part()).map(|m| m.len()).unwrap_or(bytes);
    }
    if let Some(part) = part {
        part.commit()?;
    }
    let secs = started.elapsed().as_secs_f64();
    let file = if to_stdout { "-".to_string() } else { a.output.display().to_string() };
    let line = if json {
        serde_json::json!({"session": a.session, "file": file, "format": format_name(format),
            "bytes": bytes, "events": events, "seconds": secs})
        .to_string()
    } else {
        format!("wrote {file} ({events} events, {}) in {secs:.2} s", human_bytes(bytes))
    };
    // With `-o -` stdout is the trace itself.
    if to_stdout {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(())
}

impl Format {
    /// The format gpuprofd writes; None for the SVG flame graph, which this client draws.
    pub fn wire(self) -> Option<pb::ExportFormat> {
        Some(match self {
            Format::Chrome => pb::ExportFormat::ChromeJson,
            // gzipped by gpuprofd (by this client when gpuprofd is older than the format)
            Format::ChromeGz => pb::ExportFormat::ChromeJsonGz,
            Format::Perfetto => pb::ExportFormat::Perfetto,
            Format::Sqlite => pb::ExportFormat::Sqlite,
            // gzipped by gpuprofd already
            Format::Pprof => pb::ExportFormat::Pprof,
            Format::Parquet => pb::ExportFormat::Parquet,
            Format::Svg => return None,
        })
    }
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Chrome => "chrome",
        Format::ChromeGz => "chrome-gz",
        Format::Perfetto => "perfetto",
        Format::Sqlite => "sqlite",
        Format::Pprof => "pprof",
        Format::Parquet => "parquet",
        Format::Svg => "svg",
    }
}

/// Writes the flame graph of session `a.session`'s PC samples to `a.output` (`-`: stdout).
pub async fn export_svg(c: &mut Client, a: ExportArgs, json: bool) -> Result<()> {
    let f = &a.filter;
    if !f.processes.is_empty() || !f.devices.is_empty() || !f.streams.is_empty() || f.from.is_some() || f.to.is_some() {
        return Err(Usage(
            "--format svg draws all of a session's PC samples: of the filters it takes --name (a glob on the \
             function name) only"
                .into(),
        )
        .into());
    }
    let started = Instant::now();
    let r = crate::pc::query(c, a.session, crate::pc::By::Line, f.name.clone(), crate::flame::MAX_ROWS).await?;
    if r.total_samples == 0 {
        return Err(WrongState(format!(
            "session {} has no PC samples{} to draw (was it started with --pc-sampling? see gpuprofctl session show {})",
            a.session,
            if f.name.is_some() { " of functions matching --name" } else { "" },
            a.session
        ))
        .into());
    }
    let title = format!("gpuprof session {}: {} PC samples", a.session, r.total_samples);
    let svg = crate::flame::svg(&title, &crate::flame::folded(&r))?;
    let to_stdout = a.output.as_os_str() == "-";
    crate::outfile::write_file(&a.output, &svg)?;
    let secs = started.elapsed().as_secs_f64();
    let file = if to_stdout { "-".to_string() } else { a.output.display().to_string() };
    let line = if json {
        serde_json::json!({"session": a.session, "file": file, "format": "svg", "bytes": svg.len(),
            "samples": r.total_samples, "seconds": secs})
        .to_string()
    } else {
        format!("wrote {file} ({} PC samples, {}) in {secs:.2} s", r.total_samples, human_bytes(svg.len() as u64))
    };
    if to_stdout {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(())
}

/// One file of a Parquet export, as written.
struct Written {
    name: String,
    rows: u64,
    bytes: u64,
}

/// `--format parquet`: the files the daemon streams (each starts with a chunk naming it), each
/// written under a temporary name in the directory and renamed once complete.
async fn export_parquet(c: &mut Client, a: ExportArgs, json: bool) -> Result<()> {
    let dir = &a.output;
    if dir.as_os_str() == "-" {
        return Err(Usage(
            "--format parquet writes one file per record kind: -o must name a directory, not - (stdout)".into(),
        )
        .into());
    }
    if dir.exists() && !dir.is_dir() {
        return Err(Usage(format!(
            "-o {}: --format parquet writes one file per record kind into a directory, and this is a file",
            dir.display()
        ))
        .into());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut stream = c
        .export_trace(pb::ExportTraceRequest {
            session_id: a.session,
            format: pb::ExportFormat::Parquet as i32,
            filter: Some(a.filter.to_pb()?),
            gzip_level: 0,
        })
        .await?
        .into_inner();
    let progress = (!a.quiet && std::io::stderr().is_terminal()).then(progress_bar);
    let started = Instant::now();
    let mut files: Vec<Written> = Vec::new();
    // The file being written and its partial path; events_written when it started.
    let mut current: Option<(PartPath, std::io::BufWriter<std::fs::File>)> = None;
    let (mut bytes, mut events, mut events_before) = (0u64, 0u64, 0u64);
    while let Some(m) = stream.message().await? {
        if !m.file_name.is_empty() {
            finish_part(&mut current, dir, files.last())?;
            let name = safe_name(&m.file_name)?;
            current = Some(part_file(&dir.join(name))?);
            files.push(Written { name: name.to_string(), rows: 0, bytes: 0 });
            events_before = events;
        }
        let (Some((_, w)), Some(f)) = (current.as_mut(), files.last_mut()) else {
            anyhow::bail!("gpuprofd sent Parquet data before naming its file");
        };
        w.write_all(&m.data).with_context(|| format!("writing {}", dir.join(&f.name).display()))?;
        bytes += m.data.len() as u64;
        f.bytes += m.data.len() as u64;
        events = m.events_written.max(events);
        // events_written counts over the whole export: this file's rows are what it added.
        f.rows = events - events_before;
        if let Some(p) = &progress {
            p.set_length(m.events_total.max(events));
            p.set_position(events);
            p.set_message(human_bytes(bytes));
        }
    }
    finish_part(&mut current, dir, files.last())?;
    if let Some(p) = &progress {
        p.finish_and_clear();
    }
    let secs = started.elapsed().as_secs_f64();
    if json {
        let list: Vec<_> = files
            .iter()
            .map(|f| {
                serde_json::json!({"file": f.name, "path": dir.join(&f.name).display().to_string(),
                    "rows": f.rows, "bytes": f.bytes})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"session": a.session, "dir": dir.display().to_string(), "format": "parquet",
                "files": list, "bytes": bytes, "events": events, "seconds": secs})
        );
    } else {
        for f in &files {
            println!("wrote {} ({} rows, {})", dir.join(&f.name).display(), f.rows, human_bytes(f.bytes));
        }
        let none = if events == 0 { "; no records: the file has the columns and no rows" } else { "" };
        let n = files.len();
        println!(
            "wrote {n} Parquet file{} to {} ({events} events, {}) in {secs:.2} s{none}",
            if n == 1 { "" } else { "s" },
            dir.display(),
            human_bytes(bytes)
        );
    }
    Ok(())
}

/// Flushes the file being written and renames it into place.
fn finish_part(
    current: &mut Option<(PartPath, std::io::BufWriter<std::fs::File>)>,
    dir: &Path,
    file: Option<&Written>,
) -> Result<()> {
    let (Some((part, mut w)), Some(file)) = (current.take(), file) else { return Ok(()) };
    w.flush().with_context(|| format!("writing {}", dir.join(&file.name).display()))?;
    drop(w);
    part.commit()
}

/// A file name from gpuprofd, refused unless it is a plain name (no directories).
fn safe_name(name: &str) -> Result<&str> {
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    anyhow::ensure!(plain, "gpuprofd sent an unexpected file name {name:?}");
    Ok(name)
}

/// Where the export goes: the file or stdout, gzipped or not. gzip runs on a thread of its
/// own, so that the stream is received while a chunk is compressed (at most [`GZIP_QUEUE`]
/// chunks wait).
enum Sink {
    Plain(Box<dyn Write + Send>),
    Gzip { chunks: SyncSender<Vec<u8>>, thread: Option<JoinHandle<std::io::Result<Box<dyn Write + Send>>>> },
}

const GZIP_QUEUE: usize = 8;

impl Sink {
    fn gzip(w: Box<dyn Write + Send>, level: u32) -> Sink {
        let (chunks, rx) = sync_channel::<Vec<u8>>(GZIP_QUEUE);
        let thread = std::thread::spawn(move || {
            let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::new(level));
            for c in rx {
                gz.write_all(&c)?;
            }
            gz.finish()
        });
        Sink::Gzip { chunks, thread: Some(thread) }
    }

    fn write(&mut self, data: Vec<u8>) -> std::io::Result<()> {
        match self {
            Sink::Plain(w) => w.write_all(&data),
            Sink::Gzip { chunks, thread } => {
                if chunks.send(data).is_ok() {
                    return Ok(());
                }
                // The thread stops taking chunks only when writing failed: its error says why.
                match thread.take().map(join) {
                    Some(Err(e)) => Err(e),
                    _ => Err(std::io::Error::other("the gzip thread stopped")),
                }
            }
        }
    }

    /// Ends the gzip stream (its trailer) and flushes everything.
    fn finish(self) -> std::io::Result<()> {
        let mut w = match self {
            Sink::Plain(w) => w,
            Sink::Gzip { chunks, thread } => {
                drop(chunks);
                join(thread.ok_or_else(|| std::io::Error::other("the gzip thread stopped"))?)?
            }
        };
        w.flush()
    }
}

fn join<T>(t: JoinHandle<std::io::Result<T>>) -> std::io::Result<T> {
    t.join().map_err(|_| std::io::Error::other("the gzip thread panicked"))?
}

fn progress_bar() -> indicatif::ProgressBar {
    let p = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "[{bar:30}] {percent:>3}%  {pos}/{len} events  {msg}  {per_sec}  eta {eta}",
    ) {
        p.set_style(style.progress_chars("#>-"));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_from_names() {
        let f = |n: &str| format_of(Path::new(n)).ok();
        assert_eq!(f("a.json"), Some(Format::Chrome));
        assert_eq!(f("dir/A.JSON.GZ"), Some(Format::ChromeGz));
        assert_eq!(f("x.pftrace"), Some(Format::Perfetto));
        assert_eq!(f("x.perfetto-trace"), Some(Format::Perfetto));
        assert_eq!(f("x.db"), Some(Format::Sqlite));
        assert_eq!(f("x.sqlite"), Some(Format::Sqlite));
        assert_eq!(f("pc.SVG"), Some(Format::Svg));
        assert!(safe_name("kernel.parquet").is_ok());
        assert!(safe_name("../x.parquet").is_err() && safe_name("a/b").is_err() && safe_name("").is_err());
        let e = format_of(Path::new("trace.txt")).unwrap_err().0;
        assert!(e.contains(".json.gz") && e.contains(".pftrace") && e.contains("--format"), "{e}");
    }
}
