//! The SQLite database: opening, pragmas and schema migrations.
//!
//! The schema lives in `migrations/` as plain SQL files, applied in order at start inside
//! one transaction each; `PRAGMA user_version` records how far a database has come.

use std::path::Path;

use anyhow::{Context, Result, bail};
use rusqlite::Connection;

use crate::config::StorageConfig;

/// Schema migrations, in order. Index + 1 is the `user_version` after applying it.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init.sql", include_str!("../../migrations/0001_init.sql")),
    ("0002_sessions.sql", include_str!("../../migrations/0002_sessions.sql")),
    ("0003_retention.sql", include_str!("../../migrations/0003_retention.sql")),
    ("0004_topology_keys.sql", include_str!("../../migrations/0004_topology_keys.sql")),
    ("0005_attribution.sql", include_str!("../../migrations/0005_attribution.sql")),
    ("0006_demangled.sql", include_str!("../../migrations/0006_demangled.sql")),
    ("0007_pc_sampling.sql", include_str!("../../migrations/0007_pc_sampling.sql")),
    ("0008_tracks.sql", include_str!("../../migrations/0008_tracks.sql")),
    ("0009_kernel_shapes.sql", include_str!("../../migrations/0009_kernel_shapes.sql")),
    ("0010_kinds_and_shapes.sql", include_str!("../../migrations/0010_kinds_and_shapes.sql")),
    ("0011_track_epochs.sql", include_str!("../../migrations/0011_track_epochs.sql")),
    ("0012_record_pairs.sql", include_str!("../../migrations/0012_record_pairs.sql")),
    ("0013_cxxfilt_names.sql", include_str!("../../migrations/0013_cxxfilt_names.sql")),
    ("0014_pc_rollup.sql", include_str!("../../migrations/0014_pc_rollup.sql")),
    ("0015_job_identity.sql", include_str!("../../migrations/0015_job_identity.sql")),
    ("0016_collectives.sql", include_str!("../../migrations/0016_collectives.sql")),
];

/// How long a connection waits for a lock another connection holds.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens (creating if needed) the database for writing and brings the schema up to date.
pub fn open_writer(path: &Path, cfg: &StorageConfig) -> Result<Connection> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating state directory {}", dir.display()))?;
        check_writable(dir)?;
    }
    let conn = Connection::open(path).with_context(|| format!("opening database {}", path.display()))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // A new database gets incremental auto-vacuum, so that retention can hand the pages of
    // deleted rows back to the file system; it can only be chosen before the first table
    // (and before WAL mode) exists. Older databases keep reusing their free pages instead.
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    if pages == 0 {
        conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL")?;
    }
    // WAL: readers never block the writer. synchronous=NORMAL: a crash of the process (or
    // SIGKILL) loses nothing committed; only power loss can lose the last transactions.
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        bail!("database {} refused WAL mode (got {mode})", path.display());
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous=NORMAL;
         PRAGMA foreign_keys=OFF;
         PRAGMA temp_store=MEMORY;
         PRAGMA cache_size=-{};
         PRAGMA wal_autocheckpoint={};",
        cfg.cache_mib * 1024,
        cfg.wal_autocheckpoint_pages
    ))?;
    // After a checkpoint resets the WAL, a WAL that grew past its checkpoint size (a long
    // read, a big deletion) is truncated back to it instead of keeping its peak size.
    let page: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let limit = i64::from(cfg.wal_autocheckpoint_pages) * page;
    let _: i64 = conn.query_row(&format!("PRAGMA journal_size_limit={limit}"), [], |r| r.get(0))?;
    migrate(&conn)?;
    if cfg.max_database_mib > 0 {
        set_max_database_mib(&conn, cfg.max_database_mib)?;
    }
    Ok(conn)
}

