//! The SQLite export: the session's rows copied into a new database file in the state
//! directory, sent in chunks, and removed.

use std::path::{Path, PathBuf};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, params_from_iter};

use super::out::{CHUNK, Out, Stop, Tx, total_rows};
use crate::error::ApiError;
use crate::query::where_for;

/// Record tables copied into a second file on a thread of their own (about half the rows of a
/// usual session: API calls and copies), then into the export by SQLite's transfer
/// optimization, which copies the rows' records as they are.
const PART_TABLES: &[&str] = &["api", "memcpy"];

/// A standalone SQLite database with the session's rows, the same schema as gpuprofd's
/// record tables (times relative to `processes.base_ns`, `*_v` views with absolute times).
pub(super) fn sqlite(db: &Path, tmp_dir: &Path, session: u64, f: &pb::RecordFilter, tx: &Tx) -> Result<(), Stop> {
    std::fs::create_dir_all(tmp_dir).map_err(|e| ApiError::Internal(format!("creating {}: {e}", tmp_dir.display())))?;
    let path = tmp_dir.join(format!("session-{session}-{}-{}.db", std::process::id(), crate::clock::now_ns()));
    let part_path = path.with_extension("part.db");
    let _cleanup = (RemoveOnDrop(path.clone()), RemoveOnDrop(part_path.clone()));
    let total = {
        let c = crate::store::open_reader(db)?;
        total_rows(&c, session, crate::catalog::RECORD_TABLES)?
    };
    let mut out = Out::new(tx, total);
    let main_tables: Vec<&str> =
        crate::catalog::RECORD_TABLES.iter().copied().filter(|t| !PART_TABLES.contains(t)).collect();
    let part = new_file(&part_path, db)?;
    let stop_part = part.get_interrupt_handle();
    std::thread::scope(|scope| -> Result<(), Stop> {
        let copying = scope.spawn(move || {
            let rows = copy_tables(&part, PART_TABLES, session, f, |_| Ok(()))?;
            part.execute_batch("COMMIT")?;
            Ok::<_, Stop>(rows)
        });
        let copied = new_file(&path, db).and_then(|c| {
            copy_tables(&c, &main_tables, session, f, |n| {
                out.written += n;
                out.send()
            })?;
            Ok(c)
        });
        let c = match copied {
            Ok(c) => c,
            Err(e) => {
                stop_part.interrupt();
                let _ = copying.join();
                return Err(e);
            }
        };
        let part_rows =
            copying.join().map_err(|_| ApiError::Internal("the export's copying thread panicked".into()))??;
        c.execute("ATTACH DATABASE ?1 AS part", [part_path.display().to_string()])?;
        for t in PART_TABLES {
            c.execute(&format!("INSERT INTO main.{t} SELECT * FROM part.{t}"), [])?;
        }
        out.written += part_rows;
        out.send()?;
        let s = session as i64;
        c.execute_batch(&format!(
            "INSERT INTO main.sessions SELECT * FROM src.sessions WHERE id = {s};
             INSERT INTO main.session_processes(session, proc, joined_ns, left_ns, state, detail)
               SELECT session, proc, joined_ns, left_ns, state, detail FROM src.session_processes WHERE session = {s};
             INSERT INTO main.processes SELECT * FROM src.processes
               WHERE id IN (SELECT proc FROM main.session_processes UNION SELECT proc FROM main.kernel
                            UNION SELECT proc FROM main.api UNION SELECT proc FROM main.memcpy);
             INSERT INTO main.process_devices SELECT * FROM src.process_devices WHERE proc IN (SELECT id FROM main.processes);
             INSERT INTO main.devices SELECT * FROM src.devices WHERE id IN (SELECT device FROM main.process_devices);
             INSERT INTO main.strings SELECT * FROM src.strings
               WHERE id IN (SELECT name FROM main.kernel UNION SELECT name FROM main.marker UNION SELECT domain FROM main.marker);
             INSERT INTO main.drops SELECT * FROM src.drops WHERE proc IN (SELECT id FROM main.processes);
             INSERT INTO main.meta(key, value) VALUES ('gpuprof_export_session', '{s}');
             COMMIT;
             DETACH DATABASE src;
             DETACH DATABASE part;"
        ))?;
        Ok(())
    })?;
    let mut file = std::fs::File::open(&path).map_err(|e| ApiError::Internal(format!("reading the export: {e}")))?;
    loop {
        let mut chunk = vec![0u8; CHUNK];
        let n = std::io::Read::read(&mut file, &mut chunk)
            .map_err(|e| ApiError::Internal(format!("reading the export: {e}")))?;
        if n == 0 {
            break;
        }
        chunk.truncate(n);
        out.buf = chunk;
        out.send()?;
    }
    Ok(())
}

