//! Model test of the performance-monitor arbiter, driven by a fake clock.
//!
//! A deliberately naive model says who must hold each device: among the live leases of a
//! device, the highest priority wins, ties going to the oldest request. Random operation
//! sequences (requests, pauses, resumes, releases, connection deaths, time passing,
//! hardware-busy reports, daemon restarts) run against both; after every step the holder,
//! the queue, the external mark and the audit rows must agree, and the events must tell a
//! consumer exactly the holder changes. A restart goes through the real database rows.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};

use gpuprofd::arbiter::core::{Core, Event, Holder, Lease, LeaseId, Nanos, Timing};
use gpuprofd::arbiter::persist;
use proptest::prelude::*;
use rusqlite::Connection;

const S: Nanos = 1_000_000_000;
const DEVICES: [u32; 3] = [0, 1, 2];
const T0: Nanos = 1_700_000_000 * S;

fn timing() -> Timing {
    Timing { retry_initial: S, retry_max: 8 * S }
}

fn db() -> Connection {
    let c = Connection::open_in_memory().unwrap();
    gpuprofd::store::migrate(&c).unwrap();
    c
}

#[derive(Debug, Clone)]
enum Op {
    Advance(Nanos),
    RequestPc { device: u32, conn: u64, ttl: Option<Nanos> },
    Pause { mask: u8, uid: u32, ttl: Nanos },
    Resume { mask: u8 },
    Release { pick: usize },
    CloseConn { conn: u64 },
    Busy { device: u32 },
    Clear { device: u32 },
    Restart { down: Nanos },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6 * S).prop_map(Op::Advance),
        4 => (0..3u32, 0..4u64, prop::option::of(1..10 * S))
            .prop_map(|(device, conn, ttl)| Op::RequestPc { device, conn, ttl }),
        2 => (1..8u8, 0..3u32, 1..12 * S).prop_map(|(mask, uid, ttl)| Op::Pause { mask, uid, ttl }),
        1 => (1..8u8).prop_map(|mask| Op::Resume { mask }),
        2 => (0..64usize).prop_map(|pick| Op::Release { pick }),
        1 => (0..4u64).prop_map(|conn| Op::CloseConn { conn }),
        2 => (0..3u32).prop_map(|device| Op::Busy { device }),
        1 => (0..3u32).prop_map(|device| Op::Clear { device }),
        1 => (0..20 * S).prop_map(|down| Op::Restart { down }),
    ]
}

fn devices_of(mask: u8) -> Vec<u32> {
    DEVICES.iter().copied().filter(|d| mask & (1 << d) != 0).collect()
}

#[derive(Debug, Clone, PartialEq)]
struct MLease {
    id: LeaseId,
    device: u32,
    prio: u32,
    requested: Nanos,
    expires: Option<Nanos>,
    conn: Option<u64>,
    pause: bool,
}

#[derive(Debug, Default)]
struct Model {
    now: Nanos,
    leases: Vec<MLease>,
    /// device → (attempts, retry_at)
    external: HashMap<u32, (u32, Option<Nanos>)>,
}

impl Model {
    fn holder(&self, device: u32) -> Option<&MLease> {
        self.leases.iter().filter(|l| l.device == device).min_by_key(|l| (std::cmp::Reverse(l.prio), l.requested, l.id))
    }

    fn waiting(&self, device: u32) -> Vec<LeaseId> {
        let h = self.holder(device).map(|l| l.id);
        let mut w: Vec<&MLease> = self.leases.iter().filter(|l| l.device == device && Some(l.id) != h).collect();
        w.sort_by_key(|l| (std::cmp::Reverse(l.prio), l.requested, l.id));
        w.iter().map(|l| l.id).collect()
    }

    fn holders(&self) -> BTreeMap<u32, Option<LeaseId>> {
        DEVICES.iter().map(|d| (*d, self.holder(*d).map(|l| l.id))).collect()
    }

