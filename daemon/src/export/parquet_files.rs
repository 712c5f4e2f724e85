//! The Parquet export: one Apache Parquet file per record kind present in the session
//! (`kernel.parquet`, `memcpy.parquet`, ...), for DuckDB, Spark, ClickHouse or pandas; a
//! session without records gets `kernel.parquet` with its columns and no rows.
//!
//! Columns are plain: the node's host name first (so that files from many nodes can be read
//! together), ids as integers, times as ns since the Unix epoch (`start_ns`, `end_ns`,
//! `duration_ns`), interned names as strings (kernel names demangled in `name`, as CUPTI
//! reported them in `mangled_name`), enums as their names beside the numbers. Each kind is
//! read with one cursor, from its `_data` table where it has one (see [`super::parquet_rows`]:
//! the columns' expressions below are resolved to the row, its track, process and shape, as
//! the view would join them), by SQL over its table otherwise (contexts, streams, PC samples);
//! rows go into Arrow builders of [`BATCH`] rows, handed to a second
//! thread that encodes and sends them (at most two batches between the two), and the Parquet
//! writer keeps at most one row group ([`ROW_GROUP`] rows) before its bytes go to the client, so
//! memory stays bounded whatever the session's size. Files are Snappy-compressed.

use std::borrow::Cow;
use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use gpuprof_proto::api as pb;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use rusqlite::types::Value;
use rusqlite::{Connection, params_from_iter};

use super::out::{CHUNK, Out, Stop, Tx, total_rows};
use super::parquet_rows::{plan, rows};
use crate::error::ApiError;
use crate::fasthash::FastMap;
use crate::query::{NAME_GLOB, copy_kind_name, names, sync_type_name, where_for};

/// Rows per Arrow record batch handed to the Parquet writer.
const BATCH: usize = 16 << 10;
/// Rows per Parquet row group (the writer buffers one).
pub(super) const ROW_GROUP: usize = 128 << 10;

/// How a selected integer becomes a column.
#[derive(Clone, Copy)]
enum Conv {
    /// The integer as it is.
    Int,
    /// 0 or 1 as a boolean.
    Bool,
    /// An interned string as shown (demangled when it is a mangled symbol; "" for 0).
    Name,
    /// An interned string as stored (as CUPTI reported it).
    Stored,
    /// A CUpti_ActivityMemcpyKind as "HtoD", "DtoH", ...
    CopyKind,
    /// A CUpti_ActivitySynchronizationType as "event", "stream", ...
    SyncType,
    /// An API domain as "runtime" or "driver".
    ApiDomain,
    /// `domain << 32 | cbid` as the API function's name.
    ApiName,
    /// The node's host name (the value is not used).
    Host,
    /// A process id as its job id ("" when it has none).
    JobId,
    /// A process id as its rank in its job (null when it has none).
    Rank,
}

/// One column: its name in the file, the SQL expression it is read from (table alias `t`,
/// its process `p`), and how the value is converted.
type Col = (&'static str, &'static str, Conv);

/// The columns every record kind starts with.
const COMMON: &[Col] = &[
    ("host", "0", Conv::Host),
    ("session_id", "t.session", Conv::Int),
    ("process_id", "t.proc", Conv::Int),
    ("pid", "p.pid", Conv::Int),
    ("job_id", "t.proc", Conv::JobId),
    ("rank", "t.proc", Conv::Rank),
];

/// Start, end and duration of timed records.
const TIMES: &[Col] = &[
    ("start_ns", "t.start + p.base_ns", Conv::Int),
    ("end_ns", "t.start + t.dur + p.base_ns", Conv::Int),
    ("duration_ns", "t.dur", Conv::Int),
];

/// The record kinds (tables) that become files, in file order.
pub(super) const KINDS: &[&str] = crate::catalog::PARQUET_KINDS;

