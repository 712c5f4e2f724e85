// The CUPTI floor of what gpuprof records by default, without gpuprof: an injection library that
// enables kernel records, optionally with launch API records, counts the records and throws them
// away. FLOOR_PARTS=kernel: CONCURRENT_KERNEL only. FLOOR_PARTS=launch: also the RUNTIME kind with
// every callback id but the kernel launches switched off (how gpuprof enables API records).
// Prints "FLOOR_MIN parts=... records=N api=N dropped=N" at exit.
#include <cupti.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_ullong nrec, napi, ndrop;
static const char *parts = "kernel";

static void CUPTIAPI requested(uint8_t **buf, size_t *size, size_t *max) {
  *size = 4 << 20;
  *buf = aligned_alloc(8, *size);
  *max = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
  CUpti_Activity *r = NULL;
  unsigned long long n = 0, api = 0;
  while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    n++;
    if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) api++;
  }
  size_t d = 0;
  cuptiActivityGetNumDroppedRecords(ctx, stream, &d);
  atomic_fetch_add(&nrec, n);
  atomic_fetch_add(&napi, api);
  atomic_fetch_add(&ndrop, d);
  free(buf);
}

static void at_exit(void) {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  fprintf(stderr, "FLOOR_MIN parts=%s records=%llu api=%llu dropped=%llu\n", parts, (unsigned long long)nrec,
          (unsigned long long)napi, (unsigned long long)ndrop);
}

static int is_launch(unsigned cbid) {
  return cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060;
}

int InitializeInjection(void) {
  if (getenv("FLOOR_PARTS")) parts = getenv("FLOOR_PARTS");
  cuptiActivityRegisterCallbacks(requested, completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (strcmp(parts, "launch") == 0) {
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    for (unsigned cbid = 1; cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE; cbid++)
      if (!is_launch(cbid)) cuptiActivityEnableRuntimeApi(cbid, 0);
  }
  atexit(at_exit);
  return 1;
}
