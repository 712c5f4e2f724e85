//! GetJobSummary: a distributed job's ranks in a session compared (step time, GPU busy share,
//! time in NCCL kernels, time waiting in collectives, the straggler). The arithmetic is in
//! [`super::collectives`]; this reads the session's kernels, NVTX ranges and NCCL collectives for it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, params_from_iter};

use super::Reads;
use super::collectives::{self, Enqueued, Member, Nccl, Union};
use super::{Strings, where_for};
use crate::access::Caller;
use crate::error::{ApiError, ApiResult};

/// GetJobSummary.
pub async fn get_job_summary(
    d: Reads<'_>,
    caller: &Caller,
    req: pb::GetJobSummaryRequest,
) -> ApiResult<pb::JobSummary> {
    crate::job::check_job_id(&req.job_id).map_err(|e| ApiError::invalid("job_id", e))?;
    d.authorize(caller, req.session_id).await?;
    d.rollup.catch_up().await?;
    let path = d.db_path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let c = crate::store::open_reader(&path)?;
        job_summary(&c, req.session_id, &req.job_id)
    })
    .await?
}

/// A process of the session: gpuprofd's id, pid, job id, rank.
struct Proc {
    id: u64,
    pid: u32,
    job: String,
    rank: Option<u32>,
}

/// A job id as messages show it.
fn job_text(job: &str) -> String {
    if job.is_empty() { "(ranks without a job id)".into() } else { format!("{job:?}") }
}

