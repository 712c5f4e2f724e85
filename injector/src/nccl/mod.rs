//! NCCL collectives, as NCCL reports them through its profiler plugin interface when
//! `NCCL_PROFILER_PLUGIN` names this library: the C entry points (`exports.rs`) read NCCL's
//! event descriptors into the calls below; this module turns them into [`Collective`]s for the
//! agent thread, which sends them as `CollectiveRecord`s.
//!
//! A collective is a *Coll* event (started and stopped on the thread that launches NCCL's
//! kernel: the enqueue) with, while kernel timing is on, one *KernelCh* child per channel,
//! started and stopped on NCCL's proxy thread with the kernel's own timestamps. It is sent
//! once its enqueue has stopped and every channel it announced has ended, or when it has waited
//! [`STALE`] for channels that never came (then with what arrived).
//!
//! Nothing here blocks NCCL: collectives wait in a fixed ring of slots (each behind its own
//! mutex, which only the enqueuing thread and the proxy thread ever take, briefly), handles are
//! opaque numbers (slot, generation, kind) that are never dereferenced, and the hand-over to the
//! agent is a bounded channel's `try_send` (a full channel counts a drop). NCCL is told to
//! report nothing while no trace runs: every communicator's activation mask is set to 0, so an
//! idle process pays nothing for the plugin.

pub mod abi;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};

/// Collectives in flight at once (enqueued and waiting for their channels).
const SLOTS: usize = 4096;
/// Collectives queued for the agent thread at most.
const QUEUE: usize = 1 << 16;
/// A collective still missing channels after this long is sent with what it has.
pub const STALE: Duration = Duration::from_secs(5);

/// One collective of one rank, as sent to the daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collective {
    /// Enqueue start and end on the host, ns since the Unix epoch.
    pub start_ns: u64,
    pub end_ns: u64,
    /// First channel's start and last channel's end in the kernel (NCCL's GPU timer); 0: none.
    pub gpu_start_ns: u64,
    pub gpu_end_ns: u64,
    pub name: String,
    pub datatype: String,
    pub algo: String,
    pub proto: String,
    pub seq: u64,
    pub comm_hash: u64,
    pub count: u64,
    pub root: i32,
    pub rank: i32,
    pub nranks: u32,
    pub channels: u32,
    pub thread_id: u32,
}

impl Collective {
    /// Bytes moved per rank's buffer: elements times the data type's size (0: unknown type).
    pub fn bytes(&self) -> u64 {
        self.count.saturating_mul(datatype_size(&self.datatype))
    }
}

/// The size of an NCCL data type, by the name NCCL gives it (`ncclDatatypeToString`).
pub fn datatype_size(name: &str) -> u64 {
    match name.strip_prefix("nccl").unwrap_or(name) {
        "Int8" | "Uint8" | "Char" | "Float8e4m3" | "Float8e5m2" => 1,
        "Float16" | "Half" | "Bfloat16" => 2,
        "Int32" | "Uint32" | "Int" | "Float32" | "Float" => 4,
        "Int64" | "Uint64" | "Float64" | "Double" => 8,
        _ => 0,
    }
}

/// What a Coll event's descriptor says (strings copied out of NCCL's).
#[derive(Debug, Clone, Default)]
pub struct CollStart {
    pub seq: u64,
    pub func: String,
    pub datatype: String,
    pub algo: String,
    pub proto: String,
    pub count: u64,
    pub root: i32,
    pub rank: i32,
    pub channels: u32,
}

/// A communicator that initialized the plugin.
#[derive(Debug, Clone, Copy)]
pub struct Comm {
    pub hash: u64,
    pub nranks: u32,
}

/// One slot of the ring.
#[derive(Default)]
struct Slot {
    generation: u32,
    busy: bool,
    stopped: bool,
    channels_done: u32,
    started_at: u64,
    c: Collective,
}

