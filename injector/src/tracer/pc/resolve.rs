//! What the rows of a batch name, resolved on the background thread and cached: function
//! and stall-reason names interned, and each PC's source line from its module's cubin,
//! captured at module load or, for modules loaded before sampling began, asked of gpuprofd
//! (which keeps what earlier processes sent and found nowhere) and otherwise looked for in the
//! ELF files the process has mapped ([`Resolver::find_late_cubins`]).

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuprof_cupti::Cupti;
use gpuprof_cupti::pcsampling::FunctionName;

use super::context::Agg;
use super::cubins;
use crate::log::log;
use crate::tracer::CubinAnswer;

/// How long a module asked of gpuprofd waits for its answer before the process looks in its
/// mapped files anyway (a gpuprofd without the cubin cache never answers).
const ANSWER_WAIT: Duration = Duration::from_secs(3);

/// Names, strings and lines of the rows, cached for the process's life.
pub(super) struct Resolver {
    cupti: Arc<Cupti>,
    names: HashMap<FunctionName, (Arc<str>, CString)>,
    strs: HashMap<String, Arc<str>>,
    lines: HashMap<(u64, FunctionName, u64), (Arc<str>, u32)>,
    no_line: Arc<str>,
    /// Module CRCs already asked for or looked for in the mapped files.
    late_tried: HashSet<u64>,
    /// Modules asked of gpuprofd, until its answer: CRC → function name, SM, when.
    asked: HashMap<u64, (String, u32, Instant)>,
    /// Modules to ask gpuprofd for with the next output.
    query: Vec<u64>,
    /// Cubins kept when the line cache was last swept for modules found late.
    kept_seen: usize,
}

impl Resolver {
    pub(super) fn new(cupti: Arc<Cupti>) -> Resolver {
        Resolver {
            cupti,
            names: HashMap::new(),
            strs: HashMap::new(),
            lines: HashMap::new(),
            no_line: Arc::from(""),
            late_tried: HashSet::new(),
            asked: HashMap::new(),
            query: Vec::new(),
            kept_seen: 0,
        }
    }

    /// Modules the samples of `devs` (device, its aggregate) name whose cubins were not
    /// captured at load (loaded before sampling began): asked of gpuprofd once
    /// ([`Self::take_query`], answered in [`Self::answer`]), and those it does not have (or
    /// that it leaves unanswered for [`ANSWER_WAIT`]) looked for once, on a thread of their
    /// own, in the ELF files the process has mapped ([`cubins::request_late`]) for the
    /// device's SM (`sm_of`); rows read before the cubin is in have no lines.
    pub(super) fn find_late_cubins<'a>(
        &mut self,
        devs: impl Iterator<Item = (u32, &'a Agg)>,
        sm_of: impl Fn(u32) -> Option<u32>,
    ) {
        let overdue: Vec<u64> =
            self.asked.iter().filter(|(_, (_, _, t))| t.elapsed() >= ANSWER_WAIT).map(|(c, _)| *c).collect();
        if !overdue.is_empty() {
            log!(
                Info,
                "PC sampling: no answer from gpuprofd about {} cubins; looking in the mapped files",
                overdue.len()
            );
            self.look(overdue);
        }
        for (dev, agg) in devs {
            let mut want: Vec<(u64, FunctionName)> = Vec::new();
            for (fptr, crc, _, _) in agg.keys() {
                if *crc != 0
                    && !want.iter().any(|w| w.0 == *crc)
                    && !self.late_tried.contains(crc)
                    && cubins::get(*crc).is_none()
                {
                    want.push((*crc, *fptr));
                }
            }
            if want.is_empty() {
                continue;
            }
            let Some(sm) = sm_of(dev) else { continue };
            let named: Vec<(u64, String)> = want
                .iter()
                .map(|(crc, fptr)| {
                    let n = if fptr.is_null() { String::new() } else { fptr.c_str().to_string_lossy().into_owned() };
                    (*crc, n)
                })
                .collect();
            self.late_tried.extend(want.iter().map(|w| w.0));
            let now = Instant::now();
            for (crc, name) in named {
                self.asked.insert(crc, (name, sm, now));
                self.query.push(crc);
            }
        }
        // Lines cached as unknown for modules found since are looked up again (only when cubins
        // were kept since the last look: this runs at every collection).
        let kept = cubins::stats().1;
        if kept != self.kept_seen {
            self.kept_seen = kept;
            self.lines.retain(|(crc, _, _), (_, line)| *line != 0 || cubins::get(*crc).is_none());
        }
    }

