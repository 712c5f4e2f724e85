//! Live PM samples for `StreamPmSamples` subscribers.
//!
//! Sampler connections publish every batch on `Daemon::pm_samples` (a broadcast ring).
//! Each subscriber has its own forwarding task that filters (devices, metrics), optionally
//! averages over `downsample_ms`, and `try_send`s into the subscriber's bounded gRPC queue.
//! A subscriber that falls behind (its queue full, or the ring overtaking it) is dropped:
//! its stream ends with RESOURCE_EXHAUSTED, and nobody else waits for it. Paused markers
//! from the arbiter are interleaved, so a pause is an explicit event, not a silent gap.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use gpuprof_proto::agent::PmSampleBatch;
use gpuprof_proto::api as pb;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::access::{Caller, SessionOwners};
use crate::arbiter::Arbiter;
use crate::config::SamplerConfig;
use crate::error::ApiError;
use crate::nvml::Source;
use crate::pcsamp::PcHub;
use crate::sessions::Sessions;
use crate::{NvmlState, PmPublished};

#[cfg(test)]
mod tests;

/// Longest downsampling window accepted.
const MAX_DOWNSAMPLE_MS: u32 = 3_600_000;

/// Counters and the latest values, for status and the Prometheus endpoint.
#[derive(Default)]
pub struct PmHub {
    /// Subscribers streaming now.
    pub subscribers: AtomicU64,
    /// Subscribers dropped for being too slow, since start.
    pub dropped_subscribers: AtomicU64,
    /// Messages queued to subscribers, since start.
    pub messages_sent: AtomicU64,
    latest: Mutex<BTreeMap<u32, Latest>>,
}

/// The last sample of one device.
#[derive(Debug, Clone, Default)]
pub struct Latest {
    pub metrics: Vec<String>,
    pub values: Vec<f64>,
    /// The source of each metric.
    pub sources: Vec<Source>,
    pub end_ns: u64,
    pub samples: u64,
}

impl PmHub {
    /// Remembers the last sample of a batch: its metrics' values replace those of the same
    /// name, other sources' metrics stay. `samples` and `end_ns` count the CUPTI sampler's.
    pub fn record_latest(&self, source: Source, b: &PmSampleBatch) {
        let Some(s) = b.samples.last() else {
            return;
        };
        let mut m = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        let l = m.entry(b.device_id).or_default();
        for (name, v) in b.metrics.iter().zip(&s.values) {
            match l.metrics.iter().position(|x| x == name) {
                Some(i) => l.values[i] = *v,
                None => {
                    l.metrics.push(name.clone());
                    l.values.push(*v);
                    l.sources.push(source);
                }
            }
        }
        if source == Source::CuptiPm {
            l.end_ns = s.end_ns;
            l.samples += b.samples.len() as u64;
        }
    }

