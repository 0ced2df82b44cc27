// A design probe, not a kdkit backend: FlashAttention-2's orientation (query rows on the MMA's M
// dimension, 16 a warp) for the many-row shapes of deep trees, fitted to sm_120 by splitting the
// head dims over a pair of warps. It computes real split-KV partials (checked against float64 by
// pair_step.py) for the simplest case only: the unified layout with every KV column visible (no
// mask, no causal rule, no logit cap), int32 indices.
//
// Why: mla_tc.cu holds 40 query rows a block (Q 90 and O 80 registers a thread) and runs each
// 32-row KV step as three phases between block barriers: QK, the softmax, PV. Its MMA chain alone
// (the `mma-only` knockout) runs at about half the mma.sync rate, and the softmax and copies sit
// beside idle tensor pipes (benchmarks/LOG.md). Here a block holds 64 rows and a step has one
// block barrier:
//   warp w = (row group r = w >> 1, half h = w & 1); the pair (r, 0), (r, 1) holds query rows
//   16 r .. 16 r + 15 of the block.
//   QK:  the pair splits the 576 dims (18 k-steps each, 256 latent and 32 rope dims; Q as A
//        fragments in registers, 72 of them): each warp's partial S[16 x 32] (16 registers) crosses to its peer through shared
//        memory behind a 64-thread named barrier; both add the two (fp32 addition commutes, so
//        both hold the same bits) and run the same online softmax: no block barrier.
//   PV:  P stays in registers as the A fragments of O[16 x 256] += P[16 x 32] V[32 x 256], the
//        warp's half of the 512 output dims (128 registers); V^T through ldmatrix.trans of the
//        K tile's first 512 dims.
// Both products read their B operand through ldmatrix, one x4 per two MMAs (each warp its own
// rows), so a step reads ~7x the tile from shared memory: the design trades shared-memory
// traffic for fewer barriers and longer MMA runs per warp.
#include "../../kernel/cuda/kd_common.cuh"

using bf16 = __nv_bfloat16;

#define PS_D 576
#define PS_DL 512
#define PS_RG 4                        // row groups of 16 query rows
#define PS_NQ (16 * PS_RG)             // query rows per block (64)
#define PS_THREADS (64 * PS_RG)        // a warp pair per row group
#define PS_BN 32                       // KV rows per step
#define PS_ROWB (PS_D * 2)
#define PS_STAGE_BYTES (PS_BN * PS_ROWB)
#define PS_CHUNKS (PS_D / 8)           // 16-byte chunks per KV row
#define PS_QK_KS (PS_D / 16 / 2)       // QK k-steps per warp of a pair (18)
#define PS_PV_NT (PS_DL / 2 / 8)       // output n-tiles of 8 dims per warp (32)
#define PS_OFF_X (2 * PS_STAGE_BYTES)  // the partial scores' exchange: [warp][4 float4][lane]
#define PS_SMEM_BYTES (PS_OFF_X + 2 * PS_RG * 4 * 32 * 16)
#define PS_SPLIT_ALIGN 32              // split spans in multiples of 32 rows, as mla_tc.cu's
#define PS_MAX_SLACK 8.f               // a row's max moves when a score passes it by this (log2)
#define PS_M_FLOOR (-3.40282347e38f)

static_assert(PS_SMEM_BYTES <= 99 * 1024, "sm_120's 99 KB of shared memory per block");
static_assert(PS_THREADS == PS_BN * 8, "the loader: 8 threads a KV row of a step");
static_assert(PS_QK_KS * 16 * 2 == PS_D, "the pair's halves of the score dims are whole k-steps");

extern "C" __device__ int kd_meta_smem_bytes = PS_SMEM_BYTES;
extern "C" __device__ int kd_meta_threads = PS_THREADS;
extern "C" __device__ int kd_meta_rows = PS_NQ;

