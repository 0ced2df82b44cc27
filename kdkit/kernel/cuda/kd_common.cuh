// Small device helpers of kdkit's kernels: fixed-width types, cp.async, ldmatrix, mma.sync, warp
// reductions. Everything here exists on sm_80, sm_89, sm_90 and sm_120: no wgmma, TMA or tcgen05.
#pragma once
#include <cuda_bf16.h>

// NVRTC has no libc headers: fixed-width names of our own
typedef int kd_i32;
typedef long long kd_i64;
typedef unsigned char kd_u8;
typedef unsigned int kd_u32;
#define KD_INF __int_as_float(0x7f800000)
#define KD_LOG2E 1.4426950408889634f
#define KD_LN2 0.6931471805599453f

namespace kd {

__host__ __device__ __forceinline__ int cdiv(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ kd_u32 smem_addr(const void* p) {
  return static_cast<kd_u32>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src-size 0 zero-fills the destination and reads nothing
__device__ __forceinline__ void cp_async_16(kd_u32 dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// A 4- or 8-byte global load issued where it is written. A plain load's issue may be moved past a
// branch (an early return) to its first use, and ptxas does so; a relaxed (memory-model) load may
// not be dropped from the path that returns, so loads meant to be in flight together are. CTA
// scope: the data is read-only here, and the load may still hit L1 (a volatile one, system scope,
// always went to L2)
template <typename T>
__device__ __forceinline__ T ld_now(const T* ptr) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "ld_now loads 4 or 8 bytes");
  T v;
  if constexpr (sizeof(T) == 4) {
    kd_u32 x;
    asm volatile("ld.relaxed.cta.global.b32 %0, [%1];\n" : "=r"(x) : "l"(ptr));
    memcpy(&v, &x, 4);
  } else {
    unsigned long long x;
    asm volatile("ld.relaxed.cta.global.b64 %0, [%1];\n" : "=l"(x) : "l"(ptr));
    memcpy(&v, &x, 8);
  }
  return v;
}

// a counter other blocks of the grid increment: acquire at GPU scope, so what they wrote before
// counting in is visible after this load sees their count (the fused merge's wait)
__device__ __forceinline__ unsigned long long ld_acquire_u64(const unsigned long long* ptr) {
  unsigned long long x;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(x) : "l"(ptr) : "memory");
  return x;
}

// four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i
__device__ __forceinline__ void ldsm_x4(kd_u32 addr, kd_u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(kd_u32 addr, kd_u32 (&r)[2]) {  // lanes 0..15 give the addresses
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(kd_u32 addr, kd_u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D (16x8 fp32) += A (16x16 bf16, row-major) * B (16x8 bf16, column-major). Not volatile: a pure
// function of its registers, so the compiler may schedule it among the loads that feed it
__device__ __forceinline__ void mma_bf16(float (&d)[4], const kd_u32 (&a)[4], kd_u32 b0, kd_u32 b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x with the SFU's approximation (~2 ulp; 2^-inf = +0): the softmax's exponent
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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

// byte offset of 16-byte chunk c of row r in a tile of `row_bytes`-byte rows, XOR-swizzled by
// r & 7 (the 8 rows an ldmatrix reads at one logical chunk land in 8 bank groups)
__device__ __forceinline__ kd_u32 swz_off(int r, int c, int row_bytes) {
  return static_cast<kd_u32>(r * row_bytes + ((c ^ (r & 7)) << 4));
}
// a lane's byte offset, within its ldmatrix row, of chunk cb + 2 i, the reader taking the row's
// swizzle as r7: the chunk's low three bits are XORed, the rest is 128 B a group of 8 chunks
__device__ __forceinline__ kd_u32 chunk_off(int cb, int i, int r7) {
  const int c = cb + 2 * i;
  return static_cast<kd_u32>((((c >> 3) << 3) | ((c & 7) ^ r7)) << 4);
}
// a named barrier of n threads (id 0 is __syncthreads')
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// 16-byte shared-memory store / load at a 32-bit shared address (a generic pointer would hold two
// registers across a loop)
__device__ __forceinline__ void st_shared4(kd_u32 addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ float4 ld_shared4(kd_u32 addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
// two floats rounded to bf16 and packed (lo in the low half): an MMA operand register
__device__ __forceinline__ kd_u32 pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const kd_u32*>(&v);
}

}  // namespace kd
