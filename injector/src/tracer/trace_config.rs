//! The trace configuration: defaults, skips, and the CUPTI activity kinds it enables.

use gpuprof_proto::agent as pb;

use gpuprof_cupti::ids;

/// The trace configuration used when the daemon sends none (or an all-false one).
pub fn default_config() -> pb::TraceConfig {
    pb::TraceConfig {
        kernels: true,
        memcpy: true,
        memset: true,
        runtime_api: true,
        driver_api: true,
        sync: true,
        overhead: true,
        nvtx: true,
        external_correlation: true,
        graphs: false,
        flush_interval_ms: 0,
        activity_off: false,
    }
}

/// Resolves an optional/empty configuration to the one to apply.
pub fn effective_config(cfg: Option<&pb::TraceConfig>) -> pb::TraceConfig {
    match cfg {
        // Nothing but PC samples: no kind at all, not even the device and context records.
        Some(c) if c.activity_off => pb::TraceConfig { activity_off: true, ..Default::default() },
        Some(c)
            if c.kernels
                || c.memcpy
                || c.memset
                || c.runtime_api
                || c.driver_api
                || c.sync
                || c.overhead
                || c.nvtx
                || c.external_correlation
                || c.graphs =>
        {
            *c
        }
        Some(c) => pb::TraceConfig { flush_interval_ms: c.flush_interval_ms, ..default_config() },
        None => default_config(),
    }
}

/// Removes the parts named in `skip` (see `Config::skip`); kernels are never skipped.
pub fn apply_skip(mut cfg: pb::TraceConfig, skip: &[String]) -> pb::TraceConfig {
    for s in skip {
        match s.as_str() {
            "runtime_api" | "runtime" => cfg.runtime_api = false,
            "driver_api" | "driver" => cfg.driver_api = false,
            "memcpy" => cfg.memcpy = false,
            "memset" => cfg.memset = false,
            "sync" => cfg.sync = false,
            "overhead" => cfg.overhead = false,
            "nvtx" => cfg.nvtx = false,
            "external_correlation" => cfg.external_correlation = false,
            "graphs" => cfg.graphs = false,
            _ => {}
        }
    }
    cfg
}

/// The activity kinds a configuration enables, in enabling order.
pub fn kinds_for(cfg: &pb::TraceConfig) -> Vec<u32> {
    if cfg.activity_off {
        return Vec::new();
    }
    let mut k =
        vec![ids::CUPTI_ACTIVITY_KIND_DEVICE, ids::CUPTI_ACTIVITY_KIND_CONTEXT, ids::CUPTI_ACTIVITY_KIND_STREAM];
    if cfg.kernels {
        k.push(ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    }
    if cfg.memcpy {
        k.push(ids::CUPTI_ACTIVITY_KIND_MEMCPY);
        k.push(ids::CUPTI_ACTIVITY_KIND_MEMCPY2);
    }
    if cfg.memset {
        k.push(ids::CUPTI_ACTIVITY_KIND_MEMSET);
    }
    if cfg.sync {
        k.push(ids::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
    }
    if cfg.overhead {
        k.push(ids::CUPTI_ACTIVITY_KIND_OVERHEAD);
    }
    if cfg.nvtx {
        k.push(ids::CUPTI_ACTIVITY_KIND_MARKER);
    }
    if cfg.external_correlation {
        k.push(ids::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    }
    // Graph-level records replace per-node kernel records; with kernels on, kernels carry
    // graph ids and the cudaGraphLaunch/cuGraphLaunch API records mark the launches.
    if cfg.graphs && !cfg.kernels {
        k.push(ids::CUPTI_ACTIVITY_KIND_GRAPH_TRACE);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_map_to_kinds() {
        let all = kinds_for(&default_config());
        for k in [
            ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
            ids::CUPTI_ACTIVITY_KIND_MEMCPY,
            ids::CUPTI_ACTIVITY_KIND_MEMCPY2,
            ids::CUPTI_ACTIVITY_KIND_MEMSET,
            ids::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
            ids::CUPTI_ACTIVITY_KIND_OVERHEAD,
            ids::CUPTI_ACTIVITY_KIND_MARKER,
            ids::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
            ids::CUPTI_ACTIVITY_KIND_DEVICE,
        ] {
            assert!(all.contains(&k), "{k}");
        }
        assert!(!all.contains(&ids::CUPTI_ACTIVITY_KIND_KERNEL), "never the serializing KERNEL kind");
        assert!(!all.contains(&ids::CUPTI_ACTIVITY_KIND_RUNTIME), "API calls are selected per cbid");
        let graphs_only = pb::TraceConfig { graphs: true, ..Default::default() };
        assert!(kinds_for(&graphs_only).contains(&ids::CUPTI_ACTIVITY_KIND_GRAPH_TRACE));
    }

    #[test]
    fn skip_removes_parts_but_never_kernels() {
        let skip = vec!["runtime_api".to_string(), "nvtx".into(), "kernels".into(), "bogus".into()];
        let c = apply_skip(default_config(), &skip);
        assert!(c.kernels && !c.runtime_api && !c.nvtx && c.memcpy && c.driver_api);
    }

    #[test]
    fn empty_config_means_defaults() {
        assert_eq!(effective_config(None), default_config());
        let c = effective_config(Some(&pb::TraceConfig { flush_interval_ms: 100, ..Default::default() }));
        assert!(c.kernels && c.flush_interval_ms == 100);
        let only = pb::TraceConfig { kernels: true, ..Default::default() };
        assert_eq!(effective_config(Some(&only)), only);
    }

    #[test]
    fn activity_off_enables_no_kind_at_all() {
        let c = effective_config(Some(&pb::TraceConfig { activity_off: true, kernels: true, ..Default::default() }));
        assert!(c.activity_off && !c.kernels && !c.runtime_api, "{c:?}");
        assert!(kinds_for(&c).is_empty());
    }
}
