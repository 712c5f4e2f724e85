use rusqlite::Connection;

use super::rows::{CONTEXT, STREAM, UNKNOWN, insert_rows};

/// A context/stream row CUPTI reported replaces a derived one (unknown fields), never
/// the other way round; one row per key, also within one multi-row statement.
/// The first two columns of every row of `sql`.
fn pairs(c: &Connection, sql: &str) -> Vec<(i64, i64)> {
    c.prepare(sql).unwrap().query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap()
}

#[test]
fn topology_rows_upsert_reported_over_derived() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::config::Config::from_toml("").unwrap().storage;
    let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg).unwrap();
    let ctx = |ctx: i64, null_stream: i64| [7, 1, ctx, 0, null_stream];
    // Derived first, then reported: the reported values win.
    insert_rows(&c, &CONTEXT, &[ctx(1, UNKNOWN)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    insert_rows(&c, &CONTEXT, &[ctx(1, 7)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    // Reported first, then derived: the reported values stay.
    insert_rows(&c, &CONTEXT, &[ctx(2, 9)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    insert_rows(&c, &CONTEXT, &[ctx(2, UNKNOWN)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    let rows = pairs(&c, "SELECT ctx, null_stream FROM context ORDER BY ctx");
    assert_eq!(rows, [(1, 7), (2, 9)]);
    // 70 stream rows (a multi-row statement and a remainder) over 10 keys, derived and
    // reported mixed: one row per key, reported flags where any was reported.
    let streams: Vec<[i64; 6]> =
        (0..70).map(|i| [7, 1, i % 10, 1, 0, if i % 10 < 5 && i >= 35 { 1 } else { UNKNOWN }]).collect();
    insert_rows(&c, &STREAM, &streams, |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    let rows = pairs(&c, "SELECT stream, flags FROM stream ORDER BY stream");
    let want: Vec<(i64, i64)> = (0..10).map(|s| (s, if s < 5 { 1 } else { UNKNOWN })).collect();
    assert_eq!(rows, want);
}
