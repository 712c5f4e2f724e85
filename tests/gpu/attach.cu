// Late attach and external correlation, for a trace started while the process already runs.
// usage: attach READY_FILE GO_FILE N [DELAY_MS]
// Before the trace: creates a non-blocking stream, launches `gpuprof_warmup_kernel` on it and on
// the default stream, then writes READY_FILE and waits (up to 60 s) for GO_FILE. After GO_FILE:
// N launches of `gpuprof_ext_kernel` on the stream, each inside an external correlation id
// 5000+i of kind CUSTOM0 (pushed and popped the way a framework tags its ops), and N launches
// of `gpuprof_default_kernel` on the default stream without one. Exits 0 when all ran.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cupti.h>
__global__ void gpuprof_warmup_kernel(int *p) { if (threadIdx.x == 0) atomicAdd(&p[blockIdx.x], 1); }
__global__ void gpuprof_ext_kernel(int *p) { if (threadIdx.x == 0) atomicAdd(&p[blockIdx.x], 1); }
__global__ void gpuprof_default_kernel(int *p) { if (threadIdx.x == 0) atomicAdd(&p[4 + blockIdx.x], 1); }
int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: attach READY GO N\n"); return 2; }
  int n = atoi(argv[3]);
  int delay_ms = argc > 4 ? atoi(argv[4]) : 0;
  int *d;
  cudaStream_t s;
  if (cudaMalloc(&d, 4 * 8) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); return 99; }
  cudaMemset(d, 0, 4 * 8);
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 10; i++) { gpuprof_warmup_kernel<<<4, 32, 0, s>>>(d); gpuprof_warmup_kernel<<<4, 32>>>(d); }
  cudaDeviceSynchronize();
  FILE *f = fopen(argv[1], "w"); if (f) { fputs("ready\n", f); fclose(f); }
  int waited = 0;
  while (access(argv[2], F_OK) != 0) { usleep(10000); if (++waited > 6000) { fprintf(stderr, "no GO\n"); return 97; } }
  usleep(delay_ms * 1000);
  int pushed = 0;
  for (int i = 0; i < n; i++) {
    if (cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 5000 + i) == CUPTI_SUCCESS) pushed++;
    gpuprof_ext_kernel<<<4, 32, 0, s>>>(d);
    uint64_t id = 0;
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id);
    gpuprof_default_kernel<<<4, 32>>>(d);
  }
  cudaDeviceSynchronize();
  int h[8];
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  printf("ATTACH n=%d pushed=%d ext=%d default=%d\n", n, pushed, h[0] - 10 - 10, h[4]);
  return (h[0] == 20 + n && h[4] == n) ? 0 : 98;
}