    /// A changed holder means the external mark no longer applies.
    fn clear_external_on_change(&mut self, before: &BTreeMap<u32, Option<LeaseId>>) {
        for (d, h) in self.holders() {
            if before.get(&d) != Some(&h) {
                self.external.remove(&d);
            }
        }
    }

    fn learn(&mut self, ev: &[Event]) {
        for e in ev {
            if let Event::Granted { lease } | Event::Queued { lease } = e
                && !self.leases.iter().any(|l| l.id == lease.id)
            {
                self.leases.push(mlease(lease));
            }
        }
    }
}

fn mlease(l: &Lease) -> MLease {
    MLease {
        id: l.id,
        device: l.device,
        prio: l.priority,
        requested: l.requested_at,
        expires: l.expires_at,
        conn: l.conn,
        pause: matches!(l.holder, Holder::Pause { .. }),
    }
}

/// What a consumer of the events believes each device's holder is.
#[derive(Default)]
struct Observer {
    holder: BTreeMap<u32, Option<LeaseId>>,
    grants: u64,
    revokes: u64,
    expiries: u64,
    releases: u64,
}

impl Observer {
    fn apply(&mut self, ev: &[Event]) {
        for e in ev {
            match e {
                Event::Granted { lease } => {
                    let h = self.holder.entry(lease.device).or_default();
                    assert!(h.is_none(), "granted {} while {:?} still holds device {}", lease.id, h, lease.device);
                    *h = Some(lease.id);
                    self.grants += 1;
                }
                Event::Revoked { lease, .. } => {
                    let h = self.holder.entry(lease.device).or_default();
                    assert_eq!(*h, Some(lease.id), "revoked a lease that did not hold the device");
                    *h = None;
                    self.revokes += 1;
                }
                Event::Released { lease, was_holder, .. } | Event::Expired { lease, was_holder } => {
                    let h = self.holder.entry(lease.device).or_default();
                    if *was_holder {
                        assert_eq!(*h, Some(lease.id), "ended a lease said to hold the device, but it did not");
                        *h = None;
                    } else {
                        assert_ne!(*h, Some(lease.id), "a holder ended with was_holder = false");
                    }
                    if matches!(e, Event::Expired { .. }) {
                        self.expiries += 1;
                    } else {
                        self.releases += 1;
                    }
                }
                _ => {}
            }
        }
    }
}

struct Harness {
    core: Core,
    model: Model,
    obs: Observer,
    db: Connection,
}

impl Harness {
    fn new() -> Harness {
        let mut h = Harness {
            core: Core::new(timing(), 0),
            model: Model { now: T0, ..Default::default() },
            obs: Observer::default(),
            db: db(),
        };
        for d in DEVICES {
            let ev = h.core.add_device(d, T0);
            h.model.learn(&ev);
            h.emit(&ev);
        }
        h
    }

    fn emit(&mut self, ev: &[Event]) {
        self.obs.apply(ev);
        persist::apply(&mut self.db, ev, self.model.now).unwrap();
    }

