//! The node's cache of cubins for processes attached late: a process PC-sampled from the
//! middle of its run finds the cubins of modules it loaded before sampling began by reading
//! the fatbins of the files it has mapped (seconds of CPU in a PyTorch process). It asks the
//! daemon first (`CubinQuery`): cubins already stored (sent by any process, at module load or
//! after its own look) go back to it whole, and cubins that a process recently looked for and
//! found in none of its files (`CubinsNotFound`, e.g. cuBLAS's GEMM kernels, which are in no
//! fatbin cubin of `libcublasLt`) are answered as such, so that the next process of the same
//! job does not read the same libraries for nothing. The key is CUPTI's CRC of the cubin:
//! its content, whichever file it came from. A process gets only what processes of its own
//! scope sent or reported (the same uid, and the same pod, or container outside pods): a cubin
//! is parsed inside the process that receives it, and CUPTI's CRC is no defence against a
//! crafted one, so no tenant's upload reaches another's processes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuprof_proto::agent::{self as wire, CubinAnswer, CubinChunk, DaemonMessage, daemon_message::Msg};
use rusqlite::OptionalExtension;

/// How long a "found in no mapped file" report holds (a new library version may bring it).
pub const NOWHERE_FOR: Duration = Duration::from_secs(3600);
/// Largest piece of a cubin sent to an agent (the injector reads frames of up to 1 MiB).
pub const ANSWER_CHUNK: usize = 512 << 10;
/// Cubin bytes one answer sends at most (the rest are answered unknown: the process looks).
pub const MAX_ANSWER_BYTES: usize = 128 << 20;
/// Answers being read or sent at once, node-wide (each holds its cubins in memory).
static ANSWERING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// Whose uploads and reports a process may be answered with: the same uid, and the same pod
/// (outside pods, the same container; neither: the host).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Scope {
    pub uid: u32,
    pub pod_uid: String,
    /// Only outside pods (empty in one).
    pub container_id: String,
}

impl Scope {
    pub fn of(a: &crate::registry::Agent) -> Scope {
        let p = &a.placement;
        let container_id = if p.pod_uid.is_empty() { p.container_id.clone() } else { String::new() };
        Scope { uid: a.uid, pod_uid: p.pod_uid.clone(), container_id }
    }
}

/// Reports kept per scope at most (the oldest go first).
pub const MAX_NOWHERE_PER_SCOPE: usize = 4096;
/// Scopes with reports kept at most (the one with the oldest latest report goes first).
pub const MAX_SCOPES: usize = 1024;

/// Cubins reported found in no mapped file, per scope, and when.
#[derive(Default)]
pub struct Nowhere {
    seen: Mutex<HashMap<Scope, HashMap<String, Instant>>>,
}

impl Nowhere {
    /// Notes `hashes` as found in no mapped file now by a process of `scope`.
    pub fn note<'a>(&self, scope: &Scope, hashes: impl IntoIterator<Item = &'a String>, now: Instant) {
        let mut g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mine = g.entry(scope.clone()).or_default();
        for h in hashes {
            mine.insert(h.clone(), now);
        }
        if mine.len() > MAX_NOWHERE_PER_SCOPE {
            mine.retain(|_, t| now.duration_since(*t) < NOWHERE_FOR);
        }
        if mine.len() > MAX_NOWHERE_PER_SCOPE {
            // One pass: the times of the newest MAX_NOWHERE_PER_SCOPE stay.
            let mut times: Vec<Instant> = mine.values().copied().collect();
            let cut = times.len() - MAX_NOWHERE_PER_SCOPE;
            let (_, nth, _) = times.select_nth_unstable(cut);
            let keep_from = *nth;
            mine.retain(|_, t| *t >= keep_from);
        }
        if g.len() > MAX_SCOPES {
            g.retain(|_, m| m.values().any(|t| now.duration_since(*t) < NOWHERE_FOR));
            while g.len() > MAX_SCOPES {
                let stalest = g.iter().min_by_key(|(_, m)| m.values().max().copied()).map(|(s, _)| s.clone());
                let Some(s) = stalest else { break };
                g.remove(&s);
            }
        }
    }

    /// Whether a process of `scope` reported `hash` found in no mapped file within
    /// [`NOWHERE_FOR`] of `now`.
    pub fn contains(&self, scope: &Scope, hash: &str, now: Instant) -> bool {
        let g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        g.get(scope).and_then(|m| m.get(hash)).is_some_and(|t| now.duration_since(*t) < NOWHERE_FOR)
    }
}