/// The processes of the job asked for (or of the session's one job).
fn job_members(c: &Connection, session: u64, job: &str) -> ApiResult<(String, Vec<Proc>)> {
    let mut st = c.prepare(
        "SELECT p.id, p.pid, p.job_id, p.job_rank FROM processes p
         WHERE p.id IN (SELECT proc FROM session_processes WHERE session = ?1
                        UNION SELECT proc FROM session_rows WHERE session = ?1)
         ORDER BY p.id",
    )?;
    let all: Vec<Proc> = st
        .query_map([session as i64], |r| {
            Ok(Proc {
                id: r.get::<_, i64>(0)? as u64,
                pid: r.get::<_, i64>(1)? as u32,
                job: r.get(2)?,
                rank: r.get::<_, Option<i64>>(3)?.map(|v| v as u32),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let jobs: BTreeSet<String> = all.iter().filter(|p| p.rank.is_some()).map(|p| p.job.clone()).collect();
    let listed = || jobs.iter().map(|j| job_text(j)).collect::<Vec<_>>().join(", ");
    let job = if job.is_empty() {
        match jobs.len() {
            0 => {
                return Err(ApiError::FailedPrecondition(format!(
                    "session {session} holds no rank of a distributed job: none of its processes started with \
                     a rank in its environment (torchrun, SLURM or MPI)"
                )));
            }
            1 => jobs.first().cloned().unwrap_or_default(),
            _ => {
                return Err(ApiError::invalid(
                    "job_id",
                    format!("session {session} holds ranks of {} jobs ({}); name one", jobs.len(), listed()),
                ));
            }
        }
    } else {
        job.to_string()
    };
    let members: Vec<Proc> =
        all.into_iter().filter(|p| p.job == job && (p.rank.is_some() || !job.is_empty())).collect();
    if members.is_empty() {
        let theirs =
            if jobs.is_empty() { "it holds no job's ranks".to_string() } else { format!("its jobs: {}", listed()) };
        return Err(ApiError::NotFound(format!(
            "session {session} has no process of job {}; {theirs}",
            job_text(&job)
        )));
    }
    Ok((job, members))
}

/// What one process's kernels say.
#[derive(Default)]
struct Kernels {
    devices: BTreeSet<u32>,
    first: i64,
    last: i64,
    count: u64,
    busy: Union,
    nccl: Vec<Nccl>,
    nccl_ns: u64,
}

/// The kernels of `procs` in the session, one pass in order of (process, start).
fn read_kernels(
    c: &Connection,
    session: u64,
    procs: &[u64],
    names: &mut Strings,
) -> rusqlite::Result<HashMap<u64, Kernels>> {
    let f = pb::RecordFilter { process_ids: procs.to_vec(), ..Default::default() };
    let w = where_for(c, "kernel", session, &f)?;
    let mut stmt = c.prepare(&format!(
        "SELECT t.proc, t.dev, t.name, t.start + p.base_ns AS s, max(t.dur, 0) FROM kernel t
         JOIN processes p ON p.id = t.proc WHERE {} AND t.start + p.base_ns > 0 ORDER BY t.proc, s",
        w.sql
    ))?;
    let mut rows = stmt.query(params_from_iter(w.params.iter()))?;
    let mut out: HashMap<u64, Kernels> = HashMap::new();
    let mut is_nccl: HashMap<i64, bool> = HashMap::new();
    while let Some(r) = rows.next()? {
        let (proc, dev, name, s, dur): (i64, i64, i64, i64, i64) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
        let e = s + dur;
        let k = out.entry(proc as u64).or_default();
        if k.count == 0 {
            k.first = s;
        }
        k.count += 1;
        k.last = k.last.max(e);
        k.devices.insert(dev as u32);
        k.busy.push(s, e);
        let nccl = match is_nccl.get(&name) {
            Some(b) => *b,
            None => {
                let (shown, reported) = names.both(c, name)?;
                let b = collectives::is_nccl(&shown, &reported);
                is_nccl.insert(name, b);
                b
            }
        };
        if nccl {
            k.nccl.push(Nccl { name, start: s, end: e });
            k.nccl_ns += dur as u64;
        }
    }
    Ok(out)
}

/// NVTX ranges of one group: how many, their total duration, their name ids.
type Ranges = (u64, u64, Vec<i64>);

/// Step times from repeating NVTX ranges, per process: (median period, periods, range group).
fn marker_steps(
    c: &Connection,
    session: u64,
    procs: &[u64],
    names: &mut Strings,
) -> rusqlite::Result<HashMap<u64, (u64, u64, String)>> {
    let f = pb::RecordFilter { process_ids: procs.to_vec(), ..Default::default() };
    let w = where_for(c, "marker", session, &f)?;
    let ranges = "t.is_mark = 0 AND t.dur > 0";
    let mut stmt = c.prepare(&format!(
        "SELECT t.proc, t.name, count(*), sum(t.dur) FROM marker t WHERE {} AND {ranges} GROUP BY t.proc, t.name",
        w.sql
    ))?;
    let mut rows = stmt.query(params_from_iter(w.params.iter()))?;
    // Process → range group → its ranges.
    let mut groups: BTreeMap<u64, BTreeMap<String, Ranges>> = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let (proc, id): (i64, i64) = (r.get(0)?, r.get(1)?);
        let g = groups.entry(proc as u64).or_default().entry(collectives::step_group(&names.get(c, id)?)).or_default();
        g.0 += r.get::<_, i64>(2)?.max(0) as u64;
        g.1 += r.get::<_, i64>(3)?.max(0) as u64;
        g.2.push(id);
    }
    // Each process's step group, and the (process, name) pairs that belong to it.
    let mut chosen: HashMap<u64, String> = HashMap::new();
    let mut pairs: BTreeSet<(u64, i64)> = BTreeSet::new();
    for (proc, g) in groups {
        let list: Vec<(String, u64, u64)> = g.iter().map(|(k, v)| (k.clone(), v.0, v.1)).collect();
        let Some(i) = collectives::pick_step_group(&list) else { continue };
        let Some((group, (_, _, ids))) = g.into_iter().nth(i) else { continue };
        pairs.extend(ids.into_iter().map(|id| (proc, id)));
        chosen.insert(proc, group);
    }
    let mut out = HashMap::new();
    if pairs.is_empty() {
        return Ok(out);
    }
    let ids: BTreeSet<i64> = pairs.iter().map(|p| p.1).collect();
    let marks = vec!["?"; ids.len()].join(",");
    let mut stmt = c.prepare(&format!(
        "SELECT t.proc, t.name, t.start + p.base_ns AS s FROM marker t JOIN processes p ON p.id = t.proc
         WHERE {} AND {ranges} AND t.name IN ({marks}) ORDER BY t.proc, s",
        w.sql
    ))?;
    let params = w.params.iter().cloned().chain(ids.into_iter().map(rusqlite::types::Value::Integer));
    let mut rows = stmt.query(params_from_iter(params))?;
    let mut starts: HashMap<u64, Vec<i64>> = HashMap::new();
    while let Some(r) = rows.next()? {
        let (proc, id, s): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        if pairs.contains(&(proc as u64, id)) {
            starts.entry(proc as u64).or_default().push(s);
        }
    }
    for (proc, group) in chosen {
        if let Some((p, n)) = starts.get(&proc).and_then(|s| collectives::median_period(s)) {
            out.insert(proc, (p, n, group));
        }
    }
    Ok(out)
}

/// A process's step time from the period of its most frequent NCCL kernel.
fn nccl_steps(k: &Kernels, c: &Connection, names: &mut Strings) -> rusqlite::Result<Option<(u64, u64, String)>> {
    let mut counts: HashMap<i64, u64> = HashMap::new();
    for n in &k.nccl {
        *counts.entry(n.name).or_default() += 1;
    }
    let Some((name, _)) = counts.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0))) else { return Ok(None) };
    let starts: Vec<i64> = k.nccl.iter().filter(|n| n.name == name).map(|n| n.start).collect();
    let shown = names.get(c, name)?;
    let shown = collectives::short_name(&shown);
    Ok(collectives::launch_period(&starts).map(|(p, n, k)| match k {
        1 => (p, n, shown.to_string()),
        k => (p, n, format!("{shown} ({k} a step)")),
    }))
}

