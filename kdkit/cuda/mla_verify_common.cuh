// Compile-time configuration and small device helpers of kdkit's MLA tree-verify kernel.
// Every KD_* macro below is set by kdkit/jit.py from the module key; the defaults are the
// production configuration. Nothing here may use wgmma / TMA / tcgen05: the target is sm_120.
#pragma once
#include <cuda_bf16.h>
// NVRTC has no libc headers: fixed-width names of our own
typedef int kd_i32;
typedef long long kd_i64;
typedef unsigned char kd_u8;
#define KD_INF __int_as_float(0x7f800000)

#ifndef KD_ROWS          // (query token, head) rows per block
#define KD_ROWS 16
#endif
#ifndef KD_BLOCK_N       // KV rows per shared-memory chunk
#define KD_BLOCK_N 32
#endif
#ifndef KD_VARIANT       // 0 = correct; 1..3 = deliberately wrong negative controls (see below)
#define KD_VARIANT 0
#endif
// index array element types (SGLang mixes int32 and int64 between arrays)
#ifndef KD_QO_T
#define KD_QO_T kd_i32
#endif
#ifndef KD_KVP_T
#define KD_KVP_T kd_i32
#endif
#ifndef KD_KVI_T
#define KD_KVI_T kd_i32
#endif
#ifndef KD_MIP_T
#define KD_MIP_T kd_i64
#endif
#ifndef KD_PFX_T
#define KD_PFX_T kd_i64
#endif

#define KD_DL 512                      // latent (nope-absorbed) dims: also the value dims
#define KD_DR 64                       // rope dims
#define KD_D (KD_DL + KD_DR)           // 576: score dims
#define KD_THREADS 128
#define KD_WARPS (KD_THREADS / 32)
#define KD_ROWS_PER_WARP (KD_ROWS / KD_WARPS)
#define KD_PAD 8                       // +16 B per smem row: consecutive rows start 4 banks apart
#define KD_LD (KD_D + KD_PAD)          // smem row pitch in bf16 elements
#define KD_VEC 8                       // bf16 per 128-bit load
#define KD_DV_PER_THREAD (KD_DL / KD_THREADS)

// dynamic shared memory layout, in bytes
#define KD_SMEM_Q (KD_ROWS * KD_LD * 2)
#define KD_SMEM_K (2 * KD_BLOCK_N * KD_LD * 2)   // double-buffered KV chunk
#define KD_SMEM_P (KD_ROWS * KD_BLOCK_N * 4)
#define KD_SMEM_ROW (3 * KD_ROWS * 4)            // per-row rescale, running max, running sum
#define KD_SMEM_BYTES (KD_SMEM_Q + KD_SMEM_K + KD_SMEM_P + KD_SMEM_ROW)

// sm_120 (RTX PRO 6000 / RTX 5090) allows 99 KB of shared memory per block
static_assert(KD_SMEM_BYTES <= 99 * 1024, "shared memory per block exceeds sm_120's 99 KB");
static_assert(KD_ROWS % KD_WARPS == 0, "rows must split evenly over the warps");
static_assert(KD_BLOCK_N == 32, "the score phase maps one KV row of a chunk to each lane");
static_assert(KD_DL % (KD_THREADS * 4) == 0, "each thread owns 4 value dims");

namespace kd {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  // cp.async with src-size 0 zero-fills the destination: rows past the chunk's end read nothing
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// 8 bf16 (one 128-bit word) dotted with 8 bf16, accumulated in fp32
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 fx = __bfloat1622float2(x[i]);
    float2 fy = __bfloat1622float2(y[i]);
    acc = fmaf(fx.x, fy.x, acc);
    acc = fmaf(fx.y, fy.y, acc);
  }
  return acc;
}

__host__ __device__ __forceinline__ int cdiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace kd