/// The answer to one query of a process of `scope`, in the order it goes out: the stored
/// cubins' pieces (those sent by a process of the same scope, up to `max_bytes` in all), then
/// the `CubinAnswer`. Reads the database (blocking: run it off the async threads).
pub fn answer(
    db: &Path,
    scope: &Scope,
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
                "SELECT c.data FROM cubins c JOIN processes p ON p.id = c.proc
                 WHERE c.hash = ?1 AND p.uid = ?2 AND p.pod_uid = ?3 AND (?3 <> '' OR p.container_id = ?4)",
                rusqlite::params![h, scope.uid, scope.pod_uid, scope.container_id],
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
            _ if nowhere.contains(scope, h, now) => a.nowhere.push(h.clone()),
            _ => a.unknown.push(h.clone()),
        }
    }
    out.push(DaemonMessage { msg: Some(Msg::CubinAnswer(a)) });
    out
}

/// The agent's command queue keeps this many places for commands (lease and trace starts and
/// stops go in with `try_send`): an answer's pieces wait for room above it.
pub const COMMAND_RESERVE: usize = 64;
/// How long one answer may take to go out (a process that does not read gets no more).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// One connection's answers: they go out one after another, and at most two wait.
#[derive(Default)]
pub struct Answers {
    one_at_a_time: std::sync::Arc<tokio::sync::Mutex<()>>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Answers {
    /// The task that answers a query of a process of `scope` (a database read, then the pieces
    /// in order on the command queue `to`), for the connection to start beside its reading;
    /// None when two answers wait already (the process looks itself after a while).
    pub fn task(
        &self,
        db: std::path::PathBuf,
        scope: Scope,
        hashes: Vec<String>,
        nowhere: std::sync::Arc<Nowhere>,
        to: tokio::sync::mpsc::Sender<wire::DaemonMessage>,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.waiting.fetch_add(1, Relaxed) >= 2 {
            self.waiting.fetch_sub(1, Relaxed);
            return None;
        }
        let (one_at_a_time, waiting) = (self.one_at_a_time.clone(), self.waiting.clone());
        Some(async move {
            {
                let _turn = one_at_a_time.lock().await;
                serve(db, scope, hashes, nowhere, to).await;
            }
            waiting.fetch_sub(1, Relaxed);
        })
    }
}

/// Answers a query of a process of `scope` on its command queue `to` ([`answer`] off the
/// async threads, at most a few at once node-wide), leaving [`COMMAND_RESERVE`] places of the
/// queue to commands and giving up after [`ANSWER_WITHIN`].
async fn serve(
    db: std::path::PathBuf,
    scope: Scope,
    hashes: Vec<String>,
    nowhere: std::sync::Arc<Nowhere>,
    to: tokio::sync::mpsc::Sender<wire::DaemonMessage>,
) {
    let go = async {
        let Ok(_turn) = ANSWERING.acquire().await else { return };
        if to.is_closed() {
            return;
        }
        let now = Instant::now();
        let Ok(msgs) =
            tokio::task::spawn_blocking(move || answer(&db, &scope, &hashes, &nowhere, now, MAX_ANSWER_BYTES)).await
        else {
            return;
        };
        for m in msgs {
            while to.capacity() <= COMMAND_RESERVE {
                if to.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if to.send(m).await.is_err() {
                return;
            }
        }
    };
    if tokio::time::timeout(ANSWER_WITHIN, go).await.is_err() {
        tracing::debug!("cubin answer given up: the process did not read it in time");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_hold_for_a_while_and_the_oldest_go_first_past_the_bound() {
        let n = Nowhere::default();
        let t0 = Instant::now();
        let user = |uid, pod: &str| Scope { uid, pod_uid: pod.into(), container_id: String::new() };
        n.note(&user(1000, "p1"), &["00000000000000aa".to_string()], t0);
        assert!(n.contains(&user(1000, "p1"), "00000000000000aa", t0 + Duration::from_secs(60)));
        assert!(!n.contains(&user(1001, "p1"), "00000000000000aa", t0), "another user's report does not hold");
        assert!(!n.contains(&user(1000, "p2"), "00000000000000aa", t0), "another pod's report does not hold");
        assert!(!n.contains(&user(0, "p1"), "00000000000000aa", t0), "nor for root");
        assert!(!n.contains(&user(1000, "p1"), "00000000000000aa", t0 + NOWHERE_FOR), "an old report no longer holds");
        assert!(!n.contains(&user(1000, "p1"), "00000000000000bb", t0));
        let many: Vec<String> = (0..MAX_NOWHERE_PER_SCOPE + 10).map(|i| format!("{i:016x}")).collect();
        for (i, h) in many.iter().enumerate() {
            n.note(&user(7, ""), [h], t0 + Duration::from_millis(i as u64));
        }
        let later = t0 + Duration::from_secs(120);
        assert!(!n.contains(&user(7, ""), &many[0], later), "the oldest went past the bound");
        assert!(n.contains(&user(7, ""), &many[MAX_NOWHERE_PER_SCOPE + 9], later));
        assert!(
            n.contains(&user(1000, "p1"), "00000000000000aa", later),
            "one scope's reports do not push out another's"
        );
        assert_eq!(n.seen.lock().unwrap()[&user(7, "")].len(), MAX_NOWHERE_PER_SCOPE);
        for uid in 0..MAX_SCOPES as u32 + 5 {
            n.note(
                &user(20_000 + uid, ""),
                &["00000000000000cc".to_string()],
                later + Duration::from_millis(uid.into()),
            );
        }
        assert!(n.seen.lock().unwrap().len() <= MAX_SCOPES);
    }

    #[test]
    fn stored_cubins_go_whole_in_pieces_then_the_answer_lists_every_hash() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE TABLE processes(id INTEGER PRIMARY KEY, uid INTEGER, pod_uid TEXT, container_id TEXT);
             CREATE TABLE cubins(hash TEXT PRIMARY KEY, data BLOB, proc INTEGER);
             INSERT INTO processes VALUES (1, 1000, '', 'c1'), (2, 1001, '', 'c1'), (3, 1000, '', 'c2');
             INSERT INTO cubins VALUES ('00000000000000ee', x'7f454c46', 2), ('00000000000000ff', x'7f454c46', 3);",
        )
        .unwrap();
        let big: Vec<u8> = (0..ANSWER_CHUNK * 2 + 100).map(|i| (i % 251) as u8).collect();
        c.execute("INSERT INTO cubins(hash, data, proc) VALUES ('00000000000000aa', ?1, 1)", [&big]).unwrap();
        let n = Nowhere::default();
        let now = Instant::now();
        let me = Scope { uid: 1000, pod_uid: String::new(), container_id: "c1".into() };
        n.note(&me, &["00000000000000bb".to_string()], now);
        let asked: Vec<String> = [
            "00000000000000aa",
            "00000000000000bb",
            "00000000000000cc",
            "00000000000000aa",
            "00000000000000ee",
            "00000000000000ff",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = answer(&db, &me, &asked, &n, now, MAX_ANSWER_BYTES);
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
        assert_eq!(
            a.unknown,
            ["00000000000000cc", "00000000000000ee", "00000000000000ff"],
            "another user's or container's cubin is not handed out"
        );

        let out = answer(&db, &me, &asked[..1], &n, now, big.len() - 1);
        let [m] = &out[..] else { panic!("only the answer: {out:?}") };
        let Some(Msg::CubinAnswer(a)) = &m.msg else { panic!() };
        assert_eq!(a.unknown, ["00000000000000aa"], "past the bytes of one answer, the process looks itself");
    }
}
