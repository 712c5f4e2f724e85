//! The node's cache of cubins for processes attached late: a process PC-sampled from the
//! middle of its run finds the cubins of modules it loaded before sampling began by reading
//! the fatbins of the files it has mapped (seconds of CPU in a PyTorch process). It asks the
//! daemon first (`CubinQuery`): cubins already stored (sent by any process, at module load or
//! after its own look) go back to it whole, and cubins that a process recently looked for and
//! found in none of its files (`CubinsNotFound`, e.g. cuBLAS's GEMM kernels, which are in no
//! fatbin cubin of `libcublasLt`) are answered as such, so that the next process of the same
//! job does not read the same libraries for nothing. The key is CUPTI's CRC of the cubin:
//! its content, whichever file or container it came from. A process gets only what
//! processes of its own user (or root) sent or reported: a cubin is parsed inside the
//! process that receives it, and no user's upload reaches another user's processes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuprof_proto::agent::{self as wire, CubinAnswer, CubinChunk, DaemonMessage, daemon_message::Msg};
use rusqlite::OptionalExtension;

/// How long a "found in no mapped file" report holds (a new library version may bring it).
pub const NOWHERE_FOR: Duration = Duration::from_secs(3600);
/// Reports kept at most (the oldest go first).
pub const MAX_NOWHERE: usize = 65_536;
/// Largest piece of a cubin sent to an agent (the injector reads frames of up to 1 MiB).
pub const ANSWER_CHUNK: usize = 512 << 10;
/// Cubin bytes one answer sends at most (the rest are answered unknown: the process looks).
pub const MAX_ANSWER_BYTES: usize = 128 << 20;
/// Answers being read or sent at once, node-wide (each holds its cubins in memory).
static ANSWERING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// Cubins reported found in no mapped file, by the reporting process's uid, and when.
#[derive(Default)]
pub struct Nowhere {
    seen: Mutex<HashMap<(u32, String), Instant>>,
}

impl Nowhere {
    /// Notes `hashes` as found in no mapped file now by a process of `uid`.
    pub fn note<'a>(&self, uid: u32, hashes: impl IntoIterator<Item = &'a String>, now: Instant) {
        let mut g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for h in hashes {
            g.insert((uid, h.clone()), now);
        }
        if g.len() > MAX_NOWHERE {
            g.retain(|_, t| now.duration_since(*t) < NOWHERE_FOR);
            while g.len() > MAX_NOWHERE {
                let Some(oldest) = g.iter().min_by_key(|(_, t)| **t).map(|(k, _)| k.clone()) else { break };
                g.remove(&oldest);
            }
        }
    }

    /// Whether a process of `uid` or root reported `hash` found in no mapped file within
    /// [`NOWHERE_FOR`] of `now`.
    pub fn contains(&self, uid: u32, hash: &str, now: Instant) -> bool {
        let g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let recent = |u: u32| g.get(&(u, hash.to_string())).is_some_and(|t| now.duration_since(*t) < NOWHERE_FOR);
        recent(uid) || recent(0)
    }
}

/// The answer to one query of a process of `uid`, in the order it goes out: the stored
/// cubins' pieces (those sent by a process of `uid` or root, up to `max_bytes` in all), then
/// the `CubinAnswer`. Reads the database (blocking: run it off the async threads).
pub fn answer(
    db: &Path,
    uid: u32,
    hashes: &[String],
    nowhere: &Nowhere,
    now: Instant,
    max_bytes: usize,
) -> Vec<DaemonMessage> {
    let reader = crate::store::open_reader(db)
        .map_err(|e| tracing::warn!(error = %format!("{e:#}"), "cubin query: database not readable"))
        .ok();
    let mut out = Vec::new();
    let mut a = CubinAnswer::default();
    let mut bytes = 0;
    for h in hashes {
        if a.sent.contains(h) || a.nowhere.contains(h) || a.unknown.contains(h) {
            continue;
        }
        let stored = reader.as_ref().and_then(|c| {
            c.query_row(
                "SELECT c.data FROM cubins c JOIN processes p ON p.id = c.proc WHERE c.hash = ?1 AND p.uid IN (?2, 0)",
                rusqlite::params![h, uid],
                |r| r.get::<_, Vec<u8>>(0),
            )
            .optional()
            .map_err(|e| tracing::warn!(error = %e, hash = %h, "cubin query: reading a stored cubin"))
            .ok()
            .flatten()
        });
        match stored {
            Some(data) if !data.is_empty() && bytes + data.len() <= max_bytes => {
                bytes += data.len();
                for (i, piece) in data.chunks(ANSWER_CHUNK).enumerate() {
                    out.push(DaemonMessage {
                        msg: Some(Msg::Cubin(CubinChunk {
                            hash: h.clone(),
                            size: data.len() as u64,
                            offset: (i * ANSWER_CHUNK) as u64,
                            data: piece.to_vec(),
                        })),
                    });
                }
                a.sent.push(h.clone());
            }
            _ if nowhere.contains(uid, h, now) => a.nowhere.push(h.clone()),
            _ => a.unknown.push(h.clone()),
        }
    }
    out.push(DaemonMessage { msg: Some(Msg::CubinAnswer(a)) });
    out
}