/// The plugin's state: one per process ([`global`]); tests make their own.
pub struct State {
    active: AtomicBool,
    kernel_times: AtomicBool,
    ready: AtomicBool,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
    comms: Mutex<Vec<Option<Comm>>>,
    masks: Mutex<Vec<(usize, &'static AtomicI32)>>,
    tx: Sender<Collective>,
    rx: Receiver<Collective>,
    dropped: AtomicU64,
}

/// The process's plugin state.
pub fn global() -> &'static State {
    static S: OnceLock<State> = OnceLock::new();
    S.get_or_init(State::new)
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

/// Handles: `generation << 32 | slot << 2 | tag`, tag 1 for a collective and 2 for one of its
/// kernel channels; 0 is "no event" to NCCL.
const TAG_COLL: usize = 1;
const TAG_CHANNEL: usize = 2;

fn handle(generation: u32, slot: usize, tag: usize) -> usize {
    ((generation as usize) << 32) | (slot << 2) | tag
}

fn parts(h: usize) -> (u32, usize, usize) {
    ((h >> 32) as u32, (h >> 2) & 0x3fff_ffff, h & 3)
}

/// Now, ns since the Unix epoch (CUPTI's clock for records).
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

impl State {
    pub fn new() -> State {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        State {
            active: AtomicBool::new(false),
            kernel_times: AtomicBool::new(true),
            ready: AtomicBool::new(false),
            slots: (0..SLOTS).map(|_| Mutex::new(Slot::default())).collect(),
            next: AtomicUsize::new(0),
            comms: Mutex::new(Vec::new()),
            masks: Mutex::new(Vec::new()),
            tx,
            rx,
            dropped: AtomicU64::new(0),
        }
    }

    /// The events asked of NCCL while a trace runs.
    fn wanted(&self) -> i32 {
        let mut m = abi::PROFILE_COLL;
        if self.kernel_times.load(Ordering::Relaxed) {
            m |= abi::PROFILE_KERNEL_CH;
        }
        m as i32
    }

    /// Whether kernel timing (KernelCh events) is asked for; set from the configuration.
    pub fn set_kernel_times(&self, on: bool) {
        self.kernel_times.store(on, Ordering::Relaxed);
    }

    /// Called once the agent thread runs: communicators may initialize the plugin from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Starts (a trace began) or stops reporting: every communicator's activation mask
    /// follows. Stopping sends what is still waiting first.
    pub fn set_active(&self, on: bool) {
        if !on {
            self.flush_older_than(0);
        }
        self.active.store(on, Ordering::SeqCst);
        let v = if on { self.wanted() } else { 0 };
        if let Ok(m) = self.masks.lock() {
            for (_, mask) in m.iter() {
                mask.store(v, Ordering::Relaxed);
            }
        }
    }

    /// A communicator initializes the plugin: its context number (never 0), or None when the
    /// agent is not running (NCCL then disables the plugin). `mask` is NCCL's activation mask,
    /// set here to what a running trace wants (0 while none runs).
    pub fn init(&self, comm: Comm, mask: &'static AtomicI32) -> Option<usize> {
        if !self.ready.load(Ordering::SeqCst) {
            return None;
        }
        let id = {
            let mut comms = self.comms.lock().ok()?;
            comms.push(Some(comm));
            comms.len()
        };
        mask.store(if self.active.load(Ordering::SeqCst) { self.wanted() } else { 0 }, Ordering::Relaxed);
        self.masks.lock().ok()?.push((id, mask));
        Some(id)
    }

    /// A communicator is done with the plugin.
    pub fn finalize(&self, context: usize) {
        if let Ok(mut comms) = self.comms.lock()
            && let Some(c) = context.checked_sub(1).and_then(|i| comms.get_mut(i))
        {
            *c = None;
        }
        if let Ok(mut m) = self.masks.lock() {
            m.retain(|(id, _)| *id != context);
        }
    }

    fn comm(&self, context: usize) -> Option<Comm> {
        let comms = self.comms.lock().ok()?;
        *comms.get(context.checked_sub(1)?)?
    }

