use super::*;

fn mask() -> &'static AtomicI32 {
    Box::leak(Box::new(AtomicI32::new(-1)))
}

fn all_reduce(seq: u64, channels: u32) -> CollStart {
    CollStart {
        seq,
        func: "AllReduce".into(),
        datatype: "ncclFloat32".into(),
        algo: "Ring".into(),
        proto: "Simple".into(),
        count: 1 << 20,
        root: -1,
        rank: 1,
        channels,
    }
}

fn drained(s: &State) -> Vec<Collective> {
    let mut out = Vec::new();
    s.drain(|c| out.push(c));
    out
}

#[test]
fn no_plugin_before_the_agent_runs_and_nothing_reported_while_no_trace_runs() {
    let s = State::new();
    let comm = Comm { hash: 0xfeed, nranks: 2 };
    assert_eq!(s.init(comm, mask()), None, "NCCL disables the plugin when the agent is not up");
    s.set_ready();
    let m = mask();
    let ctx = s.init(comm, m).unwrap();
    assert_eq!(m.load(Ordering::Relaxed), 0, "idle: NCCL asked for nothing");
    assert_eq!(s.coll_start(ctx, all_reduce(0, 2), 7), 0);
    s.set_active(true);
    assert_eq!(m.load(Ordering::Relaxed), (abi::PROFILE_COLL | abi::PROFILE_KERNEL_CH) as i32);
    s.set_active(false);
    assert_eq!(m.load(Ordering::Relaxed), 0);
    s.set_kernel_times(false);
    s.set_active(true);
    assert_eq!(m.load(Ordering::Relaxed), abi::PROFILE_COLL as i32);
    // A finalized communicator's mask is left alone, and its events are not reported.
    s.finalize(ctx);
    s.set_active(false);
    assert_eq!(m.load(Ordering::Relaxed), abi::PROFILE_COLL as i32);
    s.set_active(true);
    assert_eq!(s.coll_start(ctx, all_reduce(0, 2), 7), 0);
    assert!(drained(&s).is_empty());
}

#[test]
fn a_collective_is_sent_once_its_enqueue_and_every_channel_ended() {
    let s = State::new();
    s.set_ready();
    let ctx = s.init(Comm { hash: 0xabcdef, nranks: 4 }, mask()).unwrap();
    s.set_active(true);
    let h = s.coll_start(ctx, all_reduce(41, 2), 1234);
    assert_ne!(h, 0);
    s.stop(h);
    assert!(drained(&s).is_empty(), "channels still to come");
    let c0 = s.channel_start(h, 5_000);
    let c1 = s.channel_start(h, 4_000);
    assert!(c0 != 0 && c1 != 0 && c0 != h, "channel handles are their own (one per collective)");
    s.channel_end_time(c0, 9_000);
    s.channel_end_time(c1, 8_000);
    s.stop(c0);
    assert!(drained(&s).is_empty(), "one channel still to end");
    s.stop(c1);
    let got = drained(&s);
    assert_eq!(got.len(), 1);
    let c = &got[0];
    assert_eq!((c.gpu_start_ns, c.gpu_end_ns), (4_000, 9_000));
    assert_eq!((c.seq, c.comm_hash, c.nranks, c.rank, c.thread_id), (41, 0xabcdef, 4, 1, 1234));
    assert_eq!((c.name.as_str(), c.datatype.as_str(), c.algo.as_str()), ("AllReduce", "ncclFloat32", "Ring"));
    assert_eq!(c.bytes(), 4 << 20);
    assert!(c.start_ns > 0 && c.end_ns >= c.start_ns);
    // The handles are spent: late events on them change nothing and send nothing.
    s.stop(h);
    s.stop(c0);
    assert_eq!(s.channel_start(h, 1), 0);
    assert!(drained(&s).is_empty());
}