/// The columns of a kind after [`COMMON`] (and [`TIMES`] if the catalogue says it is timed).
fn columns(kind: &str) -> &'static [Col] {
    match kind {
        "kernel" => &[
            ("device_id", "t.dev", Conv::Int),
            ("context_id", "t.ctx", Conv::Int),
            ("stream_id", "t.stream", Conv::Int),
            ("correlation_id", "t.corr", Conv::Int),
            ("name", "t.name", Conv::Name),
            ("mangled_name", "t.name", Conv::Stored),
            ("grid_x", "t.gx", Conv::Int),
            ("grid_y", "t.gy", Conv::Int),
            ("grid_z", "t.gz", Conv::Int),
            ("block_x", "t.bx", Conv::Int),
            ("block_y", "t.by", Conv::Int),
            ("block_z", "t.bz", Conv::Int),
            ("registers_per_thread", "t.regs", Conv::Int),
            ("static_shared_bytes", "t.ssmem", Conv::Int),
            ("dynamic_shared_bytes", "t.dsmem", Conv::Int),
            ("graph_node_id", "t.graph_node", Conv::Int),
        ],
        "memcpy" => &[
            ("device_id", "t.dev", Conv::Int),
            ("context_id", "t.ctx", Conv::Int),
            ("stream_id", "t.stream", Conv::Int),
            ("correlation_id", "t.corr", Conv::Int),
            ("bytes", "t.bytes", Conv::Int),
            ("direction", "t.kind", Conv::CopyKind),
            ("copy_kind", "t.kind", Conv::Int),
            ("src_memory_kind", "t.src_kind", Conv::Int),
            ("dst_memory_kind", "t.dst_kind", Conv::Int),
            ("src_device_id", "t.src_dev", Conv::Int),
            ("dst_device_id", "t.dst_dev", Conv::Int),
            ("is_async", "t.async", Conv::Bool),
            ("graph_node_id", "t.graph_node", Conv::Int),
        ],
        "memset" => &[
            ("device_id", "t.dev", Conv::Int),
            ("context_id", "t.ctx", Conv::Int),
            ("stream_id", "t.stream", Conv::Int),
            ("correlation_id", "t.corr", Conv::Int),
            ("bytes", "t.bytes", Conv::Int),
            ("value", "t.value", Conv::Int),
            ("memory_kind", "t.mem_kind", Conv::Int),
            ("graph_node_id", "t.graph_node", Conv::Int),
        ],
        "graph" => &[
            ("device_id", "t.dev", Conv::Int),
            ("context_id", "t.ctx", Conv::Int),
            ("stream_id", "t.stream", Conv::Int),
            ("correlation_id", "t.corr", Conv::Int),
            ("graph_id", "t.graph_id", Conv::Int),
        ],
        "api" => &[
            ("thread_id", "t.tid", Conv::Int),
            ("correlation_id", "t.corr", Conv::Int),
            ("domain", "t.domain", Conv::ApiDomain),
            ("name", "(t.domain << 32) | t.cbid", Conv::ApiName),
            ("cbid", "t.cbid", Conv::Int),
            ("return_code", "t.ret", Conv::Int),
        ],
        "sync" => &[
            ("sync_type", "t.type", Conv::SyncType),
            ("context_id", "t.ctx", Conv::Int),
            ("stream_id", "t.stream", Conv::Int),
            ("event_id", "t.event", Conv::Int),
            ("correlation_id", "t.corr", Conv::Int),
        ],
        "marker" => &[
            ("thread_id", "t.tid", Conv::Int),
            ("marker_id", "t.id", Conv::Int),
            ("name", "t.name", Conv::Name),
            ("domain", "t.domain", Conv::Name),
            ("is_mark", "t.is_mark", Conv::Bool),
        ],
        "collective" => &[
            ("thread_id", "t.tid", Conv::Int),
            ("name", "t.name", Conv::Name),
            ("seq", "t.seq", Conv::Int),
            ("communicator", "t.comm", Conv::Int),
            ("comm_rank", "t.rank", Conv::Int),
            ("comm_size", "t.nranks", Conv::Int),
            ("count", "t.count", Conv::Int),
            ("bytes", "t.bytes", Conv::Int),
            ("datatype", "t.dtype", Conv::Name),
            ("root", "t.root", Conv::Int),
            ("algorithm", "t.algo", Conv::Name),
            ("protocol", "t.proto", Conv::Name),
            ("channels", "t.channels", Conv::Int),
            ("gpu_offset_ns", "t.gpu_off", Conv::Int),
            ("gpu_duration_ns", "t.gpu_dur", Conv::Int),
        ],
        "overhead" => &[
            ("overhead_kind", "t.kind", Conv::Int),
            ("object_kind", "t.obj_kind", Conv::Int),
            ("object_id", "t.obj_id", Conv::Int),
        ],
        "external_correlation" => &[
            ("external_kind", "t.ext_kind", Conv::Int),
            ("external_id", "t.ext_id", Conv::Int),
            ("correlation_id", "t.corr", Conv::Int),
        ],
        "context" => &[
            ("context_id", "t.ctx", Conv::Int),
            ("device_id", "t.dev", Conv::Int),
            ("null_stream_id", "t.null_stream", Conv::Int),
        ],
        "stream" => &[
            ("stream_id", "t.stream", Conv::Int),
            ("context_id", "t.ctx", Conv::Int),
            ("priority", "t.priority", Conv::Int),
            ("flags", "t.flags", Conv::Int),
        ],
        // pc_sample: samples per (process, function, PC, stall reason), summed over the session.
        _ => &[
            ("function", "t.function", Conv::Name),
            ("mangled_function", "t.function", Conv::Stored),
            ("pc_offset", "t.pc", Conv::Int),
            ("stall_reason", "t.stall", Conv::Stored),
            ("module", "t.module", Conv::Stored),
            ("source_file", "t.file", Conv::Stored),
            ("line", "t.line", Conv::Int),
            ("samples", "t.count", Conv::Int),
        ],
    }
}

