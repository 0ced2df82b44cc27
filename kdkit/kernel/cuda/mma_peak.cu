// The rate of mma.sync.m16n8k16 bf16 -> fp32 with operands in registers: the tensor-core ceiling
// of kdkit's kernel (the instruction sm_120 has; wgmma is faster on sm_90 but sm_120 lacks it).
// Each warp runs KD_CHAINS independent accumulator chains so the pipeline never waits on a result.
#include "kd_common.cuh"

#define KD_CHAINS 8
#define KD_PEAK_THREADS 256
// what the host reads back (kdkit/bench.py): one source for the launch and the FLOP count
extern "C" __device__ int kd_meta_flops_per_iter_warp = KD_CHAINS * 2 * 16 * 8 * 16;
extern "C" __device__ int kd_meta_threads = KD_PEAK_THREADS;

extern "C" __global__ void __launch_bounds__(KD_PEAK_THREADS) kd_mma_peak(float* out, int iters) {
  const kd_u32 seed = threadIdx.x * 2654435761u;
  // small bf16 values (exponent bits kept low): the sums stay finite
  const kd_u32 a[4] = {seed & 0x3c003c00u, (seed >> 3) & 0x3c003c00u, (seed >> 7) & 0x3c003c00u,
                       (seed >> 11) & 0x3c003c00u};
  const kd_u32 b0 = (seed >> 5) & 0x3c003c00u, b1 = (seed >> 9) & 0x3c003c00u;
  float acc[KD_CHAINS][4];
#pragma unroll
  for (int c = 0; c < KD_CHAINS; ++c)
#pragma unroll
    for (int x = 0; x < 4; ++x) acc[c][x] = 0.f;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int c = 0; c < KD_CHAINS; ++c) kd::mma_bf16(acc[c], a, b0, b1);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < KD_CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;  // keeps the chains live
}
