//! CUPTI callback ids (runtime and driver API) to API function names, for API-call summaries
//! and trace exports. The tables are generated from the CUPTI headers by
//! `cupti/bindgen/generate.sh` (version suffixes such as `_v3020` removed).

use crate::cbid_names::{DRIVER, RUNTIME};

/// Callback domain of runtime API records.
pub const DOMAIN_RUNTIME: i64 = 1;
/// Callback domain of driver API records.
pub const DOMAIN_DRIVER: i64 = 2;

/// The API function of a callback id, or `None` for an id the headers do not list.
pub fn lookup(domain: i64, cbid: i64) -> Option<&'static str> {
    let table = match domain {
        DOMAIN_RUNTIME => RUNTIME,
        DOMAIN_DRIVER => DRIVER,
        _ => return None,
    };
    let cbid = u32::try_from(cbid).ok()?;
    table.binary_search_by_key(&cbid, |e| e.0).ok().map(|i| table[i].1)
}

/// The name of an API call; ids not listed show as `cbid N`.
pub fn name(domain: i64, cbid: i64) -> String {
    lookup(domain, cbid).map_or_else(|| format!("cbid {cbid}"), str::to_string)
}

/// "runtime", "driver" or "unknown".
pub fn domain_name(domain: i64) -> &'static str {
    match domain {
        DOMAIN_RUNTIME => "runtime",
        DOMAIN_DRIVER => "driver",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::cupti as sys;

    #[test]
    fn known_ids_have_their_names() {
        let rt = |id: u32| name(DOMAIN_RUNTIME, id as i64);
        assert_eq!(rt(sys::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000), "cudaLaunchKernel");
        assert_eq!(rt(sys::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000), "cudaLaunchKernel_ptsz");
        assert_eq!(rt(sys::CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020), "cudaMemcpyAsync");
        assert_eq!(rt(sys::CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020), "cudaDeviceSynchronize");
        let drv = |id: u32| name(DOMAIN_DRIVER, id as i64);
        assert_eq!(drv(sys::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel), "cuLaunchKernel");
        assert_eq!(drv(sys::CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2), "cuMemAlloc");
    }

    #[test]
    fn unknown_ids_and_domains_are_named_by_number() {
        assert_eq!(name(DOMAIN_RUNTIME, 999_999), "cbid 999999");
        assert_eq!(name(DOMAIN_RUNTIME, -1), "cbid -1");
        assert_eq!(name(7, 211), "cbid 211");
        assert_eq!(domain_name(2), "driver");
        assert_eq!(domain_name(0), "unknown");
    }

    #[test]
    fn tables_are_sorted_for_binary_search() {
        for t in [RUNTIME, DRIVER] {
            assert!(t.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(t.len() > 400);
        }
    }
}
