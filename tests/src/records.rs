//! Realistic synthetic records: long mangled kernel names, launch API records joined to
//! kernels by correlation id, copies and sets, several devices and streams.

use gpuprof_proto::agent::{
    ApiDomain, ApiRecord, ExternalCorrelationRecord, KernelRecord, MarkerRecord, MemcpyRecord, MemsetRecord,
    OverheadRecord, RecordBatch, SyncRecord,
};

/// Kernel names as PyTorch/cuBLAS emit them (mangled, long).
pub const KERNEL_NAMES: &[&str] = &[
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
    "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE0_clEvENKUlvE5_clEvEUlfE_EEvS4_RKT_EUliE_EEviT1_",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "_ZN7cutlass7Kernel2I52cutlass_80_tensorop_s1688gemm_128x256_16x3_nn_align4EEvNT_6ParamsE",
    "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIfZNS0_11sum_functorIfffEclERNS_14TensorIteratorEEUlffE_EEjfLi4ELi4EEEEEvT1_",
    "_ZN2at6native12_GLOBAL__N_120softmax_warp_forwardIfffLi10ELb0ELb0EEEvPT0_PKT_iiiPKbib",
    "ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_nn",
    "_Z11tiny_kernelPf",
];

/// NVTX range names.
pub const MARKER_NAMES: &[&str] = &["forward", "backward", "optimizer.step", "dataloader", "allreduce"];

/// Relative weights of record kinds in generated traffic.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub kernel: u32,
    pub api: u32,
    pub memcpy: u32,
    pub memset: u32,
    pub sync: u32,
    pub marker: u32,
    pub overhead: u32,
    pub external_correlation: u32,
}

impl Default for Mix {
    /// A training step's shape: mostly launches and kernels.
    fn default() -> Self {
        Mix { kernel: 40, api: 40, memcpy: 6, memset: 3, sync: 4, marker: 3, overhead: 1, external_correlation: 3 }
    }
}

impl Mix {
    fn slots(&self) -> Vec<u8> {
        let mut v = Vec::new();
        for (i, w) in [
            self.kernel,
            self.api,
            self.memcpy,
            self.memset,
            self.sync,
            self.marker,
            self.overhead,
            self.external_correlation,
        ]
        .iter()
        .enumerate()
        {
            v.extend(std::iter::repeat_n(i as u8, *w as usize));
        }
        v
    }
}

/// Deterministic generator of records for one fake process.
pub struct RecordGen {
    state: u64,
    slots: Vec<u8>,
    slot: usize,
    corr: u32,
    ts: u64,
    /// String ids of kernel names and marker names on this connection (set by the agent).
    pub kernel_name_ids: Vec<u32>,
    pub marker_name_ids: Vec<u32>,
    pub devices: u32,
    pub streams: u32,
}

impl RecordGen {
    pub fn new(seed: u64, mix: Mix) -> RecordGen {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        RecordGen {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            slots: mix.slots(),
            slot: (seed as usize) % 7,
            corr: 1,
            ts: now,
            kernel_name_ids: Vec::new(),
            marker_name_ids: Vec::new(),
            devices: 2,
            streams: 4,
        }
    }

    /// Moves the generator's clock on by `ns`: records from then on come from a process that has
    /// run that long since it connected.
    pub fn advance(&mut self, ns: u64) {
        self.ts += ns;
    }