/// One NCCL collective record of a process: communicator, name (strings.id), sequence number,
/// bytes, its enqueue's start and its run in the kernel (ns since the Unix epoch) when NCCL
/// timed it.
struct Coll {
    comm: i64,
    name: i64,
    seq: i64,
    bytes: u64,
    start: i64,
    gpu: Option<(i64, i64)>,
}

/// A process's step from its NCCL collectives in order of enqueue (across its communicators):
/// the sequence of them that repeats ([`collectives::collective_steps`]).
fn collective_steps(
    list: &[Coll],
    c: &Connection,
    names: &mut Strings,
) -> rusqlite::Result<Option<(u64, u64, String)>> {
    let mut seq: Vec<(i64, i64, i64, Enqueued)> = list
        .iter()
        .map(|x| (x.start, x.comm, x.seq, Enqueued { name: x.name, bytes: x.bytes, start: x.start }))
        .collect();
    seq.sort_unstable_by_key(|x| (x.0, x.1, x.2));
    let seq: Vec<Enqueued> = seq.into_iter().map(|x| x.3).collect();
    let Some(s) = collectives::collective_steps(&seq) else { return Ok(None) };
    let mut kinds = Vec::with_capacity(s.kinds.len());
    for (name, k) in s.kinds {
        kinds.push((names.get(c, name)?, k));
    }
    Ok(Some((s.period, s.steps, collectives::collective_step_text(&kinds, s.per_step))))
}

/// The NCCL collective records of `procs` in the session.
fn read_collectives(c: &Connection, session: u64, procs: &[u64]) -> rusqlite::Result<HashMap<u64, Vec<Coll>>> {
    let f = pb::RecordFilter { process_ids: procs.to_vec(), ..Default::default() };
    let w = where_for(c, "collective", session, &f)?;
    let mut stmt = c.prepare(&format!(
        "SELECT t.proc, t.comm, t.name, t.seq, t.bytes, t.start + p.base_ns, t.gpu_off, t.gpu_dur FROM collective t
         JOIN processes p ON p.id = t.proc WHERE {}",
        w.sql
    ))?;
    let mut rows = stmt.query(params_from_iter(w.params.iter()))?;
    let mut out: HashMap<u64, Vec<Coll>> = HashMap::new();
    while let Some(r) = rows.next()? {
        let (start, gpu_off, gpu_dur): (i64, i64, i64) = (r.get(5)?, r.get(6)?, r.get(7)?);
        let gpu_start = start + gpu_off;
        out.entry(r.get::<_, i64>(0)? as u64).or_default().push(Coll {
            comm: r.get(1)?,
            name: r.get(2)?,
            seq: r.get(3)?,
            bytes: r.get::<_, i64>(4)?.max(0) as u64,
            start,
            gpu: (gpu_dur >= 0).then_some((gpu_start, gpu_start + gpu_dur)),
        });
    }
    Ok(out)
}