/// The writer's hard cap on the database size (`storage.max_database_mib`; 0: none), at start
/// and on SIGHUP. SQLite keeps at least the pages already in use.
pub fn set_max_database_mib(conn: &Connection, mib: u64) -> rusqlite::Result<()> {
    let page: u64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let pages = if mib == 0 { 4_294_967_294 } else { (mib << 20) / page.max(512) };
    let _: i64 = conn.query_row(&format!("PRAGMA max_page_count={pages}"), [], |r| r.get(0))?;
    Ok(())
}

/// Fails with a clear message when `dir` cannot take new files (a read-only mount, say), which
/// SQLite would otherwise report only as "unable to open database file".
fn check_writable(dir: &Path) -> Result<()> {
    let probe = dir.join(".gpuprofd-write-probe");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .with_context(|| format!("the state directory {} is not writable", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Opens the database like [`open_writer`]; a file that SQLite reports as not a database or
/// corrupt is moved aside (with its WAL and shared-memory files) to `NAME.corrupt-UNIXSECS`,
/// never overwritten or deleted, and a new database is started. Returns the connection and,
/// when a file was moved aside, a message saying so.
pub fn open_writer_or_move_aside(path: &Path, cfg: &StorageConfig) -> Result<(Connection, Option<String>)> {
    let err = match open_writer(path, cfg) {
        Ok(c) => return Ok((c, None)),
        Err(e) => e,
    };
    let corrupt = err.chain().any(|c| {
        matches!(
            c.downcast_ref::<rusqlite::Error>().and_then(rusqlite::Error::sqlite_error_code),
            Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
        )
    });
    if !corrupt || !path.exists() {
        return Err(err);
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let aside = (0..)
        .map(|n| {
            let mut p = path.as_os_str().to_owned();
            p.push(if n == 0 { format!(".corrupt-{secs}") } else { format!(".corrupt-{secs}-{n}") });
            std::path::PathBuf::from(p)
        })
        .find(|p| !p.exists())
        .unwrap_or_default();
    for suffix in ["-wal", "-shm", ""] {
        let (mut from, mut to) = (path.as_os_str().to_owned(), aside.as_os_str().to_owned());
        from.push(suffix);
        to.push(suffix);
        if Path::new(&from).exists() {
            std::fs::rename(&from, &to).with_context(|| {
                format!("moving the corrupt database {} aside ({err:#})", Path::new(&from).display())
            })?;
        }
    }
    let msg = format!(
        "database {} could not be opened ({err:#}); moved aside to {}, started a new one",
        path.display(),
        aside.display()
    );
    tracing::error!("{msg}");
    Ok((open_writer(path, cfg)?, Some(msg)))
}

/// Opens a read-only connection for queries.
pub fn open_reader(path: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening database {} for reading", path.display()))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// The uid that owns session `id`, from the sessions table; `None` if there is no such session.
pub fn session_owner(c: &Connection, id: u64) -> rusqlite::Result<Option<u32>> {
    use rusqlite::OptionalExtension;
    c.prepare_cached("SELECT owner_uid FROM sessions WHERE id = ?1")?.query_row([id as i64], |r| r.get(0)).optional()
}

/// Applies the migrations this database has not seen yet.
pub fn migrate(conn: &Connection) -> Result<()> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if current > known {
        bail!(
            "database schema version {current} is newer than this gpuprofd knows ({known}); \
             run a newer gpuprofd or move the database aside"
        );
    }
    for (i, (name, sql)) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = i as i64 + 1;
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(sql).with_context(|| format!("applying migration {name}"))?;
        tx.execute_batch(&format!("PRAGMA user_version={version}"))?;
        tx.commit()?;
        tracing::debug!(migration = name, version, "applied schema migration");
    }
    // One line for all of them (none when the schema is current).
    if let Some(line) = migrated_line(current, known) {
        tracing::info!("{line}");
    }
    Ok(())
}

/// What [`migrate`] says it did, from the schema version it found to the one it left.
fn migrated_line(from: i64, to: i64) -> Option<String> {
    match (from, to) {
        (f, t) if f >= t => None,
        (0, t) => Some(format!("database schema created (version {t})")),
        (f, t) => Some(format!("database schema migrated from version {f} to {t}")),
    }
}

/// Size of the database and its WAL, in bytes.
pub fn database_bytes(path: &Path) -> u64 {
    let mut total = 0;
    for suffix in ["", "-wal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(m) = std::fs::metadata(&p) {
            total += m.len();
        }
    }
    total
}

/// Size of the WAL file, in bytes (0 when there is none).
pub fn wal_bytes(path: &Path) -> u64 {
    let mut p = path.as_os_str().to_owned();
    p.push("-wal");
    std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0)
}

/// Pages of the database as a connection sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pages {
    pub page_size: u64,
    /// Pages in the database, free ones included.
    pub count: u64,
    /// Free pages (reused by later writes; handed back to the file system only by vacuum).
    pub free: u64,
    /// `PRAGMA auto_vacuum`: 0 none, 1 full, 2 incremental.
    pub auto_vacuum: i64,
}