#[test]
fn missing_channels_are_given_up_on_and_stopping_the_trace_sends_what_waits() {
    let s = State::new();
    s.set_ready();
    let ctx = s.init(Comm { hash: 1, nranks: 2 }, mask()).unwrap();
    s.set_active(true);
    let a = s.coll_start(ctx, all_reduce(1, 4), 1);
    s.stop(a);
    let ch = s.channel_start(a, 100);
    s.stop(ch);
    s.flush_older_than(STALE.as_nanos() as u64);
    assert!(drained(&s).is_empty(), "not stale yet");
    s.flush_older_than(0);
    let got = drained(&s);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].seq, got[0].gpu_start_ns, got[0].gpu_end_ns), (1, 100, 0));
    // A collective whose enqueue has not ended is not sent by a flush; the trace's stop sends
    // every collective whose enqueue ended.
    let b = s.coll_start(ctx, all_reduce(2, 1), 1);
    s.flush_older_than(0);
    assert!(drained(&s).is_empty());
    s.stop(b);
    s.set_active(false);
    assert_eq!(drained(&s).iter().map(|c| c.seq).collect::<Vec<_>>(), [2]);
    // Without kernel timing, the enqueue's end is the end.
    s.set_kernel_times(false);
    s.set_active(true);
    let c = s.coll_start(ctx, all_reduce(3, 8), 1);
    s.stop(c);
    assert_eq!(drained(&s).iter().map(|c| c.seq).collect::<Vec<_>>(), [3]);
}

#[test]
fn foreign_and_zero_handles_are_ignored() {
    let s = State::new();
    for h in [0, 3, usize::MAX, 0x1234_5678] {
        s.stop(h);
        s.channel_end_time(h, 1);
        assert_eq!(s.channel_start(h, 1), 0);
    }
    assert!(drained(&s).is_empty());
}

#[test]
fn data_type_sizes() {
    for (t, n) in [("ncclFloat32", 4), ("ncclBfloat16", 2), ("ncclInt8", 1), ("ncclFloat64", 8), ("ncclWhat", 0)] {
        assert_eq!(datatype_size(t), n, "{t}");
    }
}

/// NCCL's enqueuing threads and its proxy thread at once, the ring coming round many times:
/// every collective is sent exactly once (complete, or when its slot is taken again), nothing
/// blocks and nothing is dropped while the agent keeps draining.
#[test]
fn many_threads_and_a_ring_that_comes_round() {
    let s = std::sync::Arc::new(State::new());
    s.set_ready();
    let ctx = s.init(Comm { hash: 9, nranks: 8 }, mask()).unwrap();
    s.set_active(true);
    const THREADS: u64 = 4;
    const EACH: u64 = 3 * SLOTS as u64;
    let (hand_tx, hand_rx) = crossbeam_channel::unbounded::<usize>();
    let proxy = {
        let s = s.clone();
        std::thread::spawn(move || {
            // The proxy thread: two channels per collective, start and end.
            for h in hand_rx {
                let c = s.channel_start(h, 10);
                s.channel_end_time(c, 20);
                s.stop(c);
                let c = s.channel_start(h, 11);
                s.channel_end_time(c, 21);
                s.stop(c);
            }
        })
    };
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let agent = {
        let (s, got, done) = (s.clone(), got.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                s.drain(|c| got.lock().unwrap().push(c.seq));
                std::thread::yield_now();
            }
        })
    };
    let apps: Vec<_> = (0..THREADS)
        .map(|t| {
            let (s, hand_tx) = (s.clone(), hand_tx.clone());
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let h = s.coll_start(ctx, all_reduce(t * EACH + i, 2), t as u32);
                    assert_ne!(h, 0);
                    s.stop(h);
                    hand_tx.send(h).unwrap();
                }
            })
        })
        .collect();
    for a in apps {
        a.join().unwrap();
    }
    drop(hand_tx);
    proxy.join().unwrap();
    s.set_active(false);
    done.store(true, Ordering::SeqCst);
    agent.join().unwrap();
    s.drain(|c| got.lock().unwrap().push(c.seq));
    let mut seqs = got.lock().unwrap().clone();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..THREADS * EACH).collect::<Vec<_>>(), "each collective once");
    assert_eq!(s.dropped(), 0);
}
