// A design probe, not a kdkit backend: the KV step split between two warp roles, to measure what
// a warp-specialized step costs on a real GPU before the production kernel (kdkit/kernel/cuda/
// mla_tc.cu) is redesigned around it. It computes real split-KV partials (checked against torch by
// ws_step.py) but only for the simplest case: the unified layout with every KV column visible (no
// mask, no causal rule, no logit cap), 40 query rows per block (5 n-tiles), int32 indices.
//
// Why: in mla_tc.cu all 8 warps run QK, the softmax and PV in turn, with a block barrier between
// each; the tensor pipe idles through the softmax, the barriers and the copies (about half of a
// 2,900-cycle 32-row step at 1 x 128K, by ncu). Here:
//   S warps 0-3 (one a scheduler): the copies, QK over dim group w (9 k-steps of 16 of the 576
//     dims, Q in registers), the four partial scores met in shared memory, the online softmax; P
//     (bf16), each column's rescale and a "moved" flag per warp to one of two P buffers;
//   O warps 4-7 (one a scheduler): O^T[128 dims x 40 rows] each, rescaled and accumulated from P
//     and the tile's first 512 dims (V^T through ldmatrix.trans).
// The two roles meet only through named barriers, so PV of step k runs beside QK and the softmax
// of step k + 1 on every scheduler. Steps are 16 KV rows; the ring has 4 slots (72 KB): one read by
// QK, one by PV, two landing.
//   barrier 1 (128): the S warps among themselves (a tile landed; the partial scores written/read)
//   barriers 2, 3 (256): FULL[b] - the S warps' P buffer b is written; the O warps wait for it
//   barriers 4..7 (256): EMPTY[s] - the O warps are done with ring slot s and P buffer s & 1
// Every named barrier is completed once per step by the same 256 threads in the same order, and a
// role cannot lap the other on one id (the S warps wait on EMPTY of step k - 2 before they write P
// of step k or load step k + 2), so each barrier's generations pair up.
#include "../../kernel/cuda/kd_common.cuh"

using bf16 = __nv_bfloat16;

#define WS_D 576
#define WS_DL 512
#define WS_NT 5
#define WS_NQ 40
#define WS_BN 16
#define WS_SPLIT_ALIGN 32  // split spans in multiples of mla_tc.cu's 32-row step: the same splits
#ifndef WS_STAGES
#define WS_STAGES 4  // ring slots of 16 KV rows; WS_STAGES - 2 of them in flight
#endif
#define WS_AHEAD (WS_STAGES - 2)  // the copy of step k + WS_AHEAD is issued at step k
// timing-only knockouts (wrong results by design): 1 no KV copies in the loop, 2 no PV (ldmatrix,
// MMA), 3 no QK (ldmatrix, MMA), 4 no softmax arithmetic (P a constant)
#ifndef WS_KO
#define WS_KO 0
#endif
// pull step k + WS_AHEAD + WS_PF into L2 at step k (0: no prefetch): bytes in flight that take no
// shared memory
#ifndef WS_PF
#define WS_PF 0
#endif
// 1: a fence before the S warps' FULL arrival (bar.arrive orders their writes already; a fence
// also waits for the thread's loads in flight, the index fetch among them)
#ifndef WS_FENCE
#define WS_FENCE 1
#endif
// 1: the O warps copy the KV (step k + WS_STAGES into the slot PV(k) just freed) and an mbarrier
// per slot tells the S warps a tile has landed (cp.async.mbarrier.arrive: no thread waits for
// its copies), so the S warps' chain holds no copy issue and no wait_group
#ifndef WS_OCOPY
#define WS_OCOPY 0
#endif
#define WS_ROWB (WS_D * 2)
#define WS_STAGE_BYTES (WS_BN * WS_ROWB)
#define WS_KG 4
#define WS_KSTEPS (WS_D / 16 / WS_KG)
#define WS_CHUNKS (WS_D / 8)
#define WS_SPITCH 20  // partial scores [dg][col][key]: fragment stores hit banks 8t + g (no conflict)
#define WS_PPITCH 24  // P [col][key] bf16, 48-byte rows: ldmatrix rows in 8 distinct bank groups
#define WS_OPITCH (WS_DL + 4)
#define WS_MAX_SLACK 8.f
#define WS_M_FLOOR (-3.40282347e38f)