/// All columns of a kind, in file order.
fn all_columns(kind: &str) -> Vec<Col> {
    let own = columns(kind);
    let mut v = COMMON.to_vec();
    if crate::catalog::timed(kind) {
        // Times right after the common columns, before the kind's own.
        v.extend_from_slice(TIMES);
    }
    v.extend_from_slice(own);
    v
}

/// The Arrow schema of a kind's file.
fn schema(cols: &[Col]) -> Arc<Schema> {
    Arc::new(Schema::new(
        cols.iter()
            .map(|(name, _, conv)| {
                let t = match conv {
                    Conv::Int | Conv::Rank => DataType::Int64,
                    Conv::Bool => DataType::Boolean,
                    _ => DataType::Utf8,
                };
                Field::new(*name, t, matches!(conv, Conv::Rank))
            })
            .collect::<Vec<_>>(),
    ))
}

/// One column of the batch under construction.
enum Builder {
    Int(Int64Builder),
    Bool(BooleanBuilder),
    Str(StringBuilder),
}

impl Builder {
    fn new(conv: Conv) -> Builder {
        match conv {
            Conv::Int | Conv::Rank => Builder::Int(Int64Builder::with_capacity(BATCH)),
            Conv::Bool => Builder::Bool(BooleanBuilder::with_capacity(BATCH)),
            _ => Builder::Str(StringBuilder::with_capacity(BATCH, BATCH * 16)),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::Int(b) => Arc::new(b.finish()),
            Builder::Bool(b) => Arc::new(b.finish()),
            Builder::Str(b) => Arc::new(b.finish()),
        }
    }
}

/// The Parquet bytes of one file, sent to the client in chunks; the first names the file.
struct Sink<'a> {
    out: Out<'a>,
    /// Set until the file's first chunk is sent.
    name: Option<String>,
}

impl Sink<'_> {
    fn send(&mut self) -> Result<(), Stop> {
        if let Some(n) = self.name.take() {
            self.out.file_name = n;
        }
        self.out.send()
    }
}