    /// A collective's enqueue starts (Coll startEvent): its handle, 0 when not reporting.
    pub fn coll_start(&self, context: usize, d: CollStart, thread_id: u32) -> usize {
        if !self.active.load(Ordering::Relaxed) {
            return 0;
        }
        let Some(cm) = self.comm(context) else { return 0 };
        let i = self.next.fetch_add(1, Ordering::Relaxed) % SLOTS;
        let Ok(mut slot) = self.slots[i].lock() else { return 0 };
        if slot.busy {
            // The ring came round to a collective still waiting for channels: sent as it is.
            let old = std::mem::take(&mut slot.c);
            self.send(old);
        }
        let now = now_ns();
        slot.generation = slot.generation.wrapping_add(1);
        slot.busy = true;
        slot.stopped = false;
        slot.channels_done = 0;
        slot.started_at = now;
        slot.c = Collective {
            start_ns: now,
            name: d.func,
            datatype: d.datatype,
            algo: d.algo,
            proto: d.proto,
            seq: d.seq,
            comm_hash: cm.hash,
            count: d.count,
            root: d.root,
            rank: d.rank,
            nranks: cm.nranks,
            channels: d.channels,
            thread_id,
            ..Default::default()
        };
        handle(slot.generation, i, TAG_COLL)
    }

    /// A kernel channel of the collective `parent` starts (KernelCh startEvent, `ptimer`: the
    /// kernel's timestamp): its handle, 0 when the parent is unknown or gone.
    pub fn channel_start(&self, parent: usize, ptimer: u64) -> usize {
        let (generation, i, tag) = parts(parent);
        if tag != TAG_COLL || i >= SLOTS {
            return 0;
        }
        let Ok(mut slot) = self.slots[i].lock() else { return 0 };
        if !slot.busy || slot.generation != generation {
            return 0;
        }
        if ptimer != 0 && (slot.c.gpu_start_ns == 0 || ptimer < slot.c.gpu_start_ns) {
            slot.c.gpu_start_ns = ptimer;
        }
        handle(generation, i, TAG_CHANNEL)
    }

    /// A kernel channel ended in the kernel (KernelChStop state, `ptimer`: its timestamp).
    pub fn channel_end_time(&self, h: usize, ptimer: u64) {
        let (generation, i, tag) = parts(h);
        if tag != TAG_CHANNEL || i >= SLOTS {
            return;
        }
        if let Ok(mut slot) = self.slots[i].lock()
            && slot.busy
            && slot.generation == generation
            && ptimer > slot.c.gpu_end_ns
        {
            slot.c.gpu_end_ns = ptimer;
        }
    }

    /// stopEvent of any handle this state gave out (others are ignored).
    pub fn stop(&self, h: usize) {
        let (generation, i, tag) = parts(h);
        if i >= SLOTS || (tag != TAG_COLL && tag != TAG_CHANNEL) {
            return;
        }
        let Ok(mut slot) = self.slots[i].lock() else { return };
        if !slot.busy || slot.generation != generation {
            return;
        }
        if tag == TAG_COLL {
            slot.stopped = true;
            slot.c.end_ns = now_ns();
        } else {
            slot.channels_done += 1;
        }
        let channels_wanted = if self.kernel_times.load(Ordering::Relaxed) { slot.c.channels } else { 0 };
        if slot.stopped && slot.channels_done >= channels_wanted {
            slot.busy = false;
            let c = std::mem::take(&mut slot.c);
            self.send(c);
        }
    }

    fn send(&self, c: Collective) {
        if self.tx.try_send(c).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sends the collectives whose enqueue ended, started more than `age_ns` ago, and still
    /// wait for channels (0: every one whose enqueue ended).
    pub fn flush_older_than(&self, age_ns: u64) {
        let now = now_ns();
        for m in &self.slots {
            let Ok(mut slot) = m.lock() else { continue };
            if slot.busy && slot.stopped && now.saturating_sub(slot.started_at) >= age_ns {
                slot.busy = false;
                let c = std::mem::take(&mut slot.c);
                self.send(c);
            }
        }
    }

    /// The collectives ready for the agent thread.
    pub fn drain(&self, mut each: impl FnMut(Collective)) {
        while let Ok(c) = self.rx.try_recv() {
            each(c);
        }
    }

    /// Collectives lost because the queue to the agent thread was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