/// Answers a query of a process of `uid` on its command queue `to` ([`answer`] off the async
/// threads, at most a few at once node-wide).
pub async fn serve(
    db: std::path::PathBuf,
    uid: u32,
    hashes: Vec<String>,
    nowhere: std::sync::Arc<Nowhere>,
    to: tokio::sync::mpsc::Sender<wire::DaemonMessage>,
) {
    let Ok(_turn) = ANSWERING.acquire().await else { return };
    let now = Instant::now();
    let Ok(msgs) =
        tokio::task::spawn_blocking(move || answer(&db, uid, &hashes, &nowhere, now, MAX_ANSWER_BYTES)).await
    else {
        return;
    };
    for m in msgs {
        if to.send(m).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_hold_for_a_while_and_the_oldest_go_first_past_the_bound() {
        let n = Nowhere::default();
        let t0 = Instant::now();
        n.note(1000, &["00000000000000aa".to_string()], t0);
        n.note(0, &["00000000000000dd".to_string()], t0);
        assert!(n.contains(1000, "00000000000000aa", t0 + Duration::from_secs(60)));
        assert!(!n.contains(1001, "00000000000000aa", t0), "another user's report does not hold for this one");
        assert!(n.contains(1001, "00000000000000dd", t0), "root's holds for everyone");
        assert!(!n.contains(1000, "00000000000000aa", t0 + NOWHERE_FOR), "an old report no longer holds");
        assert!(!n.contains(1000, "00000000000000bb", t0));
        let many: Vec<String> = (0..MAX_NOWHERE + 10).map(|i| format!("{i:016x}")).collect();
        for (i, h) in many.iter().enumerate() {
            n.note(7, [h], t0 + Duration::from_millis(i as u64));
        }
        let later = t0 + Duration::from_secs(120);
        assert!(!n.contains(7, &many[0], later), "the oldest went past the bound");
        assert!(n.contains(7, &many[MAX_NOWHERE + 9], later));
        assert!(n.seen.lock().unwrap().len() <= MAX_NOWHERE);
    }

    #[test]
    fn stored_cubins_go_whole_in_pieces_then_the_answer_lists_every_hash() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE TABLE processes(id INTEGER PRIMARY KEY, uid INTEGER);
             CREATE TABLE cubins(hash TEXT PRIMARY KEY, data BLOB, proc INTEGER);
             INSERT INTO processes VALUES (1, 1000), (2, 1001);
             INSERT INTO cubins VALUES ('00000000000000ee', x'7f454c46', 2);",
        )
        .unwrap();
        let big: Vec<u8> = (0..ANSWER_CHUNK * 2 + 100).map(|i| (i % 251) as u8).collect();
        c.execute("INSERT INTO cubins(hash, data, proc) VALUES ('00000000000000aa', ?1, 1)", [&big]).unwrap();
        let n = Nowhere::default();
        let now = Instant::now();
        n.note(1000, &["00000000000000bb".to_string()], now);
        let asked: Vec<String> =
            ["00000000000000aa", "00000000000000bb", "00000000000000cc", "00000000000000aa", "00000000000000ee"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let out = answer(&db, 1000, &asked, &n, now, MAX_ANSWER_BYTES);
        let mut got: Vec<u8> = Vec::new();
        for m in &out[..out.len() - 1] {
            let Some(Msg::Cubin(p)) = &m.msg else { panic!("pieces first: {m:?}") };
            assert_eq!((p.hash.as_str(), p.size, p.offset as usize), ("00000000000000aa", big.len() as u64, got.len()));
            assert!(p.data.len() <= ANSWER_CHUNK);
            got.extend(&p.data);
        }
        assert_eq!(got, big, "the cubin goes whole, once");
        let Some(Msg::CubinAnswer(a)) = &out.last().unwrap().msg else { panic!("the answer last") };
        assert_eq!(a.sent, ["00000000000000aa"]);
        assert_eq!(a.nowhere, ["00000000000000bb"]);
        assert_eq!(a.unknown, ["00000000000000cc", "00000000000000ee"], "another user's cubin is not handed out");

        let out = answer(&db, 1000, &asked[..1], &n, now, big.len() - 1);
        let [m] = &out[..] else { panic!("only the answer: {out:?}") };
        let Some(Msg::CubinAnswer(a)) = &m.msg else { panic!() };
        assert_eq!(a.unknown, ["00000000000000aa"], "past the bytes of one answer, the process looks itself");
    }
}