impl Write for Sink<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.out.buf.extend_from_slice(b);
        if self.out.buf.len() >= CHUNK {
            self.send().map_err(|_| std::io::Error::other("the client went away"))?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A Parquet error as the export's: the client gone when the channel is closed.
fn failed(tx: &Tx, what: &str, e: impl std::fmt::Display) -> Stop {
    if tx.is_closed() { Stop::ClientGone } else { Stop::Failed(ApiError::Internal(format!("{what}: {e}"))) }
}

/// The WHERE clause of `kind`'s rows in the session that pass `f` (alias `t`).
fn where_clause(
    c: &Connection,
    kind: &str,
    session: u64,
    f: &pb::RecordFilter,
) -> rusqlite::Result<(String, Vec<Value>)> {
    if kind != "pc_sample" {
        let w = where_for(c, kind, session, f)?;
        return Ok((w.sql, w.params));
    }
    // PC samples are aggregated per session (no rowid ranges, no device or time columns).
    let mut sql = "t.session = ?".to_string();
    let mut params = vec![Value::Integer(session as i64)];
    if !f.process_ids.is_empty() {
        let list = f.process_ids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
        sql.push_str(&format!(" AND t.proc IN ({list})"));
    }
    if !f.name_pattern.is_empty() {
        sql.push_str(&format!(" AND t.function IN (SELECT id FROM strings WHERE {NAME_GLOB})"));
        params.push(Value::Text(f.name_pattern.clone()));
        params.push(Value::Text(f.name_pattern.clone()));
    }
    Ok((sql, params))
}

/// What the reading thread hands the writing thread: a file to start (its name, schema,
/// properties and the export's progress so far), a batch of its rows (with the progress after
/// it), the end of the file.
enum Piece {
    File(String, Arc<Schema>, Box<WriterProperties>, u64),
    Batch(RecordBatch, u64),
    End,
}

/// The Parquet export of a session's records (see the module's comment). Rows are read and
/// converted on this thread while another encodes, compresses and sends the batches before
/// them (at most two batches in between), which takes most of the Parquet encoding off the
/// export's time.
pub(super) fn parquet_files(db: &std::path::Path, session: u64, f: &pb::RecordFilter, tx: &Tx) -> Result<(), Stop> {
    let c = crate::store::open_reader(db)?;
    let total = total_rows(&c, session, crate::catalog::RECORD_TABLES)?;
    std::thread::scope(|s| {
        let (pieces, received) = std::sync::mpsc::sync_channel(2);
        let writer = s.spawn(move || write_files(received, tx, total));
        let read = read_rows(&c, session, f, tx, &pieces);
        drop(pieces);
        let wrote =
            writer.join().unwrap_or_else(|_| Err(Stop::Failed(ApiError::Internal("the Parquet writer failed".into()))));
        // A reading error ends the writer too (its channel closes); otherwise the writer's
        // result says how the export ended.
        read.and(wrote)
    })
}

/// Reads each kind's rows into record batches for [`write_files`]; stops early, without an
/// error, when the writer has ended (its error is the export's).
fn read_rows(
    c: &Connection,
    session: u64,
    f: &pb::RecordFilter,
    tx: &Tx,
    pieces: &std::sync::mpsc::SyncSender<Piece>,
) -> Result<(), Stop> {
    let mut written = 0u64;
    let mut names = Names {
        host: crate::otlp::host_name(),
        cache: FastMap::default(),
        api: FastMap::default(),
        jobs: FastMap::default(),
    };
    // The session's tracks, for every kind read from a `_data` table.
    let tracks = super::scan::tracks(c, session)?;
    let mut files = 0usize;
    for kind in KINDS {
        let cols = all_columns(kind);
        let schema = schema(&cols);
        let mut builders: Vec<Builder> = cols.iter().map(|(_, _, conv)| Builder::new(*conv)).collect();
        let (mut started, mut in_batch, mut gone) = (false, 0usize, false);
        // One row's column values into the builders; the file starts with its first row.
        let mut push = |v: &[i64]| -> Result<(), Stop> {
            if !started {
                started = true;
                let file = Piece::File(format!("{kind}.parquet"), schema.clone(), Box::new(properties(&cols)), written);
                if pieces.send(file).is_err() {
                    gone = true;
                    return Err(Stop::ClientGone);
                }
            }
            for (((_, _, conv), b), x) in cols.iter().zip(builders.iter_mut()).zip(v) {
                match b {
                    Builder::Int(b) if matches!(conv, Conv::Rank) => b.append_option(names.rank(c, *x)?),
                    Builder::Int(b) => b.append_value(*x),
                    Builder::Bool(b) => b.append_value(*x != 0),
                    Builder::Str(b) => b.append_value(names.text(c, *conv, *x)?),
                }
            }
            in_batch += 1;
            if in_batch == BATCH {
                written += in_batch as u64;
                in_batch = 0;
                if pieces.send(Piece::Batch(batch_of(&schema, &mut builders, tx)?, written)).is_err() {
                    gone = true;
                    return Err(Stop::ClientGone);
                }
            }
            Ok(())
        };
        let exprs: Vec<&str> = cols.iter().map(|(_, e, _)| *e).collect();
        let read = match plan(c, kind, &exprs)? {
            Some(p) => rows(c, &tracks, &p, session, f, &mut push),
            None => {
                let (w, params) = where_clause(c, kind, session, f)?;
                let sql =
                    format!("SELECT {} FROM {kind} t JOIN processes p ON p.id = t.proc WHERE {w}", exprs.join(", "));
                let mut st = c.prepare(&sql)?;
                let mut rows = st.query(params_from_iter(params.iter()))?;
                let mut v = vec![0i64; cols.len()];
                let mut read = Ok(());
                while let Some(r) = rows.next()? {
                    for (i, x) in v.iter_mut().enumerate() {
                        *x = r.get(i)?;
                    }
                    read = push(&v);
                    if read.is_err() {
                        break;
                    }
                }
                read
            }
        };
        match read {
            Err(_) if gone => return Ok(()),
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        if !started {
            continue;
        }
        files += 1;
        written += in_batch as u64;
        let last = if in_batch > 0 { Some(Piece::Batch(batch_of(&schema, &mut builders, tx)?, written)) } else { None };
        if last.into_iter().chain([Piece::End]).any(|p| pieces.send(p).is_err()) {
            return Ok(());
        }
    }
    if files == 0 {
        // No records at all (an empty session, or a filter that matches none): the kernel
        // file with its columns and no rows, so that the export still reads as a table.
        let cols = all_columns(EMPTY_KIND);
        let file = Piece::File(format!("{EMPTY_KIND}.parquet"), schema(&cols), Box::new(properties(&cols)), 0);
        // A send fails only when the writer has ended, whose result is the export's.
        let _ = [file, Piece::End].into_iter().try_for_each(|p| pieces.send(p));
    }
    Ok(())
}

/// The kind whose file (with no rows) an export without any records has.
pub(super) const EMPTY_KIND: &str = "kernel";

/// Writes the files [`read_rows`] hands over, each to the client as it fills; a file whose
/// end never comes (the reading failed) is left unfinished.
fn write_files(pieces: std::sync::mpsc::Receiver<Piece>, tx: &Tx, total: u64) -> Result<(), Stop> {
    let mut file: Option<ArrowWriter<Sink<'_>>> = None;
    for p in pieces {
        match p {
            Piece::File(name, schema, props, written) => {
                file = Some(file_writer(tx, name, schema, &props, written, total)?);
            }
            Piece::Batch(batch, written) => {
                if let Some(w) = file.as_mut() {
                    w.write(&batch).map_err(|e| failed(tx, "writing the Parquet file", e))?;
                    w.inner_mut().out.written = written;
                }
            }
            Piece::End => {
                if let Some(w) = file.take() {
                    let mut sink = w.into_inner().map_err(|e| failed(tx, "finishing the Parquet file", e))?;
                    // The file's last chunk (the first too when it is small) with its final count.
                    sink.send()?;
                }
            }
        }
    }
    Ok(())
}

/// Snappy, row groups of [`ROW_GROUP`] rows, dictionaries for the string columns only (few
/// distinct names; the integers are mostly distinct, where a dictionary is only tried and
/// dropped).
fn properties(cols: &[Col]) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_size(ROW_GROUP)
        .set_created_by(format!("gpuprofd {}", env!("CARGO_PKG_VERSION")))
        .set_dictionary_enabled(false);
    for (name, _, conv) in cols {
        if !matches!(conv, Conv::Int | Conv::Bool) {
            b = b.set_column_dictionary_enabled(ColumnPath::from(*name), true);
        }
    }
    b.build()
}

/// A Parquet writer whose bytes go to the client, the first chunk naming the file;
/// `written` and `total` are the export's progress so far.
fn file_writer<'a>(
    tx: &'a Tx,
    name: String,
    schema: Arc<Schema>,
    props: &WriterProperties,
    written: u64,
    total: u64,
) -> Result<ArrowWriter<Sink<'a>>, Stop> {
    let mut out = Out::new(tx, total);
    out.written = written;
    let sink = Sink { out, name: Some(name) };
    ArrowWriter::try_new(sink, schema, Some(props.clone())).map_err(|e| failed(tx, "starting the Parquet file", e))
}

