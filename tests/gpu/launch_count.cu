// Launches the kernel `gpuprof_named_kernel` exactly M times, then exits with a chosen code.
// usage: launch_count M [exit_code] [sleep_ms_after_init]
// The sleep after CUDA initialisation gives the daemon time to start the trace: the injector
// says hello once cuInit has returned, and the daemon answers with start-trace asynchronously.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
__global__ void gpuprof_named_kernel(int *p, int i) { if (threadIdx.x == 0) p[blockIdx.x] += i; }
int main(int argc, char **argv) {
  int m = argc > 1 ? atoi(argv[1]) : 1000;
  int code = argc > 2 ? atoi(argv[2]) : 0;
  int sleep_ms = argc > 3 ? atoi(argv[3]) : 1500;
  int *d;
  if (cudaMalloc(&d, 4 * 64) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); return 99; }
  cudaMemset(d, 0, 4 * 64);
  cudaDeviceSynchronize();
  usleep(sleep_ms * 1000);
  for (int i = 0; i < m; i++) gpuprof_named_kernel<<<4, 32>>>(d, 1);
  cudaDeviceSynchronize();
  int h[4];
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  printf("LAUNCH_COUNT m=%d check=%d exit=%d\n", m, h[0], code);
  return h[0] == m ? code : 98;
}
