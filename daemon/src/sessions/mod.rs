//! Profiling sessions: which processes to trace, what to collect, when to start and stop.
//!
//! A session moves pending → active → stopping → completed | failed, or to interrupted
//! when the daemon stops while it is open. Its row in `sessions` (and its members in
//! `session_processes`) follow every transition, so a restart finds open sessions and
//! marks them interrupted ([`recover`]) instead of forgetting them; their records stay.
//!
//! Open sessions live in memory ([`Sessions`]); one supervisor task ([`supervise`]) reacts to
//! agents connecting (late join), disconnecting and reporting trace states (displaced),
//! and to deadlines (start time, duration, record limit, flush timeout). Commands go to
//! injectors as `StartTrace`/`StopTrace`. Database writes are queued in order to one
//! persister task that runs them on the writer connection.
//!
//! A process is traced for one session at a time: broad targets skip processes another
//! session holds (they join once it ends), a pid target that is held is refused. The
//! always-on profile is the exception: it gives its processes to any session that wants them.
//!
//! The parts, each using only those listed before it (this file, the [`Sessions`] handle,
//! comes after `store`):
//! - [`spec`]: what a session is asked for, its targets and what it collects;
//! - [`state`]: session states and the state of each open session (no I/O);
//! - [`store`]: the `sessions`/`session_processes` rows: the persister task, [`recover`], reading;
//! - [`hints`]: the new-process hint file;
//! - [`pc`]: PC-sampling leases of the members and their states;
//! - [`supervisor`]: transitions with their commands to agents, and the supervisor task ([`supervise`]);
//! - [`api`]: the StartSession, StopSession, GetSession and ListSessions handlers;
//! - [`node`]: the node's always-on PC profile, a session gpuprofd starts itself.

pub(crate) mod api;
mod hints;
mod node;
pub(crate) mod pc;
pub(crate) mod pm;
mod spec;
mod state;
mod store;
pub(crate) mod supervisor;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, mpsc, oneshot};

pub(crate) use self::api::{get, list, start, stop};
pub use self::node::NODE_NAME;
pub(crate) use self::node::start_always_on;
pub use self::spec::{Collect, TargetSpec};
pub use self::state::{STOP_FLUSH_TIMEOUT, State};
pub use self::store::{load, recover};
pub(crate) use self::supervisor::supervise;

use self::state::Inner;
use self::store::{Op, persist};
use crate::ingest::WriterHandle;

/// The session manager, one per daemon.
pub struct Sessions {
    inner: Arc<Mutex<Inner>>,
    ops: mpsc::UnboundedSender<Op>,
    wake: Notify,
    /// The node's always-on PC profile session (0: none).
    node: AtomicU64,
}

impl Sessions {
    /// The node's always-on PC profile session (`[pc] always_on`), 0 when there is none.
    pub fn node(&self) -> u64 {
        self.node.load(Relaxed)
    }

    /// Wakes the supervisor to look at its deadlines again (e.g. a PC-sampling retry became due).
    pub fn wake_supervisor(&self) {
        self.wake.notify_one();
    }

    /// The owner of session `id` while it is open; `None` once it has ended (or never was).
    pub fn live_owner(&self, id: u64) -> Option<u32> {
        self.lock().open.get(&id).map(|l| l.owner_uid)
    }

    /// Creates the manager and its persister, the task that writes session rows through
    /// `writer` in order; the caller spawns it (the `runtime` module does).
    pub fn new(writer: WriterHandle) -> (Sessions, impl Future<Output = ()> + Send + 'static) {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (ops, rx) = mpsc::unbounded_channel();
        let persister = persist(writer, rx, inner.clone());
        (Sessions { inner, ops, wake: Notify::new(), node: AtomicU64::new(0) }, persister)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn op(&self, op: Op) {
        // The persister lives as long as this sender; a send fails only during teardown.
        let _ = self.ops.send(op);
    }

    /// Sessions pending, active or stopping.
    pub fn open_count(&self) -> usize {
        self.lock().open.len()
    }

    /// Whether session `id` is pending, active or stopping.
    pub fn is_open(&self, id: u64) -> bool {
        self.lock().open.get(&id).is_some_and(|l| l.state.is_open())
    }

    /// The session an agent is traced for, if any.
    pub fn session_of(&self, agent_id: u64) -> Option<u64> {
        self.lock().busy.get(&agent_id).copied()
    }

    /// Waits until every state change so far is in the database.
    pub async fn persisted(&self) {
        let (tx, rx) = oneshot::channel();
        self.op(Op::Barrier(tx));
        let _ = rx.await;
    }
}