/// The builders' rows as a record batch (the builders start over).
fn batch_of(schema: &Arc<Schema>, builders: &mut [Builder], tx: &Tx) -> Result<RecordBatch, Stop> {
    let arrays = builders.iter_mut().map(Builder::finish).collect();
    RecordBatch::try_new(schema.clone(), arrays).map_err(|e| failed(tx, "building a record batch", e))
}

/// Interned strings of one export, as shown and as stored, read once each.
struct Names {
    host: String,
    cache: FastMap<i64, (String, String)>,
    /// API function names by `domain << 32 | cbid`.
    api: FastMap<i64, String>,
    /// Job id and rank by process.
    jobs: FastMap<i64, (String, Option<i64>)>,
}

impl Names {
    fn job(&mut self, c: &Connection, proc: i64) -> rusqlite::Result<&(String, Option<i64>)> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.jobs.entry(proc) {
            let j = c
                .query_row("SELECT job_id, job_rank FROM processes WHERE id = ?1", [proc], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .or_else(|e| match e {
                    rusqlite::Error::QueryReturnedNoRows => Ok((String::new(), None)),
                    e => Err(e),
                })?;
            e.insert(j);
        }
        Ok(&self.jobs[&proc])
    }

    /// The rank of process `proc` in its job.
    fn rank(&mut self, c: &Connection, proc: i64) -> rusqlite::Result<Option<i64>> {
        Ok(self.job(c, proc)?.1)
    }