    fn step(&mut self, op: &Op) {
        let before = self.model.holders();
        let now = self.model.now;
        let mut retry_expected: Vec<u32> = Vec::new();
        let ev = match op {
            Op::Advance(dt) => {
                self.model.now += dt;
                let now = self.model.now;
                self.model.leases.retain(|l| l.expires.is_none_or(|e| e > now));
                self.model.clear_external_on_change(&before);
                for (d, (_, at)) in self.model.external.iter_mut() {
                    if at.is_some_and(|t| t <= now) {
                        *at = None;
                        retry_expected.push(*d);
                    }
                }
                self.core.tick(now)
            }
            Op::RequestPc { device, conn, ttl } => {
                let holder = Holder::PcSampling {
                    session: 1,
                    proc: *conn,
                    pid: 100 + *conn as u32,
                    agent_device: *device,
                    period_log2: 10,
                };
                let (id, ev) = self.core.request(*device, holder, "pc".into(), *ttl, Some(*conn), now).unwrap();
                self.model.learn(&ev);
                assert!(self.model.leases.iter().any(|l| l.id == id));
                self.model.clear_external_on_change(&before);
                ev
            }
            Op::Pause { mask, uid, ttl } => {
                let devs = devices_of(*mask);
                for d in &devs {
                    if let Some(h) = self.model.holder(*d).filter(|h| h.pause).map(|h| h.id)
                        && let Some(l) = self.model.leases.iter_mut().find(|l| l.id == h)
                    {
                        l.expires = Some(now + ttl);
                    }
                }
                let (leases, ev) = self.core.pause(&devs, *uid, "ncu", *ttl, now).unwrap();
                assert_eq!(leases.len(), devs.len());
                self.model.learn(&ev);
                self.model.clear_external_on_change(&before);
                for d in &devs {
                    let h = self.model.holder(*d).unwrap();
                    assert!(h.pause && h.expires == Some(now + ttl));
                }
                ev
            }
            Op::Resume { mask } => {
                let devs = devices_of(*mask);
                let mut expect = Vec::new();
                for d in &devs {
                    if let Some(id) = self.model.holder(*d).filter(|h| h.pause).map(|h| h.id) {
                        self.model.leases.retain(|l| l.id != id);
                        expect.push(*d);
                    }
                }
                self.model.clear_external_on_change(&before);
                let (resumed, ev) = self.core.resume(&devs, 0, now).unwrap();
                assert_eq!(resumed, expect);
                ev
            }
            Op::Release { pick } => {
                // Release a non-sampler lease (the sampler's lives as long as the daemon).
                let candidates: Vec<LeaseId> =
                    self.model.leases.iter().filter(|l| l.prio != 100).map(|l| l.id).collect();
                if candidates.is_empty() {
                    return;
                }
                let id = candidates[pick % candidates.len()];
                self.model.leases.retain(|l| l.id != id);
                self.model.clear_external_on_change(&before);
                self.core.release(id, "test", "released", now).unwrap()
            }
            Op::CloseConn { conn } => {
                self.model.leases.retain(|l| l.conn != Some(*conn));
                self.model.clear_external_on_change(&before);
                self.core.connection_closed(*conn, now)
            }
            Op::Busy { device } => {
                if let Some(h) = self.model.holder(*device).filter(|h| !h.pause) {
                    let id = h.id;
                    let x = self.model.external.entry(*device).or_insert((0, None));
                    x.0 += 1;
                    x.1 = Some(now + timing().backoff(x.0));
                    let ev = self.core.external_busy(*device, Some(id), now);
                    assert!(matches!(ev.as_slice(), [Event::ExternalBusy { retry_at, .. }] if *retry_at > now));
                    ev
                } else {
                    let ev = self.core.external_busy(*device, None, now);
                    assert!(ev.is_empty());
                    ev
                }
            }
            Op::Clear { device } => {
                self.model.external.remove(device);
                self.core.external_clear(*device)
            }
            Op::Restart { down } => {
                self.restart(*down);
                return self.check(&[], &[]);
            }
        };
        self.emit(&ev);
        self.check(&ev, &retry_expected);
    }

    fn restart(&mut self, down: Nanos) {
        self.model.now += down;
        let now = self.model.now;
        let (pauses, max) = persist::load(&self.db, now).unwrap();
        let mut core = Core::new(timing(), max);
        let ev = core.restore(pauses, now);
        persist::apply(&mut self.db, &ev, now).unwrap();
        self.obs.expiries += ev.len() as u64;
        for e in &ev {
            assert!(matches!(e, Event::Expired { lease, .. } if lease.expires_at.is_some_and(|x| x <= now)));
        }
        // Connections die with the daemon; pauses survive unless expired; samplers come back.
        self.model.leases.retain(|l| l.pause && l.expires.is_some_and(|e| e > now));
        self.model.external.clear();
        self.core = core;
        self.obs.holder = DEVICES.iter().map(|d| (*d, self.core.holder(*d).map(|l| l.id))).collect();
        for d in DEVICES {
            let ev = self.core.add_device(d, now);
            self.model.learn(&ev);
            self.emit(&ev);
        }
    }