/// A process's collectives counted per name, most frequent first.
fn count_collectives(list: &[Coll], c: &Connection, names: &mut Strings) -> rusqlite::Result<Vec<pb::CollectiveCount>> {
    let mut by: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
    for x in list {
        let e = by.entry(x.name).or_default();
        e.0 += 1;
        e.1 += x.bytes;
    }
    let mut out = Vec::with_capacity(by.len());
    for (name, (count, bytes)) in by {
        out.push(pb::CollectiveCount { name: names.get(c, name)?, count, bytes });
    }
    out.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
    Ok(out)
}

/// GetJobSummary's body, on a read connection.
pub fn job_summary(c: &Connection, session: u64, job: &str) -> ApiResult<pb::JobSummary> {
    let (job, mut procs) = job_members(c, session, job)?;
    procs.sort_by_key(|p| (p.rank.is_none(), p.rank, p.id));
    let mut names = Strings::default();
    let ids: Vec<u64> = procs.iter().map(|p| p.id).collect();
    let mut kernels = read_kernels(c, session, &ids, &mut names)?;
    let mut marker_steps = marker_steps(c, session, &ids, &mut names)?;
    let mut colls = read_collectives(c, session, &ids)?;
    let mut rows = Vec::new();
    for p in &procs {
        let k = kernels.remove(&p.id).unwrap_or_default();
        let mut r = pb::RankSummary {
            process_id: p.id,
            pid: p.pid,
            rank: p.rank,
            device_ids: k.devices.iter().copied().collect(),
            kernel_count: k.count,
            busy_ns: k.busy.total(),
            nccl_count: k.nccl.len() as u64,
            nccl_ns: k.nccl_ns,
            ..Default::default()
        };
        if k.count > 0 {
            (r.start_ns, r.end_ns) = (k.first.max(0) as u64, k.last.max(0) as u64);
            let span = r.end_ns.saturating_sub(r.start_ns);
            r.busy_share = if span > 0 { r.busy_ns as f64 / span as f64 } else { 0.0 };
        }
        // NVTX steps first, then the sequence of NCCL's collectives, then its kernels' periods.
        let mut steps = marker_steps.remove(&p.id).map(|s| ("marker", s));
        if let (None, Some(list)) = (&steps, colls.get(&p.id)) {
            steps = collective_steps(list, c, &mut names)?.map(|s| ("collectives", s));
        }
        if steps.is_none() {
            steps = nccl_steps(&k, c, &mut names)?.map(|s| ("nccl", s));
        }
        if let Some((source, (period, n, name))) = steps {
            (r.step_ns, r.steps, r.step_source, r.step_name) = (period, n, source.into(), name);
        }
        rows.push((r, k.nccl));
    }
    let mut out = pb::JobSummary { session_id: session, job_id: job, ..Default::default() };
    // NCCL's own records, where every rank has them timed in the kernel, match collectives
    // exactly (communicator, collective, sequence number); else the kernels' order does.
    let mut labels: HashMap<i64, String> = HashMap::new();
    for (r, _) in rows.iter_mut() {
        if let Some(list) = colls.get(&r.process_id) {
            r.collectives = count_collectives(list, c, &mut names)?;
        }
    }
    let ranked: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].0.rank.is_some()).collect();
    let timed = |p: u64| colls.get(&p).is_some_and(|l| l.iter().any(|x| x.gpu.is_some()));
    if !ranked.is_empty() && ranked.iter().all(|&i| timed(rows[i].0.process_id)) {
        out.matched_by = "sequence".into();
        let key = |x: &Coll| (x.comm, x.name, x.seq);
        // A collective is compared where every rank timed it (of a rank in several processes,
        // the process that timed the most).
        let mut best: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
        for &i in &ranked {
            let n = colls.get(&rows[i].0.process_id).map_or(0, |l| l.iter().filter(|x| x.gpu.is_some()).count());
            let e = best.entry(rows[i].0.rank.unwrap_or_default()).or_insert((i, n));
            if n > e.1 {
                *e = (i, n);
            }
        }
        let mut common: Option<BTreeSet<(i64, i64, i64)>> = None;
        let mut all: BTreeSet<(i64, i64, i64)> = BTreeSet::new();
        for (i, _) in best.values() {
            let mine: BTreeSet<_> = colls[&rows[*i].0.process_id].iter().filter(|x| x.gpu.is_some()).map(key).collect();
            all.extend(mine.iter().copied());
            common = Some(match common {
                None => mine,
                Some(c) => c.intersection(&mine).copied().collect(),
            });
        }
        let common = common.unwrap_or_default();
        if all.len() > common.len() {
            out.notes.push(format!(
                "{} collectives were not timed in the kernel on every rank (a communicator of some ranks only, or \
                 no kernel times): left out of the comparison",
                all.len() - common.len()
            ));
        }
        let mut keys: HashMap<(i64, i64), i64> = HashMap::new();
        for &i in &ranked {
            let mut list = colls.remove(&rows[i].0.process_id).unwrap_or_default();
            list.retain(|x| common.contains(&key(x)));
            list.sort_by_key(key);
            let mut nccl = Vec::with_capacity(list.len());
            for x in list {
                let Some((start, end)) = x.gpu else { continue };
                let n = keys.len() as i64;
                let k = *keys.entry((x.comm, x.name)).or_insert(-(n + 1));
                if let std::collections::hash_map::Entry::Vacant(e) = labels.entry(k) {
                    e.insert(format!("{} (communicator {:016x})", names.get(c, x.name)?, x.comm as u64));
                }
                nccl.push(Nccl { name: k, start, end });
            }
            rows[i].1 = nccl;
        }
    } else {
        out.matched_by = "kernel order".into();
    }
    compare_ranks(&mut out, &mut rows, &mut names, &labels, c)?;
    out.ranks = rows.into_iter().map(|(r, _)| r).collect();
    Ok(out)
}

