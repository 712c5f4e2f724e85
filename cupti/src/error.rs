//! [`CuptiError`]: the one error type of every CUPTI call gpuprof makes.

use std::fmt;

use crate::sys::cupti as sys;

/// A failed CUPTI call: its status code and, where known, the function called.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CuptiError {
    /// The `CUptiResult`.
    pub code: u32,
    /// The CUPTI function that returned it ("" when not recorded).
    pub call: &'static str,
}

impl CuptiError {
    /// An error with no function name.
    pub const fn new(code: u32) -> CuptiError {
        CuptiError { code, call: "" }
    }

    /// CUPTI_ERROR_HARDWARE_BUSY: another client (ncu, DCGM, another sampler) holds the
    /// device's performance monitor.
    pub fn is_hardware_busy(self) -> bool {
        self.code == sys::CUPTI_ERROR_HARDWARE_BUSY
    }

    /// CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: another CUPTI client holds CUPTI.
    pub fn is_other_subscriber(self) -> bool {
        self.code == sys::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
    }

    /// The symbolic name of the code, as in `cupti_result.h`.
    pub fn name(self) -> &'static str {
        match self.code {
            sys::CUPTI_ERROR_INVALID_PARAMETER => "CUPTI_ERROR_INVALID_PARAMETER",
            sys::CUPTI_ERROR_INVALID_DEVICE => "CUPTI_ERROR_INVALID_DEVICE",
            sys::CUPTI_ERROR_INVALID_CONTEXT => "CUPTI_ERROR_INVALID_CONTEXT",
            sys::CUPTI_ERROR_INVALID_OPERATION => "CUPTI_ERROR_INVALID_OPERATION",
            sys::CUPTI_ERROR_OUT_OF_MEMORY => "CUPTI_ERROR_OUT_OF_MEMORY",
            sys::CUPTI_ERROR_NOT_READY => "CUPTI_ERROR_NOT_READY",
            sys::CUPTI_ERROR_NOT_COMPATIBLE => "CUPTI_ERROR_NOT_COMPATIBLE",
            sys::CUPTI_ERROR_NOT_INITIALIZED => "CUPTI_ERROR_NOT_INITIALIZED",
            sys::CUPTI_ERROR_QUEUE_EMPTY => "CUPTI_ERROR_QUEUE_EMPTY",
            sys::CUPTI_ERROR_INVALID_KIND => "CUPTI_ERROR_INVALID_KIND",
            sys::CUPTI_ERROR_DISABLED => "CUPTI_ERROR_DISABLED",
            sys::CUPTI_ERROR_HARDWARE_BUSY => "CUPTI_ERROR_HARDWARE_BUSY",
            sys::CUPTI_ERROR_NOT_SUPPORTED => "CUPTI_ERROR_NOT_SUPPORTED",
            sys::CUPTI_ERROR_INSUFFICIENT_PRIVILEGES => "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
            sys::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
            sys::CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED => "CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED",
            sys::CUPTI_ERROR_UNKNOWN => "CUPTI_ERROR_UNKNOWN",
            _ => "CUPTI_ERROR_(other)",
        }
    }
}

impl fmt::Debug for CuptiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.call.is_empty() {
            write!(f, "{} failed: ", self.call)?;
        }
        write!(f, "{} ({})", self.name(), self.code)
    }
}

impl fmt::Display for CuptiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for CuptiError {}

/// `Ok` for CUPTI_SUCCESS, the code otherwise.
pub fn check(r: sys::CUptiResult) -> Result<(), CuptiError> {
    if r == sys::CUPTI_SUCCESS { Ok(()) } else { Err(CuptiError::new(r)) }
}

/// [`check`], naming the function called.
pub fn check_call(call: &'static str, r: sys::CUptiResult) -> Result<(), CuptiError> {
    check(r).map_err(|e| CuptiError { call, ..e })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_display() {
        assert_eq!(CuptiError::new(39).name(), "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
        assert!(CuptiError::new(39).is_other_subscriber());
        assert_eq!(format!("{}", CuptiError::new(26)), "CUPTI_ERROR_HARDWARE_BUSY (26)");
        let e = check_call("cuptiPmSamplingEnable", 26).unwrap_err();
        assert!(e.is_hardware_busy());
        assert_eq!(e.to_string(), "cuptiPmSamplingEnable failed: CUPTI_ERROR_HARDWARE_BUSY (26)");
        assert_eq!(CuptiError::new(12345).name(), "CUPTI_ERROR_(other)");
        assert!(check(sys::CUPTI_SUCCESS).is_ok());
    }
}