    /// The string column value of `v`.
    fn text(&mut self, c: &Connection, conv: Conv, v: i64) -> rusqlite::Result<Cow<'_, str>> {
        Ok(match conv {
            Conv::Name | Conv::Stored => {
                if let std::collections::hash_map::Entry::Vacant(e) = self.cache.entry(v) {
                    let (shown, stored) = names(c, v)?;
                    let stored = if stored.is_empty() { shown.clone() } else { stored };
                    e.insert((shown, stored));
                }
                let (shown, stored) = &self.cache[&v];
                Cow::Borrowed(if matches!(conv, Conv::Name) { shown } else { stored })
            }
            Conv::CopyKind => Cow::Owned(copy_kind_name(v)),
            Conv::SyncType => Cow::Borrowed(sync_type_name(v)),
            Conv::ApiDomain => Cow::Borrowed(crate::cbid::domain_name(v)),
            Conv::ApiName => {
                Cow::Borrowed(self.api.entry(v).or_insert_with(|| crate::cbid::name(v >> 32, v & 0xffff_ffff)))
            }
            Conv::Host => Cow::Borrowed(&self.host),
            Conv::JobId => Cow::Borrowed(self.job(c, v)?.0.as_str()),
            Conv::Int | Conv::Bool | Conv::Rank => Cow::Borrowed(""),
        })
    }
}

#[cfg(test)]
mod tests;
