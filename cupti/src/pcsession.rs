//! PC sampling enabled on one context, as a value: [`PcSampling::enable`] makes it,
//! [`PcSampling::disable`] consumes it. Every call takes a [`LiveContext`] (the context is alive
//! for the call) that must be the one sampling was enabled on, so the calls are safe: what
//! CUPTI needs beyond a live context (sampling enabled, configured, the buffer given at
//! configuration kept where it is until the disable) the value itself keeps.
// Safety: the calls below go to `pcsampling`'s unsafe wrappers with a context that is alive
// (a `LiveContext`) and on which this value enabled sampling (checked first), and the buffer
// given at configuration is owned here and freed only after a disable succeeded.
#![allow(unsafe_code)]

use crate::callback::{Context, LiveContext};
use crate::error::CuptiError;
use crate::loader::Cupti;
use crate::pcsampling::{PcBuffer, PcConfig, StallReasons};
use crate::sys::cupti as sys;

/// Sampling enabled on one context, until [`PcSampling::disable`].
///
/// Dropped without a successful disable (the context went away first), the buffer given at
/// configuration is leaked rather than freed: CUPTI may still write into it.
#[must_use = "sampling stays enabled until disable() is called"]
pub struct PcSampling {
    ctx: Context,
    /// The buffer CUPTI fills at the disable (given at configuration; None before).
    at_disable: Option<Box<PcBuffer>>,
    /// Configured with start/stop control.
    ranged: bool,
    /// A range is open.
    running: bool,
}

impl PcSampling {
    /// `cuptiPCSamplingEnable` on the context.
    pub fn enable(cupti: &Cupti, on: LiveContext<'_>) -> Result<PcSampling, CuptiError> {
        // Safety: `on` is alive for the call.
        unsafe { cupti.pc_enable(on.context()) }?;
        Ok(PcSampling { ctx: on.context(), at_disable: None, ranged: false, running: false })
    }

    /// The context sampling was enabled on.
    pub fn context(&self) -> Context {
        self.ctx
    }

    /// Configured with start/stop control ([`PcConfig::start_stop`]).
    pub fn ranged(&self) -> bool {
        self.ranged
    }

    /// A range is open (start/stop control): sampling runs.
    pub fn running(&self) -> bool {
        self.running
    }

    /// `CUPTI_ERROR_INVALID_CONTEXT` unless `on` is the context sampling was enabled on.
    fn check(&self, on: LiveContext<'_>) -> Result<Context, CuptiError> {
        if on.context() == self.ctx {
            Ok(self.ctx)
        } else {
            Err(CuptiError { code: sys::CUPTI_ERROR_INVALID_CONTEXT, call: "PcSampling (another context)" })
        }
    }

    /// The stall reasons of the context's device.
    pub fn stall_reasons(&self, cupti: &Cupti, on: LiveContext<'_>) -> Result<StallReasons, CuptiError> {
        let ctx = self.check(on)?;
        // Safety: `ctx` is alive (`on`) and sampling is enabled on it (this value).
        unsafe { cupti.pc_stall_reasons(ctx) }
    }

    /// Configures sampling (once), with `at_disable` as the buffer CUPTI fills at the disable;
    /// with [`PcConfig::start_stop`] no range is open until [`PcSampling::start`].
    pub fn configure(
        &mut self,
        cupti: &Cupti,
        on: LiveContext<'_>,
        cfg: &PcConfig,
        at_disable: PcBuffer,
    ) -> Result<(), CuptiError> {
        let ctx = self.check(on)?;
        if self.at_disable.is_some() {
            return Err(CuptiError { code: sys::CUPTI_ERROR_INVALID_OPERATION, call: "PcSampling::configure (again)" });
        }
        // Kept from here on whatever CUPTI answers: a failed configure may have taken the
        // buffer's address before refusing an attribute.
        let buf = self.at_disable.insert(Box::new(at_disable));
        // Safety: `ctx` is alive and enabled; the buffer is boxed and owned by this value, freed
        // only after a successful disable (see `Drop`).
        unsafe { cupti.pc_configure(ctx, cfg, buf) }?;
        self.ranged = cfg.start_stop;
        Ok(())
    }

    /// `cuptiPCSamplingStart`: opens a range. Only with start/stop control configured; a range
    /// already open is left as it is.
    pub fn start(&mut self, cupti: &Cupti, on: LiveContext<'_>) -> Result<(), CuptiError> {
        let ctx = self.check(on)?;
        if !self.ranged {
            return Err(CuptiError {
                code: sys::CUPTI_ERROR_INVALID_OPERATION,
                call: "PcSampling::start (no start/stop control)",
            });
        }
        if self.running {
            return Ok(());
        }
        // Safety: alive, enabled and configured with start/stop control, out of a range.
        unsafe { cupti.pc_start(ctx) }?;
        self.running = true;
        Ok(())
    }