#define WS_OFF_S (WS_STAGES * WS_STAGE_BYTES)
#define WS_OFF_P (WS_OFF_S + WS_KG * WS_NQ * WS_SPITCH * 4)
#define WS_P_BYTES (WS_NQ * WS_PPITCH * 2)
#define WS_OFF_A (WS_OFF_P + 2 * WS_P_BYTES)
#define WS_OFF_MV (WS_OFF_A + 2 * WS_NQ * 4)
#define WS_OFF_MB (WS_OFF_MV + 2 * 4 * 4)
#define WS_SMEM_BYTES (WS_OFF_MB + WS_STAGES * 8)

#define WS_BAR_S 1
#define WS_BAR_FULL 2
#define WS_BAR_EMPTY 4
#define WS_BAR_O 15  // the O warps among themselves (WS_OCOPY: all are done reading a slot)

static_assert(WS_SMEM_BYTES <= 99 * 1024 || WS_STAGES > 4, "sm_120's 99 KB (a deeper ring is a sm_90-only experiment)");
static_assert(WS_BAR_EMPTY + WS_STAGES <= WS_BAR_O, "a named barrier id per ring slot");
static_assert(WS_NQ * WS_OPITCH * 4 <= WS_OFF_P, "the epilogue's O tile fits below the P buffers");
static_assert(WS_STAGE_BYTES + WS_NQ * WS_ROWB <= WS_OFF_S, "Q is staged in ring slots 1..3");

extern "C" __device__ int kd_meta_smem_bytes = WS_SMEM_BYTES;
extern "C" __device__ int kd_meta_threads = 256;
extern "C" __device__ int kd_meta_rows = WS_NQ;