    /// Whether module `crc`'s cubin is still being asked of gpuprofd or looked for.
    pub(super) fn looking_for(&self, crc: u64) -> bool {
        self.asked.contains_key(&crc) || (self.late_tried.contains(&crc) && cubins::looking())
    }

    /// The modules to ask gpuprofd for (16 hex digits each), once.
    pub(super) fn take_query(&mut self) -> Vec<String> {
        std::mem::take(&mut self.query).into_iter().map(|crc| format!("{crc:016x}")).collect()
    }

    /// gpuprofd's answer: the cubins it had are kept (when CUPTI's CRC of them matches), those
    /// an earlier process found nowhere count as without lines, the rest are looked for here.
    pub(super) fn answer(&mut self, a: CubinAnswer) {
        let crc_of = |h: &str| u64::from_str_radix(h, 16).ok();
        let (mut adopted, mut nowhere, mut look) = (0, 0, Vec::new());
        for (h, bytes) in a.cubins {
            let Some(crc) = crc_of(&h).filter(|c| self.asked.contains_key(c)) else { continue };
            if cubins::adopt(crc, bytes) {
                self.asked.remove(&crc);
                adopted += 1;
            } else {
                look.push(crc);
            }
        }
        for crc in a.nowhere.iter().filter_map(|h| crc_of(h)) {
            if self.asked.remove(&crc).is_some() {
                cubins::note_missing(crc);
                nowhere += 1;
            }
        }
        look.extend(a.unknown.iter().filter_map(|h| crc_of(h)).filter(|c| self.asked.contains_key(c)));
        log!(
            Info,
            "PC sampling: gpuprofd had the cubins of {adopted} modules loaded before sampling; {nowhere} were in no \
             mapped file of an earlier process; {} to look for in the mapped files",
            look.len()
        );
        self.look(look);
    }

    /// Looks for the cubins of `crcs` (asked of gpuprofd) in the mapped files.
    fn look(&mut self, crcs: Vec<u64>) {
        let mut by_sm: HashMap<u32, Vec<(u64, String)>> = HashMap::new();
        for crc in crcs {
            if let Some((name, sm, _)) = self.asked.remove(&crc) {
                by_sm.entry(sm).or_default().push((crc, name));
            }
        }
        for (sm, wanted) in by_sm {
            log!(Info, "PC sampling: looking for the cubins of modules loaded before sampling in the mapped files");
            cubins::request_late(wanted, sm);
        }
    }

    pub(super) fn name(&mut self, fptr: FunctionName) -> Arc<str> {
        if let Some((n, _)) = self.names.get(&fptr) {
            return n.clone();
        }
        let c = if fptr.is_null() { CString::default() } else { fptr.c_str().to_owned() };
        let n: Arc<str> = Arc::from(c.to_string_lossy().as_ref());
        self.names.insert(fptr, (n.clone(), c));
        n
    }

    pub(super) fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(n) = self.strs.get(s) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(s);
        self.strs.insert(s.to_string(), n.clone());
        n
    }

    /// The source line of a PC, from the captured cubin (cached; `("", 0)` when unknown, or
    /// past the time budget and tried again next time).
    pub(super) fn line(&mut self, crc: u64, fptr: FunctionName, pc: u64, deadline: Instant) -> (Arc<str>, u32) {
        if let Some((f, l)) = self.lines.get(&(crc, fptr, pc)) {
            return (f.clone(), *l);
        }
        if crc == 0 || fptr.is_null() || Instant::now() >= deadline {
            return (self.no_line.clone(), 0);
        }
        let Some(cubin) = cubins::get(crc) else { return (self.no_line.clone(), 0) };
        self.name(fptr);
        let Some((_, cname)) = self.names.get(&fptr) else { return (self.no_line.clone(), 0) };
        let r = match self.cupti.sass_to_source(&cubin, cname, pc) {
            Ok(Some((file, line))) => (self.intern(&file), line),
            _ => (self.no_line.clone(), 0),
        };
        self.lines.insert((crc, fptr, pc), r.clone());
        r
    }
}