    fn rand(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick(&mut self, n: u32) -> u32 {
        (self.rand() % n as u64) as u32
    }

    /// Appends exactly `n` records to `b`.
    pub fn fill(&mut self, b: &mut RecordBatch, n: usize) {
        assert!(!self.kernel_name_ids.is_empty() && !self.marker_name_ids.is_empty(), "define strings first");
        for _ in 0..n {
            let kind = self.slots[self.slot % self.slots.len()];
            self.slot += 1;
            self.ts += 1_000 + self.rand() % 4_000;
            let start = self.ts;
            let dev = self.pick(self.devices);
            let stream = 7 + self.pick(self.streams);
            let corr = self.corr;
            match kind {
                0 => {
                    let i = self.pick(self.kernel_name_ids.len() as u32) as usize;
                    let name = self.kernel_name_ids[i];
                    let dur = 2_000 + self.rand() % 200_000;
                    b.kernels.push(KernelRecord {
                        start_ns: start,
                        end_ns: start + dur,
                        device_id: dev,
                        context_id: 1 + dev,
                        stream_id: stream,
                        correlation_id: corr,
                        name_id: name,
                        // The grid follows the problem size; registers and static shared
                        // memory belong to the compiled kernel, and the block and dynamic shared
                        // memory to the code launching it: the same for most launches of a name.
                        grid_x: 1 + self.pick(4096),
                        grid_y: 1,
                        grid_z: 1,
                        block_x: [128, 256, 512][i % 3],
                        block_y: 1,
                        block_z: 1,
                        registers_per_thread: 16 + (i as u32 * 37) % 200,
                        static_shared_bytes: [0, 1024][i % 2],
                        dynamic_shared_bytes: [0, 16384, 49152][(i + self.pick(2) as usize) % 3],
                        graph_node_id: 0,
                        graph_id: 0,
                    });
                }
                1 => {
                    self.corr += 1;
                    b.api_calls.push(ApiRecord {
                        domain: ApiDomain::Runtime as i32,
                        cbid: [211, 31, 41, 165][self.pick(4) as usize],
                        start_ns: start,
                        end_ns: start + 2_000 + self.rand() % 8_000,
                        correlation_id: corr,
                        thread_id: 4242 + self.pick(2),
                        return_value: 0,
                    });
                }
                2 => {
                    let bytes = 4096u64 << self.pick(16);
                    b.memcpys.push(MemcpyRecord {
                        start_ns: start,
                        end_ns: start + 1_000 + bytes / 20,
                        device_id: dev,
                        context_id: 1 + dev,
                        stream_id: stream,
                        correlation_id: corr,
                        bytes,
                        copy_kind: [1, 2, 8][self.pick(3) as usize],
                        src_kind: 2,
                        dst_kind: 3,
                        src_device_id: dev,
                        dst_device_id: dev,
                        graph_node_id: 0,
                        is_async: true,
                    });
                }
                3 => {
                    b.memsets.push(MemsetRecord {
                        start_ns: start,
                        end_ns: start + 1_500,
                        device_id: dev,
                        context_id: 1 + dev,
                        stream_id: stream,
                        correlation_id: corr,
                        bytes: 1 << (10 + self.pick(14)),
                        value: 0,
                        memory_kind: 3,
                        graph_node_id: 0,
                    });
                }
                4 => {
                    b.syncs.push(SyncRecord {
                        sync_type: 1 + self.pick(4),
                        start_ns: start,
                        end_ns: start + 5_000 + self.rand() % 50_000,
                        correlation_id: corr,
                        context_id: 1 + dev,
                        stream_id: stream,
                        event_id: 0,
                    });
                }
                5 => {
                    let i = self.pick(self.marker_name_ids.len() as u32) as usize;
                    let name = self.marker_name_ids[i];
                    b.markers.push(MarkerRecord {
                        id: corr as u64,
                        start_ns: start,
                        end_ns: start + 100_000 + self.rand() % 1_000_000,
                        name_id: name,
                        domain_id: 0,
                        thread_id: 4242,
                        is_mark: false,
                    });
                }
                6 => {
                    b.overheads.push(OverheadRecord {
                        overhead_kind: 1,
                        object_kind: 2,
                        object_id: 4242,
                        start_ns: start,
                        end_ns: start + 3_000,
                    });
                }
                _ => {
                    b.external_correlations.push(ExternalCorrelationRecord {
                        external_kind: 2,
                        external_id: 10_000 + corr as u64,
                        correlation_id: corr,
                    });
                }
            }
        }
    }
}
