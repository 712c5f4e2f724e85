//! The writer's caches of the ids of rows that many record rows refer to: tracks, kernel and
//! copy shapes, API call kinds.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension};

/// The writer's copies of `tracks` ((session, process, device, context, stream, thread) → id),
/// `kernel_shapes` ((name, grid y, z, block x, y, z, registers, static and dynamic shared
/// memory, graph node) → id), `memcpy_shapes` ((kind, source and destination kinds and
/// devices, async, graph node) → id) and `api_kinds` ((domain, cbid, return value) → id).
/// Emptied whenever something else wrote through the writer's connection (retention deletes tracks) or a
/// transaction rolled back (its new rows are gone), then filled again from the tables as
/// records come.
#[derive(Default)]
pub(super) struct Tracks {
    ids: Ids<6>,
    shapes: Ids<10>,
    memcpy_shapes: Ids<7>,
    api_kinds: Ids<3>,
}

type Ids<const N: usize> = HashMap<[i64; N], i64, std::hash::BuildHasherDefault<KeyHasher>>;

/// A multiply-rotate hash for the writer's small integer keys (looked up once per record;
/// SipHash's resistance to chosen keys is not needed for ids the daemon itself assigns).
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
        }
        for b in chunks.remainder() {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_i64(&mut self, v: i64) {
        self.write_u64(v as u64);
    }
}

impl Tracks {
    pub(super) fn clear(&mut self) {
        self.ids.clear();
        self.shapes.clear();
        self.memcpy_shapes.clear();
        self.api_kinds.clear();
    }

    /// The id of kernel shape `key`, inserted if the table has none.
    pub(super) fn shape(&mut self, c: &Connection, key: [i64; 10]) -> rusqlite::Result<i64> {
        cached(
            &mut self.shapes,
            c,
            "SELECT id FROM kernel_shapes WHERE name = ?1 AND gy = ?2 AND gz = ?3 AND bx = ?4 AND by = ?5
             AND bz = ?6 AND regs = ?7 AND ssmem = ?8 AND dsmem = ?9 AND graph_node = ?10",
            "INSERT INTO kernel_shapes(name, gy, gz, bx, by, bz, regs, ssmem, dsmem, graph_node)
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
            key,
        )
    }

    /// The id of copy shape `key`, inserted if the table has none.
    pub(super) fn memcpy_shape(&mut self, c: &Connection, key: [i64; 7]) -> rusqlite::Result<i64> {
        cached(
            &mut self.memcpy_shapes,
            c,
            "SELECT id FROM memcpy_shapes WHERE kind = ?1 AND src_kind = ?2 AND dst_kind = ?3 AND src_dev = ?4
             AND dst_dev = ?5 AND async = ?6 AND graph_node = ?7",
            "INSERT INTO memcpy_shapes(kind, src_kind, dst_kind, src_dev, dst_dev, async, graph_node)
             VALUES (?1,?2,?3,?4,?5,?6,?7)",
            key,
        )
    }

    /// The id of API call kind `key` (domain, cbid, return value), inserted if the table has none.
    pub(super) fn api_kind(&mut self, c: &Connection, key: [i64; 3]) -> rusqlite::Result<i64> {
        cached(
            &mut self.api_kinds,
            c,
            "SELECT id FROM api_kinds WHERE domain = ?1 AND cbid = ?2 AND ret = ?3",
            "INSERT INTO api_kinds(domain, cbid, ret) VALUES (?1,?2,?3)",
            key,
        )
    }

    /// The id of track `key`, inserted if the table has none.
    pub(super) fn id(&mut self, c: &Connection, key: [i64; 6]) -> rusqlite::Result<i64> {
        cached(
            &mut self.ids,
            c,
            "SELECT id FROM tracks WHERE session = ?1 AND proc = ?2 AND dev = ?3 AND ctx = ?4 AND stream = ?5 AND tid = ?6",
            "INSERT INTO tracks(session, proc, dev, ctx, stream, tid) VALUES (?1,?2,?3,?4,?5,?6)",
            key,
        )
    }
}

/// The id of `key` in `ids`, or else from the table: found by `find` or added by `insert`.
fn cached<const N: usize>(
    ids: &mut Ids<N>,
    c: &Connection,
    find: &str,
    insert: &str,
    key: [i64; N],
) -> rusqlite::Result<i64>
where
    [i64; N]: rusqlite::Params,
{
    if let Some(id) = ids.get(&key) {
        return Ok(*id);
    }
    let id = find_or_insert(c, find, insert, key)?;
    ids.insert(key, id);
    Ok(id)
}

/// The id `find` selects for `key`, or that of the row `insert` adds.
fn find_or_insert<const N: usize>(c: &Connection, find: &str, insert: &str, key: [i64; N]) -> rusqlite::Result<i64>
where
    [i64; N]: rusqlite::Params,
{
    if let Some(id) = c.prepare_cached(find)?.query_row(key, |r| r.get(0)).optional()? {
        return Ok(id);
    }
    c.prepare_cached(insert)?.execute(key)?;
    Ok(c.last_insert_rowid())
}