    /// `cuptiPCSamplingStop`: closes the open range (nothing to do without one). The range
    /// counts as closed whatever CUPTI answers.
    pub fn stop(&mut self, cupti: &Cupti, on: LiveContext<'_>) -> Result<(), CuptiError> {
        let ctx = self.check(on)?;
        if !self.running {
            return Ok(());
        }
        self.running = false;
        // Safety: alive, enabled with start/stop control, in a range.
        unsafe { cupti.pc_stop(ctx) }
    }

    /// `cuptiPCSamplingGetData` into `buf` (emptied first).
    pub fn read(&mut self, cupti: &Cupti, on: LiveContext<'_>, buf: &mut PcBuffer) -> Result<(), CuptiError> {
        let ctx = self.check(on)?;
        // Safety: alive and enabled; `buf` is a PcBuffer, written only during the call.
        unsafe { cupti.pc_get_data(ctx, buf) }
    }

    /// `cuptiPCSamplingDisable`: ends sampling. Gives back the buffer given at configuration,
    /// holding the PCs CUPTI still had (None when it was never configured). On an error (or
    /// another context's `on`) that buffer is leaked, as CUPTI may still write into it.
    pub fn disable(mut self, cupti: &Cupti, on: LiveContext<'_>) -> Result<Option<Box<PcBuffer>>, CuptiError> {
        let ctx = self.check(on)?;
        self.running = false;
        // Safety: alive and enabled (this value, consumed here).
        unsafe { cupti.pc_disable(ctx) }?;
        Ok(self.at_disable.take())
    }
}

impl Drop for PcSampling {
    fn drop(&mut self) {
        // Not disabled (or the disable failed): CUPTI may still hold the buffer's address.
        if let Some(buf) = self.at_disable.take() {
            std::mem::forget(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::Purpose;

    /// A made-up context: the calls below refuse it, or have nothing to do, before any CUPTI
    /// call could see it.
    fn live(id: usize) -> LiveContext<'static> {
        // Safety: never passed to CUPTI (see above).
        unsafe { LiveContext::assume(Context::from_raw(id as sys::CUcontext)) }.expect("not null")
    }

    fn sampling(id: usize) -> PcSampling {
        PcSampling { ctx: live(id).context(), at_disable: None, ranged: false, running: false }
    }

    #[test]
    fn a_null_context_is_never_live_and_another_context_is_refused() {
        // Safety: null is refused.
        assert!(unsafe { LiveContext::assume(Context::NULL) }.is_none());
        let s = sampling(0x1000);
        assert!(s.check(live(0x2000)).is_err_and(|e| e.code == sys::CUPTI_ERROR_INVALID_CONTEXT));
        assert_eq!(s.check(live(0x1000)), Ok(s.context()));
        assert!(!s.ranged() && !s.running());
    }

    /// Needs a real libcupti (no GPU): the calls refuse or skip before reaching CUPTI.
    #[test]
    #[ignore = "needs a libcupti.so.13 (no GPU needed): GPUPROF_CUPTI_LIBRARY=/path/libcupti.so.13 cargo test -p gpuprof-cupti -- --ignored"]
    fn every_call_checks_its_context_and_state_before_calling_cupti() {
        let p = std::env::var_os("GPUPROF_CUPTI_LIBRARY").expect("set GPUPROF_CUPTI_LIBRARY to a libcupti.so.13");
        let cupti = Cupti::load_path(std::path::Path::new(&p), Purpose::Tracing).expect("load");
        let code = |r: Result<(), CuptiError>| r.err().map(|e| e.code);
        let mut s = sampling(0x1000);
        let (own, other) = (live(0x1000), live(0x2000));
        let invalid = Some(sys::CUPTI_ERROR_INVALID_CONTEXT);
        assert_eq!(code(s.start(&cupti, other)), invalid);
        assert_eq!(code(s.stop(&cupti, other)), invalid);
        assert_eq!(code(s.read(&cupti, other, &mut PcBuffer::new(1, 1))), invalid);
        assert_eq!(code(s.configure(&cupti, other, &PcConfig::default(), PcBuffer::new(1, 1))), invalid);
        assert!(s.stall_reasons(&cupti, other).is_err_and(|e| e.code == sys::CUPTI_ERROR_INVALID_CONTEXT));
        assert_eq!(code(s.start(&cupti, own)), Some(sys::CUPTI_ERROR_INVALID_OPERATION), "no start/stop control");
        assert_eq!(s.stop(&cupti, own), Ok(()), "no range open: nothing to stop");
        s.at_disable = Some(Box::new(PcBuffer::new(1, 1)));
        assert_eq!(
            code(s.configure(&cupti, own, &PcConfig::default(), PcBuffer::new(1, 1))),
            Some(sys::CUPTI_ERROR_INVALID_OPERATION)
        );
        assert!(s.disable(&cupti, other).is_err_and(|e| e.code == sys::CUPTI_ERROR_INVALID_CONTEXT));
    }
}
