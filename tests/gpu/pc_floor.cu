// What continuous PC sampling costs CUPTI itself on launch-bound work, without gpuprof:
// N small kernel launches timed in one process with CUPTI's PC sampling API used directly.
//   pc_floor MODE [N]
// MODE: off        no CUPTI at all
//       cb         a CUPTI subscriber with only the synchronization callbacks gpuprof uses
//       enable     cuptiPCSamplingEnable on the context, nothing configured
//       pN         enabled and configured as gpuprof does (continuous, period 2^N, all stall
//                  reasons, parsed output), e.g. p15
//       endis      enabled, then disabled before the timed loop (what stays after a window)
//       endisfin   enabled, disabled and cuptiFinalize before the timed loop; after it, the
//                  second enable's time (CUPTI set up again) is printed as reenable_ms
//       cbfin      the cb subscriber, then unsubscribed and cuptiFinalize
//       loopoff, loopinline, loopside  where a window's enable blocks the application: N
//                  launches with a synchronization every 100 (as small_sync.py), a subscriber
//                  made first in all three; at 20 % and 60 % of the loop PC sampling is enabled,
//                  at 40 % and 80 % disabled and CUPTI finalized, by the launching thread at its
//                  synchronization (inline) or by a second thread while the loop goes on (side);
//                  prints each call's time per cycle (enable0_ms: the first, enable1_ms: after
//                  the finalize) and the longest 100-launch chunk (max_chunk_ms)
//       loopcont, loopss  as loopinline, with PC sampling configured as gpuprof does (period
//                  2^15) continuous (sampling from the configure on), or with start/stop control
//                  and a cuptiPCSamplingStart (then Stop and a read before the disable); a number
//                  after the mode sets the hardware buffer in MiB (loopss8: 8 MiB; else CUPTI's
//                  default, 512 MiB), a "w" after it CUPTI's worker thread's sleep to 5 ms (as
//                  gpuprof's windows; else 100 ms): loopss64w is what gpuprof's windows configure
// Prints "FLOOR mode=... us_per_launch=... samples=..." (samples read once after the loop).
// Build: nvcc -O2 -arch=sm_90 -I$CUPTI/include -o pc_floor pc_floor.cu -L$CUPTI/lib64 -lcupti -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_pcsampling.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#define CK(x)                                                                    \
  do {                                                                           \
    CUptiResult r_ = (x);                                                        \
    if (r_ != CUPTI_SUCCESS) {                                                   \
      const char *s_;                                                            \
      cuptiGetResultString(r_, &s_);                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);             \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

__global__ void axpb(float *x) { x[blockIdx.x * blockDim.x + threadIdx.x] *= 1.0000001f; }

// 2000 launches and a synchronization: the launch path warmed up.
static void warm(float *x) {
  for (int i = 0; i < 2000; i++) axpb<<<4, 256>>>(x);
  cudaDeviceSynchronize();
}

static void CUPTIAPI on_cb(void *, CUpti_CallbackDomain, CUpti_CallbackId, const void *) {}

static double now_s() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Configures PC sampling on `ctx` as gpuprof does: continuous, period 2^period, every stall
// reason, parsed output into `data`, with or without start/stop control.
static void configure_pc(CUcontext ctx, int period, int start_stop, CUpti_PCSamplingData *data, size_t hw_mib,
                         unsigned worker_ms) {
  size_t nstall = 0;
  CUpti_PCSamplingGetNumStallReasonsParams np = {CUpti_PCSamplingGetNumStallReasonsParamsSize};
  np.ctx = ctx;
  np.numStallReasons = &nstall;
  CK(cuptiPCSamplingGetNumStallReasons(&np));
  uint32_t *idx = (uint32_t *)calloc(nstall, sizeof(uint32_t));
  char **names = (char **)calloc(nstall, sizeof(char *));
  for (size_t i = 0; i < nstall; i++) names[i] = (char *)calloc(CUPTI_STALL_REASON_STRING_SIZE, 1);
  CUpti_PCSamplingGetStallReasonsParams sp = {CUpti_PCSamplingGetStallReasonsParamsSize};
  sp.ctx = ctx;
  sp.numStallReasons = nstall;
  sp.stallReasonIndex = idx;
  sp.stallReasons = names;
  CK(cuptiPCSamplingGetStallReasons(&sp));
  const size_t npcs = 5000;
  memset(data, 0, sizeof *data);
  data->size = sizeof *data;
  data->collectNumPcs = npcs;
  data->pPcData = (CUpti_PCSamplingPCData *)calloc(npcs, sizeof(CUpti_PCSamplingPCData));
  for (size_t i = 0; i < npcs; i++) {
    data->pPcData[i].size = sizeof(CUpti_PCSamplingPCData);
    data->pPcData[i].stallReason = (CUpti_PCSamplingStallReason *)calloc(nstall, sizeof(CUpti_PCSamplingStallReason));
  }
  CUpti_PCSamplingConfigurationInfo info[8];
  memset(info, 0, sizeof info);
  info[0].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE;
  info[0].attributeData.collectionModeData.collectionMode = CUPTI_PC_SAMPLING_COLLECTION_MODE_CONTINUOUS;
  info[1].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_ENABLE_START_STOP_CONTROL;
  info[1].attributeData.enableStartStopControlData.enableStartStopControl = start_stop;
  info[2].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_OUTPUT_DATA_FORMAT;
  info[2].attributeData.outputDataFormatData.outputDataFormat = CUPTI_PC_SAMPLING_OUTPUT_DATA_FORMAT_PARSED;
  info[3].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD;
  info[3].attributeData.samplingPeriodData.samplingPeriod = period;
  info[4].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON;
  info[4].attributeData.stallReasonData.stallReasonCount = nstall;
  info[4].attributeData.stallReasonData.pStallReasonIndex = idx;
  info[5].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER;
  info[5].attributeData.samplingDataBufferData.samplingDataBuffer = data;
  info[6].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_HARDWARE_BUFFER_SIZE;
  info[6].attributeData.hardwareBufferSizeData.hardwareBufferSize = hw_mib << 20;
  CUpti_PCSamplingConfigurationInfoParams cp = {CUpti_PCSamplingConfigurationInfoParamsSize};
  cp.ctx = ctx;
  int na = hw_mib ? 7 : 6;
  if (worker_ms) {
    info[na].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_WORKER_THREAD_PERIODIC_SLEEP_SPAN;
    info[na++].attributeData.workerThreadPeriodicSleepSpanData.workerThreadPeriodicSleepSpan = worker_ms;
  }
  cp.numAttributes = na;
  cp.pPCSamplingConfigurationInfo = info;
  CK(cuptiPCSamplingSetConfigurationAttribute(&cp));
}

// Reads what CUPTI holds for `ctx` into `data`: the samples read.
static unsigned long long read_pc(CUcontext ctx, CUpti_PCSamplingData *data) {
  unsigned long long samples = 0;
  for (int k = 0; k < 64; k++) {
    CUpti_PCSamplingGetDataParams gp = {CUpti_PCSamplingGetDataParamsSize};
    gp.ctx = ctx;
    gp.pcSamplingData = data;
    if (cuptiPCSamplingGetData(&gp) != CUPTI_SUCCESS) break;
    samples += data->totalSamples;
    if (data->remainingNumPcs == 0) break;
  }
  return samples;
}

// The loop modes: the enable, disable and finalize times (ms) and who makes the calls.
static CUcontext g_ctx;
static volatile int g_phase;  // 1, 3: enable now; 2, 4: disable and finalize now
// [cycle]: the first enable and disable, then the second (CUPTI set up again after the finalize).
static double g_enable_ms[2], g_configure_ms[2], g_start_ms[2], g_stop_ms[2], g_read_ms[2], g_disable_ms[2], g_finalize_ms[2];
static int g_cycle;
static int g_configure;  // 0: enable only; 1: configured continuous; 2: with start/stop control
static size_t g_hw_mib;  // the hardware buffer (0: CUPTI's default, 512 MiB)
static unsigned g_worker_ms;  // CUPTI's worker thread's sleep (0: its default, 100 ms)
static unsigned long long g_samples[2];
static CUpti_PCSamplingData g_data;

static double lap(double *t) {
  double n = now_s(), d = (n - *t) * 1e3;
  *t = n;
  return d;
}

// 1: enable (configure, start); 2: (stop, read,) disable and finalize; each call timed.
static void pc_enable_disable(int what) {
  double t = now_s();
  int c = g_cycle;
  if (what == 1) {
    CUpti_PCSamplingEnableParams ep = {CUpti_PCSamplingEnableParamsSize};
    ep.ctx = g_ctx;
    CK(cuptiPCSamplingEnable(&ep));
    g_enable_ms[c] = lap(&t);
    if (g_configure) {
      configure_pc(g_ctx, 15, g_configure == 2, &g_data, g_hw_mib, g_worker_ms);
      g_configure_ms[c] = lap(&t);
    }
    if (g_configure == 2) {
      CUpti_PCSamplingStartParams sp = {CUpti_PCSamplingStartParamsSize};
      sp.ctx = g_ctx;
      CK(cuptiPCSamplingStart(&sp));
      g_start_ms[c] = lap(&t);
    }
  } else {
    if (g_configure == 2) {
      CUpti_PCSamplingStopParams sp = {CUpti_PCSamplingStopParamsSize};
      sp.ctx = g_ctx;
      CK(cuptiPCSamplingStop(&sp));
      g_stop_ms[c] = lap(&t);
    }
    if (g_configure) {
      g_samples[c] = read_pc(g_ctx, &g_data);
      g_read_ms[c] = lap(&t);
    }
    CUpti_PCSamplingDisableParams dp = {CUpti_PCSamplingDisableParamsSize};
    dp.ctx = g_ctx;
    CK(cuptiPCSamplingDisable(&dp));
    g_disable_ms[c] = lap(&t);
    CK(cuptiFinalize());
    g_finalize_ms[c] = lap(&t);
    g_cycle = 1;
  }
}

static void *side(void *) {
  CK(cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS ? CUPTI_SUCCESS : CUPTI_ERROR_UNKNOWN);
  for (int done = 0; done < 4;) {
    if (g_phase >= done + 1) pc_enable_disable(done++ % 2 + 1);
    else usleep(100);
  }
  return NULL;
}

// N launches, a synchronization every 100; PC sampling enabled at 20 % and 60 %, disabled (and
// CUPTI finalized) at 40 % and 80 %, inline or by the side thread.
static void loop_mode(const char *mode, long n, float *x) {
  CUpti_SubscriberHandle sub;
  CK(cuptiSubscribe(&sub, on_cb, NULL));
  CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020));
  cuCtxGetCurrent(&g_ctx);
  warm(x);
  int sided = !strcmp(mode, "loopside"), inline_ = !sided && strcmp(mode, "loopoff");
  g_configure = !strncmp(mode, "loopcont", 8) ? 1 : !strncmp(mode, "loopss", 6) ? 2 : 0;
  g_hw_mib = g_configure == 1 ? atoi(mode + 8) : g_configure == 2 ? atoi(mode + 6) : 0;
  g_worker_ms = g_configure && strchr(mode, 'w') ? 5 : 0;
  pthread_t th;
  if (sided) pthread_create(&th, NULL, side, NULL);
  double max_chunk = 0, c = now_s(), t0 = c;
  for (long i = 0; i < n; i++) {
    axpb<<<4, 256>>>(x);
    if (i % 100 == 99) {
      cudaDeviceSynchronize();
      int what = (i + 1) % (n / 5) == 0 && i + 1 < n ? (int)((i + 1) / (n / 5)) : 0;
      if (what && inline_) pc_enable_disable((what - 1) % 2 + 1);
      if (what && sided) g_phase = what;
      double t = now_s();
      if (t - c > max_chunk) max_chunk = t - c;
      c = t;
    }
  }
  cudaDeviceSynchronize();
  double secs = now_s() - t0;
  if (sided) pthread_join(th, NULL);
  printf("FLOOR mode=%s n=%ld us_per_launch=%.3f samples=%llu max_chunk_ms=%.2f", mode, n, secs / n * 1e6,
         g_samples[0] + g_samples[1], max_chunk * 1e3);
  for (int c = 0; c < 2; c++)
    printf(" enable%d_ms=%.2f configure%d_ms=%.2f start%d_ms=%.2f stop%d_ms=%.2f read%d_ms=%.2f disable%d_ms=%.2f "
           "finalize%d_ms=%.2f",
           c, g_enable_ms[c], c, g_configure_ms[c], c, g_start_ms[c], c, g_stop_ms[c], c, g_read_ms[c], c,
           g_disable_ms[c], c, g_finalize_ms[c]);
  printf("\n");
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "off";
  long n = argc > 2 ? atol(argv[2]) : 200000;
  float *x;
  cudaMalloc(&x, 1024 * sizeof(float));
  CUcontext ctx;
  cuCtxGetCurrent(&ctx);
  warm(x);
  if (!strncmp(mode, "loop", 4)) {
    loop_mode(mode, n, x);
    return 0;
  }

  CUpti_PCSamplingData data;
  memset(&data, 0, sizeof data);
  int sampling = 0;
  double enable_ms = 0, disable_ms = 0, finalize_ms = 0, reenable_ms = 0;
  if (!strncmp(mode, "endis", 5)) {
    CUpti_PCSamplingEnableParams ep = {CUpti_PCSamplingEnableParamsSize};
    ep.ctx = ctx;
    double t = now_s();
    CK(cuptiPCSamplingEnable(&ep));
    enable_ms = (now_s() - t) * 1e3;
    warm(x);
    CUpti_PCSamplingDisableParams dp = {CUpti_PCSamplingDisableParamsSize};
    dp.ctx = ctx;
    t = now_s();
    CK(cuptiPCSamplingDisable(&dp));
    disable_ms = (now_s() - t) * 1e3;
    if (!strcmp(mode, "endisfin")) {
      t = now_s();
      CK(cuptiFinalize());
      finalize_ms = (now_s() - t) * 1e3;
    }
  } else if (!strcmp(mode, "cb") || !strcmp(mode, "cbfin")) {
    CUpti_SubscriberHandle sub;
    CK(cuptiSubscribe(&sub, on_cb, NULL));
    CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020));
    CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize));
    CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED));
    if (!strcmp(mode, "cbfin")) {
      warm(x);
      CK(cuptiUnsubscribe(sub));
      double t = now_s();
      CK(cuptiFinalize());
      finalize_ms = (now_s() - t) * 1e3;
    }
  } else if (!strcmp(mode, "enable") || mode[0] == 'p') {
    CUpti_PCSamplingEnableParams ep = {CUpti_PCSamplingEnableParamsSize};
    ep.ctx = ctx;
    CK(cuptiPCSamplingEnable(&ep));
    sampling = 1;
    if (mode[0] == 'p') configure_pc(ctx, atoi(mode + 1), 0, &data, 0, 0);
  }
  warm(x);

  double t0 = now_s();
  for (long i = 0; i < n; i++) axpb<<<4, 256>>>(x);
  cudaDeviceSynchronize();
  double secs = now_s() - t0;

  unsigned long long samples = sampling && data.pPcData ? read_pc(ctx, &data) : 0;
  if (sampling) {
    CUpti_PCSamplingDisableParams dp = {CUpti_PCSamplingDisableParamsSize};
    dp.ctx = ctx;
    CK(cuptiPCSamplingDisable(&dp));
  }
  if (!strcmp(mode, "endisfin")) {
    CUpti_PCSamplingEnableParams ep = {CUpti_PCSamplingEnableParamsSize};
    ep.ctx = ctx;
    double t = now_s();
    CK(cuptiPCSamplingEnable(&ep));
    reenable_ms = (now_s() - t) * 1e3;
    CUpti_PCSamplingDisableParams dp = {CUpti_PCSamplingDisableParamsSize};
    dp.ctx = ctx;
    CK(cuptiPCSamplingDisable(&dp));
  }
  printf("FLOOR mode=%s n=%ld us_per_launch=%.3f samples=%llu enable_ms=%.2f disable_ms=%.2f finalize_ms=%.2f "
         "reenable_ms=%.2f\n",
         mode, n, secs / n * 1e6, samples, enable_ms, disable_ms, finalize_ms, reenable_ms);
  return 0;
}