// a step's ring slot (a mask for a power-of-two ring: no signed remainder in the loop)
__device__ __forceinline__ int ws_slot(int k) {
  return (WS_STAGES & (WS_STAGES - 1)) == 0 ? (k & (WS_STAGES - 1)) : k % WS_STAGES;
}
__device__ __forceinline__ kd_u32 ws_tile_off(int r, int c) {
  return static_cast<kd_u32>(r * WS_ROWB + ((c ^ (r & 7)) << 4));
}
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_init(kd_u32 addr, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
// the mbarrier's next phase completes when this thread's cp.async issued so far have landed
__device__ __forceinline__ void mbar_track_copies(kd_u32 addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_wait(kd_u32 addr, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "WS_WAIT_%=:\n mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra WS_WAIT_%=;\n}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

extern "C" __global__ void __launch_bounds__(256, 1)
ws_partial(const bf16* __restrict__ q, long long q_stride_tok, long long q_stride_head, const bf16* __restrict__ pool,
           long long pool_stride, const int* __restrict__ qo_indptr, const int* __restrict__ kv_indptr,
           const int* __restrict__ kv_indices, float* __restrict__ o_part, float* __restrict__ lse_part, int H,
           int nsplit, int total_rows, float sm_scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;

  const int qs = qo_indptr[b];
  const int rows = (qo_indptr[b + 1] - qs) * H;
  const int row0 = tile * WS_NQ;
  if (row0 >= rows) return;
  const int nrows = min(WS_NQ, rows - row0);
  const int kv_start = kv_indptr[b];
  const int kv_len = kv_indptr[b + 1] - kv_start;
  const int span = kd::cdiv(kd::cdiv(kv_len, nsplit), WS_SPLIT_ALIGN) * WS_SPLIT_ALIGN;
  const int kv_begin = split * span;
  const int kv_end = min(kv_len, kv_begin + span);
  const int nsteps = kv_begin < kv_end ? kd::cdiv(kv_end - kv_begin, WS_BN) : 0;
  const float scale_log2 = sm_scale * KD_LOG2E;

  float* sS = reinterpret_cast<float*>(smem + WS_OFF_S);
  const kd_u32 s_ring = kd::smem_addr(smem);
  const kd_u32 s_p = kd::smem_addr(smem + WS_OFF_P);
  bf16* sP = reinterpret_cast<bf16*>(smem + WS_OFF_P);
  float* sAlpha = reinterpret_cast<float*>(smem + WS_OFF_A);
  int* sMoved = reinterpret_cast<int*>(smem + WS_OFF_MV);

  // the loader: one role's 128 threads (the S warps, or the O warps with WS_OCOPY), 8 a KV row,
  // chunks c0 + 8j (one address register, the swizzle permutes within groups of 8)
  const bool is_s = warp < 4;
  const bool loader = WS_OCOPY ? !is_s : is_s;
  const int ld_row = (tid >> 3) & (WS_BN - 1), ld_c0 = tid & 7;
  const kd_u32 ld_dst = ws_tile_off(ld_row, ld_c0);
  const kd_u32 s_mb = kd::smem_addr(smem + WS_OFF_MB);  // WS_OCOPY: slot s's mbarrier at s_mb + 8 s
  auto fetch_index = [&](int k) -> int {
    const int pos = kv_begin + k * WS_BN + ld_row;
    return (loader && k < nsteps && pos < kv_end) ? kv_indices[kv_start + pos] : -1;
  };
  auto prefetch_l2 = [&](int idx) {  // 9 lines of 128 B per KV row: lines ld_c0 and ld_c0 + 8
    if (idx < 0) return;
    const bf16* src = pool + static_cast<kd_i64>(idx) * pool_stride + ld_c0 * 64;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src));
    if (ld_c0 == 0) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src + 8 * 64));
  };
  auto copy_step = [&](int k, int idx) {
    const kd_u32 dst = s_ring + ws_slot(k) * WS_STAGE_BYTES + ld_dst;
    const bool valid = idx >= 0;
    const bf16* src = pool + (valid ? static_cast<kd_i64>(idx) * pool_stride : 0) + ld_c0 * 8;
#pragma unroll
    for (int j = 0; j < WS_CHUNKS / 8; ++j) kd::cp_async_16(dst + j * 128, src + j * 64, valid);
    if (WS_OCOPY) mbar_track_copies(s_mb + 8 * ws_slot(k)); else kd::cp_async_commit();
  };
  if (WS_OCOPY) {
    if (tid < WS_STAGES) mbar_init(s_mb + 8 * tid, 128);
    __syncthreads();
  }

  int idx_next = fetch_index(1), idx_after = fetch_index(2);
  const int idx0 = fetch_index(0);
  // Q (zero rows past nrows) into ring slots 1..3, then step 0 into slot 0
  const kd_u32 s_q = s_ring + WS_STAGE_BYTES;
  {
    constexpr int TPR = 256 / WS_NQ;
    const int qr = tid / TPR, sub = tid % TPR;
    if (qr < WS_NQ) {
      const bool valid = qr < nrows;
      const int r = row0 + (valid ? qr : 0);
      const bf16* qrow = q + static_cast<kd_i64>(qs + r / H) * q_stride_tok + static_cast<kd_i64>(r % H) * q_stride_head;
      for (int c = sub; c < WS_CHUNKS; c += TPR) kd::cp_async_16(s_q + ws_tile_off(qr, c), qrow + c * 8, valid);
    }
    kd::cp_async_commit();
  }
  if (WS_OCOPY) {  // step 0 uncommitted: the wait below is for Q only
    if (loader) copy_step(0, idx0);
    kd::cp_async_wait<0>();
  } else {
    if (is_s) copy_step(0, idx0); else kd::cp_async_commit();
    kd::cp_async_wait<1>();
  }
  __syncthreads();

  if (is_s) {
    // ================= S warps: copies, QK, softmax =================
    const int dg = warp;
    kd_u32 qf[WS_NT][WS_KSTEPS][2];
    {
      const int mi = lane >> 3;
#pragma unroll
      for (int nt = 0; nt < WS_NT; ++nt) {
        const int row = nt * 8 + (lane & 7);
#pragma unroll
        for (int ks = 0; ks + 1 < WS_KSTEPS; ks += 2) {
          kd_u32 r4[4];
          kd::ldsm_x4(s_q + ws_tile_off(row, 2 * (dg + WS_KG * (ks + (mi >> 1))) + (mi & 1)), r4);
          qf[nt][ks][0] = r4[0]; qf[nt][ks][1] = r4[1];
          qf[nt][ks + 1][0] = r4[2]; qf[nt][ks + 1][1] = r4[3];
        }
        constexpr int ks = WS_KSTEPS - 1;
        kd_u32 r2[2];
        kd::ldsm_x2(s_q + ws_tile_off(row, 2 * (dg + WS_KG * ks) + (mi & 1)), r2);
        qf[nt][ks][0] = r2[0]; qf[nt][ks][1] = r2[1];
      }
    }
    // every S warp holds its Q: steps 1.. may land over it
    if (WS_OCOPY) __syncthreads(); else bar_sync(WS_BAR_S, 128);
    // the S warps' loader fetches a step's index one step before its copy
    for (int k = 1; k < WS_AHEAD && !WS_OCOPY; ++k) {
      copy_step(k, idx_next);
      idx_next = k == 1 ? idx_after : fetch_index(k + 1);
    }
    int pf0 = -1, pf1 = -1;  // the indices of steps k + WS_AHEAD + WS_PF and one after
    if (WS_PF > 0) {
      for (int k = WS_AHEAD; k < WS_AHEAD + WS_PF; ++k) prefetch_l2(fetch_index(k));
      pf0 = fetch_index(WS_AHEAD + WS_PF);
      pf1 = fetch_index(WS_AHEAD + WS_PF + 1);
    }

    // softmax: half-warp h, lane & 15 = the step's KV row; columns w + 4h + 8j, j < 5
    const int key = lane & 15, hcol = warp + 4 * (lane >> 4);
    float m_run[WS_NT], l_run[WS_NT];
#pragma unroll
    for (int j = 0; j < WS_NT; ++j) { m_run[j] = WS_M_FLOOR; l_run[j] = 0.f; }
    const int lr = (lane & 7) + ((lane >> 3) & 1) * 8;
    const kd_u32 a_off = lr * WS_ROWB + ((((2 * dg + (lane >> 4)) ^ lr) & 7) << 4);

    for (int k = 0; k < nsteps; ++k) {
      if (WS_OCOPY) mbar_wait(s_mb + 8 * ws_slot(k), (k / WS_STAGES) & 1);  // step k landed
      else kd::cp_async_wait<WS_AHEAD - 1>();  // this thread's copies of step k landed (later ones may fly)
      bar_sync(WS_BAR_S, 128);  // ... every S thread's; and softmax(k - 1) is done reading sS
      // PV(k - 2) done: its P buffer, and its slot, that of step k + WS_AHEAD
      if (k >= 2) bar_sync(WS_BAR_EMPTY + ws_slot(k - 2), 256);
      if (WS_OCOPY) {
      } else if (k + WS_AHEAD < nsteps && WS_KO != 1) {
        copy_step(k + WS_AHEAD, idx_next);
        idx_next = fetch_index(k + WS_AHEAD + 1);
      } else {
        kd::cp_async_commit();
      }
      if (WS_PF > 0) {
        prefetch_l2(pf0);
        pf0 = pf1;
        pf1 = fetch_index(k + WS_AHEAD + WS_PF + 2);
      }
      // QK: S^T[16 x 40] over this warp's 9 k-steps
      const kd_u32 a_lane = s_ring + ws_slot(k) * WS_STAGE_BYTES + a_off;
      float s[WS_NT][4];
#pragma unroll
      for (int nt = 0; nt < WS_NT; ++nt)
#pragma unroll
        for (int x = 0; x < 4; ++x) s[nt][x] = 0.f;
      kd_u32 a[2][4];
      if (WS_KO != 3) kd::ldsm_x4(a_lane, a[0]);
#pragma unroll
      for (int ks = 0; ks < WS_KSTEPS && WS_KO != 3; ++ks) {
        if (ks + 1 < WS_KSTEPS) kd::ldsm_x4(a_lane + (ks + 1) * 128, a[(ks + 1) & 1]);
#pragma unroll
        for (int nt = 0; nt < WS_NT; ++nt) kd::mma_bf16(s[nt], a[ks & 1], qf[nt][ks][0], qf[nt][ks][1]);
      }
#pragma unroll
      for (int nt = 0; nt < WS_NT; ++nt) {
        float* d0 = sS + (dg * WS_NQ + nt * 8 + 2 * t) * WS_SPITCH + g;
        d0[0] = s[nt][0];
        d0[WS_SPITCH] = s[nt][1];
        d0[8] = s[nt][2];
        d0[WS_SPITCH + 8] = s[nt][3];
      }
      bar_sync(WS_BAR_S, 128);
      // online softmax (log2 units), the max moved only past a slack of 8: see mla_tc.cu
      const bool key_ok = kv_begin + k * WS_BN + key < kv_end;
      float x[WS_NT];
      bool moves = false;
#pragma unroll
      for (int j = 0; j < WS_NT; ++j) {
        const int col = hcol + 8 * j;
        const float* sc = sS + col * WS_SPITCH + key;
        const float v = (sc[0] + sc[WS_NQ * WS_SPITCH]) + (sc[2 * WS_NQ * WS_SPITCH] + sc[3 * WS_NQ * WS_SPITCH]);
        x[j] = key_ok && col < nrows ? v * scale_log2 : -KD_INF;
        if (WS_KO == 4) x[j] = 0.f;
        moves |= x[j] > m_run[j] + WS_MAX_SLACK;
      }
      float alpha[WS_NT];
#pragma unroll
      for (int j = 0; j < WS_NT; ++j) alpha[j] = 1.f;
      const bool warp_moved = WS_KO != 4 && __any_sync(0xffffffffu, moves);
      if (warp_moved) {
#pragma unroll
        for (int j = 0; j < WS_NT; ++j) {
          if (__any_sync(0xffffffffu, x[j] > m_run[j] + WS_MAX_SLACK)) {
            float hm = x[j];
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) hm = fmaxf(hm, __shfl_xor_sync(0xffffffffu, hm, o));
            const float m_new = fmaxf(m_run[j], hm);
            alpha[j] = kd::fast_exp2(m_run[j] - m_new);
            l_run[j] *= alpha[j];
            m_run[j] = m_new;
          }
        }
      }
      const int pb = k & 1;
#pragma unroll
      for (int j = 0; j < WS_NT; ++j) {
        const int col = hcol + 8 * j;
        const float pj = WS_KO == 4 ? 0.01f : kd::fast_exp2(x[j] - m_run[j]);
        l_run[j] += pj;
        sP[pb * (WS_NQ * WS_PPITCH) + col * WS_PPITCH + key] = __float2bfloat16(pj);
        if (key == 0) sAlpha[pb * WS_NQ + col] = alpha[j];
      }
      if (lane == 0) sMoved[pb * 4 + warp] = warp_moved;
      if (WS_FENCE) __threadfence_block();
      bar_arrive(WS_BAR_FULL + pb, 256);
    }
    // pair the O warps' last two EMPTY arrivals
    for (int k = max(nsteps - 2, 0); k < nsteps; ++k) bar_sync(WS_BAR_EMPTY + ws_slot(k), 256);
    kd::cp_async_wait<0>();
    __syncthreads();  // (A) every PV is done: the ring is free
    __syncthreads();  // (B) the O warps' fragments are in sO
    // row statistics to the P area (free now)
    float* sM = reinterpret_cast<float*>(smem + WS_OFF_P);
    float* sL = sM + WS_NQ;
