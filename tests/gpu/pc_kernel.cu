// A CUDA C workload for PC sampling, built with -lineinfo: two kernels with different stalls,
// launched for a number of seconds. `gather` waits on dependent global loads (long
// scoreboard); `fma_chain` on a chain of dependent math.
// usage: pc_kernel SECONDS [sleep_ms_after_init]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

__global__ void gather(const int *next, float *out, int steps) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int j = i;
  float acc = 0.f;
  for (int s = 0; s < steps; s++) {
    j = next[j];  // a load that depends on the previous one
    acc += (float)(j & 7);
  }
  out[i] = acc;
}

__global__ void fma_chain(float *out, int steps) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float x = (float)i * 1e-6f, y = 1.0001f;
  for (int s = 0; s < steps; s++) {
    x = fmaf(x, y, 0.5f);  // each depends on the last
    y = fmaf(y, x, -0.25f);
  }
  out[i] = x + y;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 5.0;
  int sleep_ms = argc > 2 ? atoi(argv[2]) : 0;
  const int n = 1 << 22;
  int *next;
  float *out;
  if (cudaMalloc(&next, n * sizeof(int)) != cudaSuccess || cudaMalloc(&out, n * sizeof(float)) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc failed\n");
    return 99;
  }
  int *h = (int *)malloc(n * sizeof(int));
  unsigned r = 12345;
  for (int i = 0; i < n; i++) {
    r = r * 1103515245u + 12345u;
    h[i] = (int)(r % n);
  }
  cudaMemcpy(next, h, n * sizeof(int), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  usleep(sleep_ms * 1000);
  auto t0 = std::chrono::steady_clock::now();
  long launches = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    gather<<<n / 256, 256>>>(next, out, 64);
    fma_chain<<<n / 256, 256>>>(out, 256);
    launches += 2;
    if (launches % 64 == 0) cudaDeviceSynchronize();
  }
  cudaDeviceSynchronize();
  printf("PC_KERNEL launches=%ld seconds=%.1f\n", launches, seconds);
  return cudaGetLastError() == cudaSuccess ? 0 : 97;
}