    fn check(&self, ev: &[Event], retry_expected: &[u32]) {
        for d in DEVICES {
            let core_holder = self.core.holder(d).map(|l| l.id);
            assert_eq!(core_holder, self.model.holder(d).map(|l| l.id), "holder of device {d}");
            assert_eq!(self.obs.holder.get(&d).copied().flatten(), core_holder, "events disagree on device {d}");
            let waiting: Vec<LeaseId> = self.core.device(d).unwrap().waiting.iter().map(|l| l.id).collect();
            assert_eq!(waiting, self.model.waiting(d), "queue of device {d}");
            let ext = self.core.device(d).unwrap().external.clone();
            assert_eq!(ext.is_some(), self.model.external.contains_key(&d), "external mark of device {d}");
            if let (Some(x), Some((attempts, at))) = (ext, self.model.external.get(&d)) {
                assert_eq!((x.attempts, x.retry_at), (*attempts, *at), "retry schedule of device {d}");
            }
            // Every device has exactly one sampler lease.
            let samplers = self.core.leases().filter(|l| l.device == d && l.holder == Holder::Sampler).count();
            assert_eq!(samplers, 1);
        }
        let retried: Vec<u32> =
            ev.iter().filter_map(|e| if let Event::Retry { device, .. } = e { Some(*device) } else { None }).collect();
        let mut a = retried.clone();
        a.sort();
        let mut b = retry_expected.to_vec();
        b.sort();
        assert_eq!(a, b, "retries");
        // Audit rows match the events.
        let count = |event: &str| -> u64 {
            self.db.query_row("SELECT COUNT(*) FROM audit WHERE event = ?1", [event], |r| r.get::<_, i64>(0)).unwrap()
                as u64
        };
        assert_eq!(count("grant"), self.obs.grants);
        assert_eq!(count("revoke"), self.obs.revokes);
        assert_eq!(count("expire"), self.obs.expiries);
        assert_eq!(count("release") + count("resume"), self.obs.releases);
        // Open pause rows are exactly the live pauses.
        let mut open: Vec<i64> = self
            .db
            .prepare("SELECT id FROM pauses WHERE ended_ns IS NULL")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        open.sort();
        let mut live: Vec<i64> = self.model.leases.iter().filter(|l| l.pause).map(|l| l.id as i64).collect();
        live.sort();
        assert_eq!(open, live, "pauses table");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbiter_matches_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        for op in &ops {
            h.step(op);
        }
    }
}

// ---- scenarios, readable on their own

fn pc(conn: u64) -> Holder {
    Holder::PcSampling { session: 7, proc: conn, pid: 4242, agent_device: 0, period_log2: 10 }
}

#[test]
fn preemption_queue_and_comeback() {
    let mut c = Core::new(timing(), 0);
    let ev = c.add_device(0, T0);
    let sampler = match &ev[0] {
        Event::Granted { lease } => lease.id,
        e => panic!("{e:?}"),
    };
    // A session's PC sampling preempts the sampler, which waits.
    let (pc1, ev) = c.request(0, pc(1), "session 7".into(), None, Some(1), T0).unwrap();
    assert!(
        matches!(&ev[..], [Event::Revoked { lease, by, .. }, Event::Granted { lease: g }] if lease.id == sampler && *by == pc1 && g.id == pc1)
    );
    // A second session of equal priority queues behind the first.
    let (pc2, ev) = c.request(0, pc(2), "session 8".into(), None, Some(2), T0 + 1).unwrap();
    assert!(matches!(&ev[..], [Event::Queued { lease }] if lease.id == pc2));
    // An operator's pause outranks both.
    let (leases, ev) = c.pause(&[0], 0, "ncu", 300 * S, T0 + 2).unwrap();
    let pause = leases[0].id;
    assert!(matches!(&ev[..], [Event::Revoked { lease, .. }, Event::Granted { .. }] if lease.id == pc1));
    assert_eq!(c.device(0).unwrap().waiting.iter().map(|l| l.id).collect::<Vec<_>>(), vec![pc1, pc2, sampler]);
    // Resume: the oldest session gets it back; when both sessions end, the sampler returns.
    c.resume(&[0], 0, T0 + 3).unwrap();
    assert_eq!(c.holder(0).unwrap().id, pc1);
    assert_ne!(pause, pc1);
    c.connection_closed(1, T0 + 4);
    assert_eq!(c.holder(0).unwrap().id, pc2);
    c.release(pc2, "session 8", "session stopped", T0 + 5).unwrap();
    assert_eq!(c.holder(0).unwrap().id, sampler);
}