// byte offset of 16-byte chunk c of KV row r inside a tile: chunk c ^ (r & 7) (the 8 rows an
// ldmatrix reads at one logical chunk land in 8 bank groups)
__device__ __forceinline__ kd_u32 ps_tile_off(int r, int c) {
  return static_cast<kd_u32>(r * PS_ROWB + ((c ^ (r & 7)) << 4));
}
// a lane's swizzled byte offset of chunk cb + 2i in its ldmatrix row (row & 7 = r7): the low
// three bits of the chunk are XORed, the rest is 128 B a group of 8 chunks
__device__ __forceinline__ kd_u32 ps_chunk_off(int cb, int i, int r7) {
  const int c = cb + 2 * i;
  return static_cast<kd_u32>((((c >> 3) << 3) | ((c & 7) ^ r7)) << 4);
}
__device__ __forceinline__ void ps_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// 16-byte shared-memory store / load at a 32-bit shared address (a generic pointer holds two
// registers across the loop)
__device__ __forceinline__ void ps_st4(kd_u32 addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ float4 ps_ld4(kd_u32 addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ kd_u32 ps_pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const kd_u32*>(&v);
}

extern "C" __global__ void __launch_bounds__(PS_THREADS, 1)
pair_partial(const bf16* __restrict__ q, long long q_stride_tok, long long q_stride_head, const bf16* __restrict__ pool,
             long long pool_stride, const int* __restrict__ qo_indptr, const int* __restrict__ kv_indptr,
             const int* __restrict__ kv_indices, float* __restrict__ o_part, float* __restrict__ lse_part, int H,
             int nsplit, int total_rows, float sm_scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // MMA fragment coordinates
  const int rg = warp >> 1, half = warp & 1;
  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;

  const int qs = qo_indptr[b];
  const int rows = (qo_indptr[b + 1] - qs) * H;
  const int row0 = tile * PS_NQ;
  if (row0 >= rows) return;
  const int kv_start = kv_indptr[b];
  const int kv_len = kv_indptr[b + 1] - kv_start;
  const int span = kd::cdiv(kd::cdiv(kv_len, nsplit), PS_SPLIT_ALIGN) * PS_SPLIT_ALIGN;
  const int kv_begin = split * span;
  const int kv_end = min(kv_len, kv_begin + span);
  const int nsteps = kv_begin < kv_end ? kd::cdiv(kv_end - kv_begin, PS_BN) : 0;
  const float scale_log2 = sm_scale * KD_LOG2E;

  // ---- the loader: thread -> KV row tid >> 3 of a step, chunks (tid & 7) + 8 j; each pool
  // index fetched a step ahead of its copy (a step is long), each copy a step ahead of its use
  const kd_u32 s_ring = kd::smem_addr(smem);
  const int ld_row = tid >> 3, ld_c0 = tid & 7;
  const kd_u32 ld_dst = ps_tile_off(ld_row, ld_c0);
  auto fetch_index = [&](int k) -> int {
    const int pos = kv_begin + k * PS_BN + ld_row;
    return pos < kv_end ? kv_indices[kv_start + pos] : -1;  // (pos < kv_end: step k exists)
  };
  auto copy_step = [&](int k, int idx) {  // a row past kv_end is zero-filled (its scores are masked)
    const kd_u32 dst = s_ring + (k & 1) * PS_STAGE_BYTES + ld_dst;
    const bool valid = idx >= 0;
    const bf16* src = pool + (valid ? static_cast<kd_i64>(idx) * pool_stride : 0) + ld_c0 * 8;
#pragma unroll
    for (int j = 0; j < PS_CHUNKS / 8; ++j) kd::cp_async_16(dst + j * 128, src + j * 64, valid);
    kd::cp_async_commit();
  };
  if (nsteps > 0) copy_step(0, fetch_index(0));
  int idx1 = fetch_index(1);

  // ---- Q as A fragments of this warp's rows and half of the dims: qa[ks] = {Q[g][d + 2t, +1],
  // Q[g + 8][d + 2t, +1], Q[g][d + 8 + 2t, +1], Q[g + 8][d + 8 + 2t, +1]}; the half's dims are
  // d = 256 h + 16 ks (ks < 16: latent) and 512 + 32 h + 16 (ks - 16) (rope), so QK's and PV's
  // chunks share their swizzle offsets. Rows past the request's are zeros (scores 0, not written)
  kd_u32 qa[PS_QK_KS][4];
  {
    const int r_lo = row0 + 16 * rg + g, r_hi = r_lo + 8;
    const bool v_lo = r_lo < rows, v_hi = r_hi < rows;
    const int a_lo = v_lo ? r_lo : row0, a_hi = v_hi ? r_hi : row0;
    const bf16* q_lo = q + static_cast<kd_i64>(qs + a_lo / H) * q_stride_tok + static_cast<kd_i64>(a_lo % H) * q_stride_head + 2 * t;
    const bf16* q_hi = q + static_cast<kd_i64>(qs + a_hi / H) * q_stride_tok + static_cast<kd_i64>(a_hi % H) * q_stride_head + 2 * t;
#pragma unroll
    for (int ks = 0; ks < PS_QK_KS; ++ks) {
      const int d = ks < 16 ? (PS_DL / 2) * half + 16 * ks : PS_DL + 32 * half + 16 * (ks - 16);
      qa[ks][0] = v_lo ? *reinterpret_cast<const kd_u32*>(q_lo + d) : 0u;
      qa[ks][1] = v_hi ? *reinterpret_cast<const kd_u32*>(q_hi + d) : 0u;
      qa[ks][2] = v_lo ? *reinterpret_cast<const kd_u32*>(q_lo + d + 8) : 0u;
      qa[ks][3] = v_hi ? *reinterpret_cast<const kd_u32*>(q_hi + d + 8) : 0u;
    }
  }

  // ---- a lane's ldmatrix row and chunk: matrices (KV 0-7, chunk lo), (KV 0-7, hi), (KV 8-15, lo),
  // (KV 8-15, hi) of a 16-row slab; QK reads them as B fragments (K rows = n), PV through .trans
  // (V^T: KV rows = k)
  const int lrow = (lane & 7) + ((lane >> 4) << 3), lhi = (lane >> 3) & 1, r7 = lane & 7;
  const kd_u32 lane_row = lrow * PS_ROWB + (PS_DL / 2) * 2 * half;  // (+ the half's 256 dims: 32 chunks)
  // chunk 2 i (+1), i = 4 m + p, of the half lies at off[p] + 128 m (its low three bits are the
  // swizzled ones): four offsets serve QK's latent k-steps and PV's dims; the rope's two k-steps,
  // chunks 64 + 4 h + 2 j (+1), sit at rope[j] from the half's base
  kd_u32 off[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) off[p] = ps_chunk_off(lhi, p, r7);
  const kd_u32 rope[2] = {half ? PS_DL + off[2] : 2 * PS_DL + off[0], half ? PS_DL + off[3] : 2 * PS_DL + off[1]};
  float o[PS_PV_NT][4];  // O[g or g + 8][256 h + 8 j + 2 t, +1]
#pragma unroll
  for (int j = 0; j < PS_PV_NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {PS_M_FLOOR, PS_M_FLOOR}, l_run[2] = {0.f, 0.f};  // rows g, g + 8 (l: this lane's share)
  const kd_u32 x_mine = s_ring + PS_OFF_X + (warp * 4 * 32 + lane) * 16;  // [warp][nt][lane] float4
  const kd_u32 x_peer = half ? x_mine - 4 * 32 * 16 : x_mine + 4 * 32 * 16;  // the pair's other warp (warp ^ 1)

  for (int k = 0; k < nsteps; ++k) {
    // one block barrier a step: tile k landed for every thread, and every warp is done with
    // tile k - 1, whose slot takes tile k + 1 now
    kd::cp_async_wait<0>();
    __syncthreads();
    if (k + 1 < nsteps) copy_step(k + 1, idx1);
    idx1 = fetch_index(k + 2);
    const kd_u32 tile_s = s_ring + (k & 1) * PS_STAGE_BYTES + lane_row;

    // QK over this warp's half of the dims: s[nt] = S[g, g + 8][8 nt + 2t, +1], KV n-tile nt
    float s[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < PS_QK_KS; ++ks) {
      kd_u32 b0[4], b1[4];
      const kd_u32 o_ks = ks < 16 ? off[ks & 3] + 128 * (ks >> 2) : rope[ks - 16];
      kd::ldsm_x4(tile_s + o_ks, b0);                   // KV 0..15
      kd::ldsm_x4(tile_s + 16 * PS_ROWB + o_ks, b1);    // KV 16..31
      kd::mma_bf16(s[0], qa[ks], b0[0], b0[1]);
      kd::mma_bf16(s[1], qa[ks], b0[2], b0[3]);
      kd::mma_bf16(s[2], qa[ks], b1[0], b1[1]);
      kd::mma_bf16(s[3], qa[ks], b1[2], b1[3]);
    }
    // the pair's partial scores meet: both warps add the same two fp32 values
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) ps_st4(x_mine + nt * 32 * 16, s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
    ps_bar_sync(1 + rg, 64);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const float4 v = ps_ld4(x_peer + nt * 32 * 16);
      s[nt][0] += v.x; s[nt][1] += v.y; s[nt][2] += v.z; s[nt][3] += v.w;
    }
    // (the peer's next write is behind the next step's block barrier, after this read)

    // online softmax, log2 units; columns past kv_end (the split's last step) are -inf
    const int cols = kv_end - (kv_begin + k * PS_BN);
    float mx[2] = {-KD_INF, -KD_INF};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 8 * nt + 2 * t + (i & 1);
        s[nt][i] = col < cols ? s[nt][i] * scale_log2 : -KD_INF;
        mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the row's four lanes (a quad)
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    const bool mv0 = mx[0] > m_run[0] + PS_MAX_SLACK, mv1 = mx[1] > m_run[1] + PS_MAX_SLACK;
    if (__any_sync(0xffffffffu, mv0 || mv1)) {  // rare after the first step
      float a0 = 1.f, a1 = 1.f;
      if (mv0) { a0 = kd::fast_exp2(m_run[0] - mx[0]); m_run[0] = mx[0]; l_run[0] *= a0; }
      if (mv1) { a1 = kd::fast_exp2(m_run[1] - mx[1]); m_run[1] = mx[1]; l_run[1] *= a1; }
#pragma unroll
      for (int j = 0; j < PS_PV_NT; ++j) { o[j][0] *= a0; o[j][1] *= a0; o[j][2] *= a1; o[j][3] *= a1; }
    }
    kd_u32 pa[2][4];  // P as the A fragments of PV's two k-steps (KV 0..15, 16..31)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const float p0 = kd::fast_exp2(s[nt][0] - m_run[0]), p1 = kd::fast_exp2(s[nt][1] - m_run[0]);
      const float p2 = kd::fast_exp2(s[nt][2] - m_run[1]), p3 = kd::fast_exp2(s[nt][3] - m_run[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      pa[nt >> 1][(nt & 1) * 2] = ps_pack_bf16(p0, p1);
      pa[nt >> 1][(nt & 1) * 2 + 1] = ps_pack_bf16(p2, p3);
    }

    // PV: this warp's 256 output dims, 16 at a time (one ldmatrix.x4.trans: two n-tiles' B)
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int jp = 0; jp < PS_PV_NT / 2; ++jp) {
        kd_u32 bv[4];
        kd::ldsm_x4_trans(tile_s + kk * 16 * PS_ROWB + off[jp & 3] + 128 * (jp >> 2), bv);
        kd::mma_bf16(o[2 * jp], pa[kk], bv[0], bv[2]);
        kd::mma_bf16(o[2 * jp + 1], pa[kk], bv[1], bv[3]);
      }
    }
  }

  // ---- the split's partial rows, normalised, and their LSE (natural log); a row that saw nothing
  // (an empty split) gets zeros and -inf
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 16 * rg + g + 8 * r;
    if (row >= rows) continue;
    const kd_i64 grow = static_cast<kd_i64>(qs) * H + row;  // (token qs + row / H, head row % H)
    const float inv = l_run[r] > 0.f ? 1.f / l_run[r] : 0.f;
    float* dst = o_part + (static_cast<kd_i64>(split) * total_rows + grow) * PS_DL + (PS_DL / 2) * half + 2 * t;
#pragma unroll
    for (int j = 0; j < PS_PV_NT; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    if (half == 0 && t == 0)
      lse_part[static_cast<kd_i64>(split) * total_rows + grow] =
          l_run[r] > 0.f ? (m_run[r] + log2f(l_run[r])) * KD_LN2 : -KD_INF;
  }
}
