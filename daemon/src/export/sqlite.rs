//! The SQLite export: the session's rows copied into a new database file in the state
//! directory, sent in chunks, and removed.

use std::path::{Path, PathBuf};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, params_from_iter};

use super::out::{CHUNK, Out, Stop, Tx, total_rows};
use crate::error::ApiError;
use crate::query::where_for;

/// A standalone SQLite database with the session's rows, the same schema as gpuprofd's
/// record tables (times relative to `processes.base_ns`, `*_v` views with absolute times).
pub(super) fn sqlite(db: &Path, tmp_dir: &Path, session: u64, f: &pb::RecordFilter, tx: &Tx) -> Result<(), Stop> {
    std::fs::create_dir_all(tmp_dir).map_err(|e| ApiError::Internal(format!("creating {}: {e}", tmp_dir.display())))?;
    let path = tmp_dir.join(format!("session-{session}-{}-{}.db", std::process::id(), crate::clock::now_ns()));
    let _cleanup = RemoveOnDrop(path.clone());
    let total = {
        let c = crate::store::open_reader(db)?;
        total_rows(&c, session, crate::catalog::RECORD_TABLES)?
    };
    let mut out = Out::new(tx, total);
    {
        let c = Connection::open(&path)?;
        c.execute_batch("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA foreign_keys=OFF;")?;
        c.execute_batch(crate::store::MIGRATIONS[0].1)?;
        // The processes' containers and pods, and both forms of kernel names (their columns are
        // copied whole below; found by name, whatever number the migrations have).
        for (name, sql) in crate::store::MIGRATIONS {
            if name.ends_with("_attribution.sql") || name.ends_with("_demangled.sql") {
                c.execute_batch(sql)?;
            }
        }
        c.execute("ATTACH DATABASE ?1 AS src", [format!("file:{}?mode=ro", db.display())])
            .or_else(|_| c.execute("ATTACH DATABASE ?1 AS src", [db.display().to_string()]))?;
        c.execute_batch("BEGIN")?;
        for t in crate::catalog::RECORD_TABLES {
            let w = where_for(&c, t, session, f).map_err(ApiError::from)?;
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
            let n = c.execute(&sql, params_from_iter(w.params.iter()))?;
            out.written += n as u64;
            out.send()?;
        }
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
             DETACH DATABASE src;"
        ))?;
    }
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

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