/// Compares the ranks' collectives: wait times, the straggler, notes on what was left out.
fn compare_ranks(
    out: &mut pb::JobSummary,
    rows: &mut [(pb::RankSummary, Vec<Nccl>)],
    names: &mut Strings,
    labels: &HashMap<i64, String>,
    c: &Connection,
) -> rusqlite::Result<()> {
    // One process per rank: of several (a restarted rank), the one with the most NCCL kernels.
    let mut chosen: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, (r, nccl)) in rows.iter().enumerate() {
        let Some(rank) = r.rank else {
            out.notes.push(format!("process {} (pid {}) has no rank: listed, not compared", r.process_id, r.pid));
            continue;
        };
        match chosen.get(&rank) {
            Some(&j) if rows[j].1.len() >= nccl.len() => {}
            _ => {
                chosen.insert(rank, i);
            }
        }
    }
    for (rank, &i) in &chosen {
        let others: Vec<String> = rows
            .iter()
            .filter(|(r, _)| r.rank == Some(*rank) && r.process_id != rows[i].0.process_id)
            .map(|(r, _)| r.process_id.to_string())
            .collect();
        if !others.is_empty() {
            out.notes.push(format!(
                "rank {rank} ran in several processes: compared process {}, the one with the most NCCL kernels; not {}",
                rows[i].0.process_id,
                others.join(", ")
            ));
        }
    }
    let order: Vec<usize> = chosen.values().copied().collect();
    let mut shown: HashMap<i64, String> = HashMap::new();
    for &i in &order {
        for k in &rows[i].1 {
            if let std::collections::hash_map::Entry::Vacant(e) = shown.entry(k.name) {
                e.insert(match labels.get(&k.name) {
                    Some(l) => l.clone(),
                    None => names.get(c, k.name)?,
                });
            }
        }
    }
    let members: Vec<Member<'_>> =
        order.iter().map(|&i| Member { rank: rows[i].0.rank.unwrap_or_default(), kernels: &rows[i].1 }).collect();
    let cmp = collectives::compare(&members, |id| shown.get(&id).cloned().unwrap_or_default());
    for (m, &i) in order.iter().enumerate() {
        rows[i].0.wait_ns = cmp.wait_ns[m];
        rows[i].0.last_count = cmp.last[m];
    }
    out.collectives = cmp.collectives;
    out.straggler = cmp.straggler.map(|v| {
        let r = &rows[order[v.member]].0;
        pb::Straggler {
            rank: r.rank.unwrap_or_default(),
            process_id: r.process_id,
            last_count: v.last,
            collectives: cmp.collectives,
            others_wait_ns: v.others_wait_ns,
            median_wait_ns: v.median_wait_ns,
            evidence: v.evidence,
        }
    });
    out.no_straggler = cmp.no_straggler;
    out.notes.extend(cmp.notes);
    Ok(())
}