#[test]
fn pause_expires_by_itself() {
    let mut c = Core::new(timing(), 0);
    c.add_device(0, T0);
    c.pause(&[0], 0, "ncu", 5 * S, T0).unwrap();
    assert_eq!(c.next_deadline(), Some(T0 + 5 * S));
    assert!(c.tick(T0 + 5 * S - 1).is_empty());
    let ev = c.tick(T0 + 5 * S);
    assert!(
        matches!(&ev[..], [Event::Expired { was_holder: true, .. }, Event::Granted { lease }] if lease.holder == Holder::Sampler)
    );
}

#[test]
fn pause_survives_restart_and_expires_while_down() {
    let mut db = db();
    let mut c = Core::new(timing(), 0);
    let mut ev = c.add_device(0, T0);
    ev.extend(c.add_device(1, T0));
    let (_, e) = c.pause(&[0], 1000, "ncu on GPU 0", 60 * S, T0).unwrap();
    ev.extend(e);
    let (_, e) = c.pause(&[1], 1000, "short", 5 * S, T0).unwrap();
    ev.extend(e);
    persist::apply(&mut db, &ev, T0).unwrap();

    // Restart 10 s later: GPU 0 stays paused, GPU 1's pause expired meanwhile.
    let now = T0 + 10 * S;
    let (pauses, max) = persist::load(&db, now).unwrap();
    assert_eq!(pauses.len(), 2);
    let mut c2 = Core::new(timing(), max);
    let ev = c2.restore(pauses, now);
    assert!(matches!(&ev[..], [Event::Expired { lease, .. }] if lease.device == 1));
    persist::apply(&mut db, &ev, now).unwrap();
    let mut ev = c2.add_device(0, now);
    ev.extend(c2.add_device(1, now));
    assert!(matches!(&ev[..], [Event::Queued { .. }, Event::Granted { lease }] if lease.device == 1));
    let h = c2.holder(0).unwrap();
    assert_eq!(h.holder, Holder::Pause { uid: 1000 });
    assert_eq!(h.expires_at, Some(T0 + 60 * S));
    assert_eq!(h.reason, "ncu on GPU 0");
    // New lease ids never collide with old ones.
    assert!(c2.leases().filter(|l| l.holder == Holder::Sampler).all(|l| l.id > max));
    let expired: i64 = db.query_row("SELECT COUNT(*) FROM audit WHERE event = 'expire'", [], |r| r.get(0)).unwrap();
    assert_eq!(expired, 1);
}

#[test]
fn external_holder_backs_off_without_spinning() {
    let mut c = Core::new(timing(), 0);
    c.add_device(0, T0);
    let mut now = T0;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let ev = c.external_busy(0, None, now);
        let Event::ExternalBusy { retry_at, .. } = ev[0] else { panic!() };
        waits.push((retry_at - now) / S);
        // Nothing happens before the retry time, exactly one retry at it.
        assert!(c.tick(retry_at - 1).is_empty());
        let ev = c.tick(retry_at);
        assert!(matches!(&ev[..], [Event::Retry { device: 0, .. }]));
        assert!(c.tick(retry_at + 100 * S).is_empty(), "no retry until the holder reports again");
        now = retry_at;
    }
    assert_eq!(waits, vec![1, 2, 4, 8, 8, 8]);
    assert_eq!(c.external_clear(0).len(), 1);
    assert!(c.device(0).unwrap().external.is_none());
}
