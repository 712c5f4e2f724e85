// gpu-anchors/launch.cu with a pause before the timed loop (argv[2], ms), so a trace started
// asynchronously after the injector's hello covers the whole timed loop in every mode.
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <unistd.h>
__global__ void tiny(float *p) { if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += 1.0f; }
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200000;
  int pause_ms = argc > 2 ? atoi(argv[2]) : 0;
  float *d; cudaMalloc(&d, 4); cudaMemset(d, 0, 4);
  for (int i = 0; i < 1000; i++) tiny<<<1, 32>>>(d);
  cudaDeviceSynchronize();
  usleep(pause_ms * 1000);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) tiny<<<1, 32>>>(d);
  cudaDeviceSynchronize();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float h; cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost);
  printf("LAUNCH n=%d secs=%.4f per_launch_us=%.3f check=%.0f\n", n, s, s / n * 1e6, h);
  return 0;
}