impl Pages {
    pub fn read(c: &Connection) -> rusqlite::Result<Pages> {
        let q = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0));
        Ok(Pages {
            page_size: q("PRAGMA page_size")?.max(0) as u64,
            count: q("PRAGMA page_count")?.max(0) as u64,
            free: q("PRAGMA freelist_count")?.max(0) as u64,
            auto_vacuum: q("PRAGMA auto_vacuum")?,
        })
    }

    /// Bytes of the pages in use (free pages not counted).
    pub fn used_bytes(&self) -> u64 {
        self.count.saturating_sub(self.free) * self.page_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_one_line_from_version_to_version() {
        assert_eq!(migrated_line(0, 16).as_deref(), Some("database schema created (version 16)"));
        assert_eq!(migrated_line(12, 16).as_deref(), Some("database schema migrated from version 12 to 16"));
        assert_eq!(migrated_line(16, 16), None);
    }

    /// One column of `pragma_table_info` for `table` ("name", "type", ...).
    fn table_info(conn: &Connection, table: &str, what: &str) -> Vec<String> {
        conn.prepare(&format!("SELECT {what} FROM pragma_table_info('{table}')"))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Activity record tables plus the sample tables.
    fn record_tables() -> Vec<&'static str> {
        crate::catalog::RECORD_TABLES.iter().copied().chain(["pm_sample", "pc_sample"]).collect()
    }

    #[test]
    fn migrations_apply_and_are_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let cfg = crate::config::Config::from_toml("").unwrap().storage;
        drop(open_writer(&path, &cfg).unwrap());
        let conn = open_writer(&path, &cfg).unwrap();
        let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v, MIGRATIONS.len() as i64);
        let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(ok, "ok");
        assert_eq!(Pages::read(&conn).unwrap().auto_vacuum, 2, "a new database vacuums incrementally");
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type IN ('table','view')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for t in record_tables().iter().chain(&[
            "strings",
            "processes",
            "devices",
            "sessions",
            "session_processes",
            "leases",
            "pauses",
            "audit",
        ]) {
            assert!(tables.iter().any(|x| x == t), "table {t} missing from schema: {tables:?}");
        }
        // Record tables hold integers only except PM values: every column is INTEGER (of the
        // `_data` tables behind the record views).
        for t in record_tables().iter().filter(|t| **t != "pm_sample") {
            let t = crate::catalog::data_table(t).unwrap_or(t);
            let types = table_info(&conn, t, "type");
            assert!(!types.is_empty());
            assert!(types.iter().all(|ty| ty == "INTEGER"), "{t}: {types:?}");
        }
    }

    /// The writer and the export readers take a paired table's layout from
    /// `catalog::pair_columns`: it must be the migrated schema's, column for column.
    #[test]
    fn paired_tables_have_the_columns_the_catalog_names() {
        let conn = Connection::open_in_memory().unwrap();
        migrate(&conn).unwrap();
        let mut paired = 0;
        for t in crate::catalog::RECORD_TABLES {
            let pair = crate::catalog::pair_columns(t);
            if pair.is_empty() {
                continue;
            }
            paired += 1;
            let want: Vec<String> = std::iter::once("track".to_string())
                .chain(pair.iter().map(|(c, _)| c.to_string()))
                .chain(pair.iter().map(|(c, _)| format!("{c}2")))
                .collect();
            let data = crate::catalog::data_table(t).unwrap();
            assert_eq!(table_info(&conn, data, "name"), want, "{data}");
        }
        assert_eq!(paired, 2, "kernel_data and api_data hold two records a row");
    }

    #[test]
    fn version_3_keeps_sessions_and_stops_reusing_their_ids() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("PRAGMA foreign_keys=OFF").unwrap();
        for (_, sql) in &MIGRATIONS[..2] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch(
            "PRAGMA user_version=2;
             INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
                                   connected_ns) VALUES (4, 1, 0, 0, 'injector', 'x', '[]', '', 0, 0, 0);
             INSERT INTO sessions VALUES (7, 'a', 'completed', '[]', '{}', 1000, 1, 2, 3, 4, 0, 0, 'done');
             INSERT INTO session_processes(session, proc, joined_ns, state) VALUES (7, 4, 0, 'stopped');",
        )
        .unwrap();
        migrate(&conn).unwrap();
        let row: (String, u32, String) = conn
            .query_row("SELECT name, owner_uid, stop_reason FROM sessions WHERE id = 7", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(row, ("a".into(), 1000, "done".into()));
        let floor: i64 = conn
            .query_row("SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'retention_process_floor'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(floor, 4);
        conn.execute("DELETE FROM sessions WHERE id = 7", []).unwrap();
        conn.execute(
            "INSERT INTO sessions(name, state, targets, collect, owner_uid, created_ns, start_at_ns, duration_ms,
                                  max_records) VALUES ('b', 'active', '[]', '{}', 0, 0, 0, 0, 0)",
            [],
        )
        .unwrap();
        assert_eq!(conn.last_insert_rowid(), 8);
        let plan: String =
            conn.query_row("EXPLAIN QUERY PLAN SELECT * FROM sessions WHERE owner_uid = 1", [], |r| r.get(3)).unwrap();
        assert!(plan.contains("sessions_owner"), "{plan}");
    }

    /// Version 8 moves record rows into `_data` tables with tracks: every row reads back
    /// the same through the views, with its rowid.
    #[test]
    fn version_8_keeps_every_record_row() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("PRAGMA foreign_keys=OFF").unwrap();
        for (_, sql) in &MIGRATIONS[..7] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch("PRAGMA user_version=7").unwrap();
        for id in 1..=3 {
            conn.execute(
                "INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
                                       connected_ns) VALUES (?1, 1, 0, 0, 'injector', 'x', '[]', '', 0, ?1 * 1000000, 0)",
                [id],
            )
            .unwrap();
        }
        // Two sessions and three processes, with rows spread over rowids; every column distinct.
        // The record tables there are at version 7 (kinds added later have none yet).
        let col_count = |t: &str| -> i64 {
            conn.query_row(&format!("SELECT count(*) FROM pragma_table_info('{t}')"), [], |r| r.get(0)).unwrap()
        };
        let tables: Vec<&str> = crate::catalog::RECORD_TABLES.iter().copied().filter(|t| col_count(t) > 0).collect();
        assert!(tables.contains(&"kernel") && !tables.contains(&"collective"));
        for t in &tables {
            let cols = col_count(t);
            for i in 0..20i64 {
                let vals: Vec<String> = (0..cols)
                    .map(|c| match c {
                        0 => (i % 2 * 5).to_string(),
                        1 => (1 + i % 3).to_string(),
                        // context/stream keys must stay unique per (session, proc, ctx[, stream]).
                        _ => (i * 1000 + c * 7 + (i % 4)).to_string(),
                    })
                    .collect();
                conn.execute(&format!("INSERT INTO {t} VALUES ({})", vals.join(",")), []).unwrap();
            }
            conn.execute(&format!("DELETE FROM {t} WHERE rowid IN (3, 4)"), []).unwrap();
        }
        // Grid and block sizes CUDA never reports (kept as text by version 8).
        conn.execute(
            "INSERT INTO kernel VALUES (5, 2, 0, 1, 7, 1, 1, 10, 5, 4, 70000, 0, 8, 1, 4294967295, 0, 0, 0, 0)",
            [],
        )
        .unwrap();
        let dump = |c: &Connection| -> Vec<Vec<i64>> {
            let mut out = Vec::new();
            for t in &tables {
                let cols = table_info(c, t, "name");
                let cols: Vec<String> = cols.into_iter().filter(|c| c != "rowid").collect();
                let mut st = c.prepare(&format!("SELECT rowid, {} FROM {t} ORDER BY rowid", cols.join(", "))).unwrap();
                let mut rows = st.query([]).unwrap();
                while let Some(r) = rows.next().unwrap() {
                    out.push((0..=cols.len()).map(|i| r.get(i).unwrap()).collect());
                }
            }
            out
        };
        let before = dump(&conn);
        let kernel_v = |c: &Connection| -> Vec<(i64, i64)> {
            c.prepare("SELECT start_ns, end_ns FROM kernel_v ORDER BY start_ns")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let before_v = kernel_v(&conn);
        assert_eq!(before.len(), tables.len() * 18 + 1);
        migrate(&conn).unwrap();
        assert_eq!(dump(&conn), before);
        let after_v = kernel_v(&conn);
        assert_eq!(before_v.len(), 19);
        assert_eq!(after_v, before_v);
        let tracks: i64 = conn.query_row("SELECT count(*) FROM tracks", [], |r| r.get(0)).unwrap();
        assert!(tracks > 0);
        // A session's rows are read by rowid range through the view, never by scanning.
        let plan: Vec<String> = conn
            .prepare("EXPLAIN QUERY PLAN SELECT t.dur FROM kernel t WHERE t.rowid BETWEEN 2 AND 9 AND t.session = 5")
            .unwrap()
            .query_map([], |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(plan[0].contains("INTEGER PRIMARY KEY"), "{plan:?}");
    }

    /// Version 11 rebuilds `tracks` with a `base`: ids, rows and the AUTOINCREMENT sequence stay
    /// (a deleted track's id is not given out again), starts read back the same.
    #[test]
    fn version_11_keeps_track_ids_and_their_sequence() {
        let conn = Connection::open_in_memory().unwrap();
        for (_, sql) in &MIGRATIONS[..10] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch("PRAGMA user_version=10").unwrap();
        for id in 1..=3 {
            conn.execute("INSERT INTO tracks(session, proc, dev, ctx, stream, tid) VALUES (1, 2, 0, 0, ?1, 0)", [id])
                .unwrap();
        }
        conn.execute_batch(
            "DELETE FROM tracks WHERE id = 3;
             INSERT INTO kernel_shapes VALUES (1, 5, 1, 1, 128, 1, 1, 32, 0, 0, 0);
             INSERT INTO kernel_data VALUES (2, 9, 1, 7000000000, 10, 4);",
        )
        .unwrap();
        migrate(&conn).unwrap();
        let kept: Vec<(i64, i64, i64)> = conn
            .prepare("SELECT id, stream, base FROM tracks ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, [(1, 1, 0), (2, 2, 0)]);
        let start: i64 = conn.query_row("SELECT start FROM kernel WHERE stream = 2", [], |r| r.get(0)).unwrap();
        assert_eq!(start, 7_000_000_000);
        conn.execute(
            "INSERT INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (1, 2, 0, 0, 2, 0, 4294967296)",
            [],
        )
        .unwrap();
        assert_eq!(conn.last_insert_rowid(), 4, "track id 3 was deleted: never given out again");
    }

    #[test]
    fn refuses_newer_schema() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("PRAGMA user_version=999").unwrap();
        let e = migrate(&conn).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
    }
}