/// A new export file at `path` with the export's schema, gpuprofd's database `db` attached
/// read-only as `src`, in a transaction.
fn new_file(path: &Path, db: &Path) -> Result<Connection, Stop> {
    let c = Connection::open(path)?;
    c.execute_batch("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA foreign_keys=OFF;")?;
    c.execute_batch(crate::store::MIGRATIONS[0].1)?;
    // The processes' containers and pods, job and rank, and both forms of kernel names (their
    // columns are copied whole; found by name, whatever number the migrations have).
    for (name, sql) in crate::store::MIGRATIONS {
        if name.ends_with("_attribution.sql") || name.ends_with("_demangled.sql") || name.ends_with("_job_identity.sql")
        {
            c.execute_batch(sql)?;
        }
    }
    // NCCL collectives: one plain table, as the record tables of migration 1 are (names are
    // `strings` ids, times relative to the process's `base_ns`, the run in the kernel `gpu_off`
    // after `start`, `gpu_dur` -1 when NCCL did not time it).
    c.execute_batch(
        "CREATE TABLE collective (session INTEGER NOT NULL, proc INTEGER NOT NULL, tid INTEGER NOT NULL,
             start INTEGER NOT NULL, dur INTEGER NOT NULL, gpu_off INTEGER NOT NULL, gpu_dur INTEGER NOT NULL,
             name INTEGER NOT NULL, seq INTEGER NOT NULL, comm INTEGER NOT NULL, count INTEGER NOT NULL,
             bytes INTEGER NOT NULL, dtype INTEGER NOT NULL, algo INTEGER NOT NULL, proto INTEGER NOT NULL,
             root INTEGER NOT NULL, rank INTEGER NOT NULL, nranks INTEGER NOT NULL, channels INTEGER NOT NULL)",
    )?;
    c.execute("ATTACH DATABASE ?1 AS src", [format!("file:{}?mode=ro", db.display())])
        .or_else(|_| c.execute("ATTACH DATABASE ?1 AS src", [db.display().to_string()]))?;
    c.execute_batch("BEGIN")?;
    Ok(c)
}

/// The session's rows of `tables` copied from `src` into the file's tables; `done` is told each
/// table's rows. Returns the rows copied.
fn copy_tables(
    c: &Connection,
    tables: &[&str],
    session: u64,
    f: &pb::RecordFilter,
    mut done: impl FnMut(u64) -> Result<(), Stop>,
) -> Result<u64, Stop> {
    let mut rows = 0;
    for t in tables {
        let w = where_for(c, t, session, f).map_err(ApiError::from)?;
        // The export's tables are plain (times relative, one table per kind): the columns
        // are the source's by name (the source's record tables are views with a `rowid`).
        let cols: Vec<String> = c
            .prepare(&format!("SELECT name FROM pragma_table_info('{t}', 'main')"))?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let cols = cols.iter().map(|c| format!("t.{c}")).collect::<Vec<_>>().join(", ");
        // where_for reads src tables unqualified; qualify the source table.
        let sql = format!(
            "INSERT INTO main.{t} SELECT {cols} FROM src.{t} t WHERE {}",
            w.sql.replace("FROM processes", "FROM src.processes").replace("FROM strings", "FROM src.strings")
        );
        let n = c.execute(&sql, params_from_iter(w.params.iter()))? as u64;
        rows += n;
        done(n)?;
    }
    Ok(rows)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