#pragma unroll
    for (int j = 0; j < WS_NT; ++j) {
      float l = l_run[j];
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
      if (key == 0) { sM[hcol + 8 * j] = m_run[j]; sL[hcol + 8 * j] = l; }
    }
  } else {
    // ================= O warps: PV =================
    const int ow = warp - 4;
    float o[8][WS_NT][4];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
      for (int nt = 0; nt < WS_NT; ++nt)
#pragma unroll
        for (int x = 0; x < 4; ++x) o[mt][nt][x] = 0.f;
    const int vr0 = (lane & 7) + (lane >> 4) * 8, vhi = (lane >> 3) & 1;
    kd_u32 v_off[8];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      const int vc = ow * 16 + 2 * mt + vhi;
      v_off[mt] = vr0 * WS_ROWB + (((vc & ~7) | ((vc ^ vr0) & 7)) << 4);
    }
    const kd_u32 p_off = ((lane & 7) * WS_PPITCH + ((lane >> 3) & 1) * 8) * 2;
    if (WS_OCOPY) {
      __syncthreads();  // the S warps hold Q: steps 1.. may land over it
      for (int k = 1; k < WS_STAGES; ++k) {
        copy_step(k, idx_next);
        idx_next = idx_after;
        idx_after = fetch_index(k + 2);
      }
    }
    for (int k = 0; k < nsteps; ++k) {
      const int pb = k & 1;
      bar_sync(WS_BAR_FULL + pb, 256);
      const int4 mv = *reinterpret_cast<const int4*>(sMoved + pb * 4);
      if (mv.x | mv.y | mv.z | mv.w) {
#pragma unroll
        for (int nt = 0; nt < WS_NT; ++nt) {
          const float2 al = *reinterpret_cast<const float2*>(sAlpha + pb * WS_NQ + nt * 8 + 2 * t);
#pragma unroll
          for (int mt = 0; mt < 8; ++mt) {
            o[mt][nt][0] *= al.x; o[mt][nt][1] *= al.y;
            o[mt][nt][2] *= al.x; o[mt][nt][3] *= al.y;
          }
        }
      }
      kd_u32 pf[WS_NT][2];
#pragma unroll
      for (int nt = 0; nt < WS_NT; ++nt) kd::ldsm_x2(s_p + pb * WS_P_BYTES + nt * 8 * WS_PPITCH * 2 + p_off, pf[nt]);
      const kd_u32 s_tile = s_ring + ws_slot(k) * WS_STAGE_BYTES;
#pragma unroll
      for (int mt = 0; mt < 8 && WS_KO != 2; ++mt) {
        kd_u32 a[4];
        kd::ldsm_x4_trans(s_tile + v_off[mt], a);
#pragma unroll
        for (int nt = 0; nt < WS_NT; ++nt) kd::mma_bf16(o[mt][nt], a, pf[nt][0], pf[nt][1]);
      }
      bar_arrive(WS_BAR_EMPTY + ws_slot(k), 256);
      if (WS_OCOPY && k + WS_STAGES < nsteps && WS_KO != 1) {
        bar_sync(WS_BAR_O, 128);  // every O warp is done reading slot k
        copy_step(k + WS_STAGES, idx_next);
        idx_next = idx_after;
        idx_after = fetch_index(k + WS_STAGES + 2);
      }
    }
    __syncthreads();  // (A)
    float* sO = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int nt = 0; nt < WS_NT; ++nt)
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        float* d0 = sO + (nt * 8 + 2 * t) * WS_OPITCH + ow * 128 + mt * 16 + g;
        d0[0] = o[mt][nt][0];
        d0[WS_OPITCH] = o[mt][nt][1];
        d0[8] = o[mt][nt][2];
        d0[WS_OPITCH + 8] = o[mt][nt][3];
      }
    __syncthreads();  // (B)
  }
  __syncthreads();  // (C) the row statistics
  // epilogue: whole rows of the split's fp32 partial, normalised, and the rows' LSE (natural log)
  const float* sO = reinterpret_cast<const float*>(smem);
  const float* sM = reinterpret_cast<const float*>(smem + WS_OFF_P);
  const float* sL = sM + WS_NQ;
  const int d = (tid & 127) * 4;
  for (int qr = tid >> 7; qr < nrows; qr += 2) {
    const float l = sL[qr], inv = l > 0.f ? 1.f / l : 0.f;
    const float4 v = *reinterpret_cast<const float4*>(sO + qr * WS_OPITCH + d);
    const int r = row0 + qr;
    const kd_i64 grow = static_cast<kd_i64>(qs + r / H) * H + r % H;
    *reinterpret_cast<float4*>(o_part + (static_cast<kd_i64>(split) * total_rows + grow) * WS_DL + d) =
        make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    if (d == 0) lse_part[static_cast<kd_i64>(split) * total_rows + grow] = l > 0.f ? (sM[qr] + log2f(l)) * KD_LN2 : -KD_INF;
  }
}