    pub fn latest(&self) -> BTreeMap<u32, Latest> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Keeps `hub`'s latest values current from the published samples `rx` (only run when
/// something reads them, e.g. Prometheus).
pub async fn track_latest(mut rx: broadcast::Receiver<Arc<PmPublished>>, hub: Arc<PmHub>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = rx.recv() => match r {
                Ok(b) => hub.record_latest(b.source, &b.batch),
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

type Item = Result<pb::StreamPmSamplesResponse, Status>;

/// Running averages of one device over one downsampling window.
struct Window {
    start_ns: u64,
    end_ns: u64,
    sums: Vec<f64>,
    n: u64,
}

/// One subscriber's filter and state.
struct Subscriber {
    devices: Vec<u32>,
    /// Empty: all.
    sources: Vec<Source>,
    metrics: Vec<String>,
    downsample_ns: u64,
    /// Per metric list seen (by pointer-equal contents): indices of the wanted metrics.
    index_cache: HashMap<Vec<String>, Vec<usize>>,
    windows: HashMap<(u32, Source), Window>,
    tx: mpsc::Sender<Item>,
    queue: usize,
}

/// Why a subscriber stopped.
enum End {
    /// The client went away.
    Gone,
    /// Too slow: dropped.
    Slow(String),
}

impl Subscriber {
    fn wants(&self, device: u32) -> bool {
        self.devices.is_empty() || self.devices.contains(&device)
    }

    fn send(&self, hub: &PmHub, m: pb::StreamPmSamplesResponse) -> Result<(), End> {
        // One slot stays free for the error that tells a dropped subscriber why.
        if self.tx.capacity() <= 1 {
            return Err(End::Slow(format!(
                "subscriber fell {} messages behind; dropped (read faster or use downsample_ms)",
                self.queue - 1
            )));
        }
        match self.tx.try_send(Ok(m)) {
            Ok(()) => {
                hub.messages_sent.fetch_add(1, Relaxed);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(End::Slow("subscriber queue full; dropped".into())),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(End::Gone),
        }
    }

    fn indices(&mut self, metrics: &[String]) -> Vec<usize> {
        if let Some(v) = self.index_cache.get(metrics) {
            return v.clone();
        }
        let v: Vec<usize> = if self.metrics.is_empty() {
            (0..metrics.len()).collect()
        } else {
            self.metrics.iter().filter_map(|w| metrics.iter().position(|m| m == w)).collect()
        };
        self.index_cache.insert(metrics.to_vec(), v.clone());
        v
    }

    #[allow(clippy::too_many_arguments)]
    fn point(
        source: Source,
        device: u32,
        start_ns: u64,
        end_ns: u64,
        metrics: &[String],
        idx: &[usize],
        vals: &[f64],
    ) -> pb::StreamPmSamplesResponse {
        pb::StreamPmSamplesResponse {
            event: Some(pb::stream_pm_samples_response::Event::Sample(pb::PmSamplePoint {
                device,
                start_ns,
                end_ns,
                values: idx
                    .iter()
                    .map(|&i| pb::PmValue { metric: metrics[i].clone(), value: vals.get(i).copied().unwrap_or(0.0) })
                    .collect(),
                source: source.as_str().to_string(),
            })),
        }
    }

    fn on_batch(&mut self, hub: &PmHub, source: Source, b: &PmSampleBatch) -> Result<(), End> {
        if !self.wants(b.device_id) || !(self.sources.is_empty() || self.sources.contains(&source)) {
            return Ok(());
        }
        let idx = self.indices(&b.metrics);
        if idx.is_empty() {
            return Ok(());
        }
        for s in &b.samples {
            if self.downsample_ns == 0 {
                self.send(hub, Self::point(source, b.device_id, s.start_ns, s.end_ns, &b.metrics, &idx, &s.values))?;
                continue;
            }
            let w = self.windows.entry((b.device_id, source)).or_insert_with(|| Window {
                start_ns: s.start_ns,
                end_ns: s.end_ns,
                sums: vec![0.0; b.metrics.len()],
                n: 0,
            });
            if w.sums.len() != b.metrics.len() {
                *w = Window { start_ns: s.start_ns, end_ns: s.end_ns, sums: vec![0.0; b.metrics.len()], n: 0 };
            }
            for (acc, v) in w.sums.iter_mut().zip(&s.values) {
                *acc += v;
            }
            w.n += 1;
            w.end_ns = s.end_ns;
            if w.end_ns.saturating_sub(w.start_ns) >= self.downsample_ns {
                let avg: Vec<f64> = w.sums.iter().map(|x| x / w.n as f64).collect();
                let m = Self::point(source, b.device_id, w.start_ns, w.end_ns, &b.metrics, &idx, &avg);
                self.windows.remove(&(b.device_id, source));
                self.send(hub, m)?;
            }
        }
        Ok(())
    }

    fn on_marker(&mut self, hub: &PmHub, m: pb::PmPaused) -> Result<(), End> {
        if !self.wants(m.device) {
            return Ok(());
        }
        // A partial window must not average across a pause.
        self.windows.remove(&(m.device, Source::CuptiPm));
        self.send(hub, pb::StreamPmSamplesResponse { event: Some(pb::stream_pm_samples_response::Event::Paused(m)) })
    }
}

/// What a PM stream subscription uses: the `[sampler]` settings (queue, on-demand sampler
/// leases), the published samples it subscribes to, the hub it counts in, the arbiter (its
/// devices, paused markers and sampler leases), NVML's devices, why there is no GPU (if so), and
/// the shutdown that ends the stream.
#[derive(Clone)]
pub struct Streams<'a> {
    pub sampler: &'a SamplerConfig,
    pub samples: &'a broadcast::Sender<Arc<PmPublished>>,
    pub hub: &'a Arc<PmHub>,
    pub arbiter: &'a Arc<Arbiter>,
    pub nvml: &'a NvmlState,
    /// Why GPU commands cannot work here (`Daemon::no_gpu_reason`), if they cannot.
    pub no_gpu: Option<String>,
    pub shutdown: &'a CancellationToken,
}

/// Starts a subscription; the returned stream yields samples and paused markers.
pub fn subscribe(d: Streams<'_>, req: pb::StreamPmSamplesRequest) -> Result<ReceiverStream<Item>, Status> {
    if req.downsample_ms > MAX_DOWNSAMPLE_MS {
        return Err(ApiError::invalid(
            "downsample_ms",
            format!("{} is more than the maximum {MAX_DOWNSAMPLE_MS}", req.downsample_ms),
        )
        .into());
    }
    if let Some(why) = &d.no_gpu {
        return Err(ApiError::FailedPrecondition(format!("no GPU to stream: {why}")).into());
    }
    let mut managed = d.arbiter.devices();
    managed.extend(d.nvml.inventory.devices.iter().map(|x| x.index));
    managed.sort_unstable();
    managed.dedup();
    if let Some(x) = req.devices.iter().find(|x| !managed.contains(x)) {
        return Err(ApiError::NotFound(format!(
            "devices: GPU {x} is not managed by this gpuprofd (managed: {})",
            managed.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        ))
        .into());
    }
    let sources = req
        .sources
        .iter()
        .map(|s| {
            Source::parse(s).ok_or_else(|| {
                Status::from(ApiError::invalid("sources", format!("{s:?} is not one of nvml, gpm, cupti_pm")))
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    let leases = cupti_leases(&d, &req.devices, req.cupti_rate_hz)?;
    let queue = d.sampler.stream_queue;
    let (tx, rx) = mpsc::channel(queue);
    // Subscribe before answering, so nothing published after the call returns is missed.
    let mut samples = d.samples.subscribe();
    let mut markers = d.arbiter.markers();
    let initial = d.arbiter.current_markers();
    let mut sub = Subscriber {
        devices: req.devices,
        sources,
        metrics: req.metrics,
        downsample_ns: u64::from(req.downsample_ms) * 1_000_000,
        index_cache: HashMap::new(),
        windows: HashMap::new(),
        tx,
        queue,
    };
    let (hub, shutdown) = (d.hub.clone(), d.shutdown.clone());
    // The on-demand sampler leases live as long as this task, renewed on the way.
    let renew_every = (d.sampler.lease_ttl.0 / 3).max(std::time::Duration::from_millis(300));
    hub.subscribers.fetch_add(1, Relaxed);
    tokio::spawn(async move {
        let hub = &*hub;
        let closed = sub.tx.clone();
        let mut end = Ok(());
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
        for m in initial {
            if let Err(e) = sub.on_marker(hub, m) {
                end = Err(e);
            }
        }
        while end.is_ok() {
            tokio::select! {
                _ = closed.closed() => end = Err(End::Gone),
                _ = shutdown.cancelled() => {
                    let _ = sub.tx.try_send(Err(ApiError::Unavailable("gpuprofd is shutting down".into()).into()));
                    break;
                }
                r = samples.recv() => match r {
                    Ok(b) => end = sub.on_batch(hub, b.source, &b.batch),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        end = Err(End::Slow(format!("subscriber fell {n} sample batches behind; dropped")));
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = renew.tick(), if !leases.is_empty() => {
                    for l in &leases {
                        let _ = l.renew();
                    }
                }
                m = markers.recv() => match m {
                    Ok(m) => end = sub.on_marker(hub, m),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        if let Err(End::Slow(why)) = end {
            hub.dropped_subscribers.fetch_add(1, Relaxed);
            tracing::info!(reason = %why, "dropping a slow PM stream subscriber");
            let _ = sub.tx.try_send(Err(ApiError::ResourceExhausted(why).into()));
        }
        drop(leases);
        hub.subscribers.fetch_sub(1, Relaxed);
    });
    Ok(ReceiverStream::new(rx))
}

/// The on-demand CUPTI PM sampler leases a stream asked for with `cupti_rate_hz`.
fn cupti_leases(d: &Streams<'_>, devices: &[u32], rate_hz: u32) -> Result<Vec<crate::arbiter::SamplerUse>, Status> {
    if rate_hz == 0 {
        return Ok(Vec::new());
    }
    if rate_hz > 10_000 {
        return Err(ApiError::invalid(
            "cupti_rate_hz",
            format!("{rate_hz} Hz is above the maximum of 10000 Hz (100 us)"),
        )
        .into());
    }
    if !d.sampler.enabled {
        return Err(ApiError::FailedPrecondition(
            "CUPTI PM sampling is disabled in this gpuprofd's config ([sampler] enabled = false)".into(),
        )
        .into());
    }
    let managed = d.arbiter.devices();
    let wanted = if devices.is_empty() { managed.clone() } else { devices.to_vec() };
    if let Some(x) = wanted.iter().find(|x| !managed.contains(x)) {
        return Err(ApiError::NotFound(format!(
            "devices: GPU {x} has no CUPTI PM sampler here (managed: {managed:?})"
        ))
        .into());
    }
    let interval = 1_000_000_000 / u64::from(rate_hz);
    let ttl = d.sampler.lease_ttl.0;
    let reason = format!("PM stream at {rate_hz} Hz");
    wanted.iter().map(|&dev| d.arbiter.acquire_sampler(dev, interval, ttl, &reason).map_err(Status::from)).collect()
}

/// What a PC stream uses: who owns the session asked for, the hub whose ring it reads, and
/// the sessions (whether that one is open).
pub struct PcStreams<'a> {
    pub owners: SessionOwners<'a>,
    pub hub: &'a Arc<PcHub>,
    pub sessions: &'a Sessions,
}

/// `StreamPcSamples`: each PC sample batch of the session's processes, pushed as it arrives
/// (before it is committed) from the session's broadcast ring (`PcHub`), filtered by kernel.
/// A subscriber the ring overtakes (it read too slowly) is dropped with RESOURCE_EXHAUSTED;
/// the stream ends when the session ends. A session that has ended streams nothing.
pub async fn pc_stream(
    d: PcStreams<'_>,
    caller: &Caller,
    req: pb::StreamPcSamplesRequest,
) -> Result<impl tokio_stream::Stream<Item = Result<pb::StreamPcSamplesResponse, Status>> + Send + 'static, Status> {
    if !req.kernel.is_empty()
        && let Err(e) = gpuprof_proto::glob::check(&req.kernel)
    {
        return Err(ApiError::invalid("kernel", format!("{:?}: {e}", req.kernel)).into());
    }
    let session = req.session_id;
    crate::access::authorize_session(d.owners, caller, session).await?;
    // Subscribe first, then look: a session that ends in between closes the ring we hold.
    let rx = d.hub.subscribe(session);
    let open = d.sessions.is_open(session);
    if !open {
        d.hub.close_stream(session);
    }
    let kernel = req.kernel;
    let hub = PcSub { hub: d.hub.clone() };
    hub.hub.subscribers.fetch_add(1, Relaxed);
    let s = tokio_stream::StreamExt::map_while(
        tokio_stream::wrappers::BroadcastStream::new(rx),
        move |r| -> Option<Result<pb::StreamPcSamplesResponse, Status>> {
            let _keep = &hub;
            match r {
                Ok(p) => Some(Ok(filter_pc(&p.response, &kernel))),
                Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
                    let why = format!("subscriber fell {n} PC sample batches behind; dropped (read faster)");
                    tracing::info!(session, reason = %why, "dropping a slow PC stream subscriber");
                    hub.hub.note_dropped();
                    Some(Err(ApiError::ResourceExhausted(why).into()))
                }
            }
        },
    );
    // After an error (a dropped subscriber) the stream ends.
    let mut failed = false;
    Ok(tokio_stream::StreamExt::filter_map(s, move |r| {
        if failed {
            return None;
        }
        match r {
            Ok(m) if m.samples.is_empty() && m.dropped_samples == 0 => None,
            Ok(m) => Some(Ok(m)),
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    }))
}

/// Counts a PC stream subscriber for as long as its stream lives.
struct PcSub {
    hub: Arc<PcHub>,
}

impl Drop for PcSub {
    fn drop(&mut self) {
        self.hub.subscribers.fetch_sub(1, Relaxed);
    }
}

/// The rows of a pushed batch whose function matches `kernel` (a glob; empty: all).
fn filter_pc(m: &pb::StreamPcSamplesResponse, kernel: &str) -> pb::StreamPcSamplesResponse {
    if kernel.is_empty() {
        return m.clone();
    }
    let samples = m
        .samples
        .iter()
        .filter(|r| {
            gpuprof_proto::glob::matches(kernel, &r.function_name)
                || (!r.mangled_name.is_empty() && gpuprof_proto::glob::matches(kernel, &r.mangled_name))
        })
        .cloned()
        .collect();
    pb::StreamPcSamplesResponse { samples, ..m.clone() }
}
