//! The writer's caches of the ids of rows that many record rows refer to: tracks, kernel and
//! copy shapes, API call kinds.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension};

/// The writer's copies of `tracks` ((session, process, device, context, stream, thread, base)
/// → id), `kernel_shapes` ((name, grid y, z, block x, y, z, registers, static and dynamic shared
/// memory, graph node) → id), `memcpy_shapes` ((kind, source and destination kinds and devices,
/// async, graph node) → id) and `api_kinds` ((domain, cbid, return value) → id), filled from the
/// tables as records come. Track ids are forgotten whenever something else wrote through the
/// writer's connection (retention deletes tracks; shapes and kinds are never deleted), and
/// everything when a transaction rolled back (its new rows are gone).
#[derive(Default)]
pub(super) struct Tracks {
    ids: Ids<7>,
    shapes: Ids<10>,
    memcpy_shapes: Ids<7>,
    api_kinds: Ids<3>,
}

/// Entries a cache holds before it starts over.
const CACHE_MAX: usize = 1 << 16;

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
    /// After another write through the connection: tracks may have been deleted.
    pub(super) fn forget_tracks(&mut self) {
        self.ids.clear();
    }

    /// After a rollback: rows of every kind inserted in the transaction are gone.
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

    /// The track of a record starting `rel` ns after its process's base, by (session, process,
    /// device, context, stream, thread), inserted if the table has none; and the start its row
    /// stores, relative to the track's `base` (see [`epoch`]).
    pub(super) fn at(&mut self, c: &Connection, key: [i64; 6], rel: i64) -> rusqlite::Result<(i64, i64)> {
        let (base, start) = epoch(rel);
        let [session, proc, dev, ctx, stream, tid] = key;
        let id = cached(
            &mut self.ids,
            c,
            "SELECT id FROM tracks WHERE session = ?1 AND proc = ?2 AND dev = ?3 AND ctx = ?4 AND stream = ?5 AND tid = ?6
             AND base = ?7",
            "INSERT INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (?1,?2,?3,?4,?5,?6,?7)",
            [session, proc, dev, ctx, stream, tid, base],
        )?;
        Ok((id, start))
    }
}

/// A track's `base` for a record starting `rel` ns after its process's base, and the start
/// stored in the record's row: bases are multiples of 2^32 ns (0 for the process's first
/// 2.1 s) and stored starts lie within ±2^31 of them, so a start takes at most 4 bytes
/// however long the process lives (6 bytes otherwise, once it is 2.1 s old).
pub(super) fn epoch(rel: i64) -> (i64, i64) {
    let base = (rel.saturating_add(1 << 31) >> 32) << 32;
    (base, rel.wrapping_sub(base))
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
    // Tracks gain a row every 4.3 s of a stream's records: the cache starts over rather than
    // grow with a long-running process (the table answers until it fills again).
    if ids.len() >= CACHE_MAX {
        ids.clear();
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
