// The 64-row build's partial kernel (KD_PAIR: spec.PAIR_NT, chosen by the plan for requests of many
// rows, deep trees over a long prefix), included by mla_tc.cu in place of its own partial kernel;
// the merge kernel and the argument (KdParams) are the same. FlashAttention-2's orientation: query
// rows on the MMA's M dimension, 16 a warp, fitted to sm_120 by splitting the head dims over a pair
// of warps (a probe measured the design first: benchmarks/LOG.md, "The 64-row build").
//   warp w = (row group rg = w >> 1, half h = w & 1); the pair (rg, 0), (rg, 1) holds the block's
//   rows 16 rg .. 16 rg + 15 (row r of a request: token r / H, head r % H).
//   QK:  S[16 x 32] of a step, the pair splitting the 576 dims: half h takes latent dims
//        256 h .. 256 h + 255 and rope dims 512 + 32 h .. + 31 (18 k-steps; Q as A fragments in
//        registers, 72 of them; K rows as B fragments through ldmatrix). The two partial scores
//        meet through shared memory behind a 64-thread named barrier and both warps add them
//        (fp32 addition commutes: both hold the same bits), so both run the same online softmax.
//   PV:  P stays in registers as the A fragments of O[16 x 256] += P[16 x 32] V[32 x 256], the
//        half's 256 output dims (128 registers); V^T is the tile's first 512 dims through
//        ldmatrix.trans (sglang layout: the draft rows' V copied over them first).
// One block barrier a step (the ring's; two more on the steps where the sglang layout's draft V is
// copied in): a step is one warp's QK, exchange, softmax and PV in turn, no phase waits for the
// other row groups. Visibility, layouts, the logit cap, the split partials
// and every mutant hook are mla_tc.cu's, so the judge, the merge and the negative controls apply
// unchanged; so are the knockouts (kd_knockouts.cuh), with three of this build's own: the pair's
// exchange, the block barrier, the ldmatrix. No step skip (spec.KernelConfig refuses it with
// KD_PAIR); the fused merge, when asked for, is kd_fused.cuh's, at the end.
#pragma once

#define KD_BN 32                         // KV rows per step (the mutants' KV_LEN hooks read it)
#define KP_D (KD_DL + KD_DR)             // score dims (576)
#define KP_RG 4                          // row groups of 16 query rows
#define KP_NQ (16 * KP_RG)               // query rows per block (64)
#define KP_THREADS (64 * KP_RG)          // a warp pair per row group
#define KP_ROWB (KP_D * 2)
#define KP_STAGE_BYTES (KD_BN * KP_ROWB)
#define KP_CHUNKS (KP_D / 8)             // 16-byte chunks per KV row
#define KP_KS 18                         // QK k-steps per warp: 16 latent, 2 rope
#define KP_NTV (KD_DL / 2 / 8)           // output n-tiles of 8 dims per warp (32)
#define KP_OFF_X (2 * KP_STAGE_BYTES)    // the partial scores' exchange: [warp][n-tile][lane] float4
#define KP_SMEM_BYTES (KP_OFF_X + 2 * KP_RG * 4 * 32 * 16)
#ifndef KP_MAX_SLACK                     // (an experiment may set it: PlanOptions.extra_defines)
#define KP_MAX_SLACK 8.f                 // a row's max moves when a score passes it by this (log2 units)
#endif
#define KP_M_FLOOR (-3.40282347e38f)     // a row's max before any score (see mla_tc.cu's KD_M_FLOOR)

static_assert(KP_SMEM_BYTES <= KD_SMEM_LIMIT, "shared memory per block exceeds sm_120's 99 KB");
static_assert(KD_NT == 8 && KD_NH == 1 && KD_SKIP == 0,
              "the 64-row build: 8 n-tiles' rows, 8 warps, no step skip");
static_assert(KD_DL == 512 && KD_DR == 64, "each half: 16 latent and 2 rope k-steps, 256 output dims");
static_assert(KP_THREADS == KD_BN * 8, "the loader: 8 threads a KV row of a step");
static_assert(KD_MUT_V_DIM0 % 64 == 0 && KD_MUT_V_DIM0 + KD_DL <= KP_D, "V's window keeps the swizzle groups, in the row");

extern "C" __device__ int kd_meta_smem_bytes = KP_SMEM_BYTES;
extern "C" __device__ int kd_meta_threads = KP_THREADS;
extern "C" __device__ int kd_meta_rows = KP_NQ;
extern "C" __device__ int kd_meta_block_n = KD_BN;

extern "C" __global__ void __launch_bounds__(KP_THREADS, 1) kd_mla_tc_partial(const KdParams p) {
  if (KD_KO == KD_KO_ENTRY) return;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // MMA fragment coordinates
  const int rg = warp >> 1, half = warp & 1;
  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;

  const KD_QO_T* qo_indptr = static_cast<const KD_QO_T*>(p.qo_indptr);
  const KD_KVP_T* kv_indptr = static_cast<const KD_KVP_T*>(p.kv_indptr);
  const KD_KVI_T* kv_indices = static_cast<const KD_KVI_T*>(p.kv_indices);
  const bf16* pool = static_cast<const bf16*>(p.kv_buf);
  const int H = p.num_heads;
  const int qs = static_cast<int>(qo_indptr[b]);
  const int n = static_cast<int>(qo_indptr[b + 1]) - qs;  // draft tokens of this request
  const int rows = n * H;
  const int row0 = tile * p.rows_per_cta;
  if (row0 >= rows) return;  // the grid is sized for the longest request
  const int nrows = min(p.rows_per_cta, rows - row0);

  const kd_i64 kv_start = static_cast<kd_i64>(kv_indptr[b]);
  const int pool_len = static_cast<int>(kv_indptr[b + 1] - kv_indptr[b]);
  const int prefix = p.unified ? static_cast<int>(static_cast<const KD_PFX_T*>(p.prefix_lens)[b]) : pool_len;
  const int kv_len = KD_MUT_KV_LEN(p.unified ? pool_len : pool_len + n, prefix);
  const int span = kd::cdiv(kd::cdiv(kv_len, p.nsplit), KD_BN) * KD_BN;
  const int kv_begin = split * span;
  const int kv_end = min(kv_len, kv_begin + span);
  const kd_u8* mask = p.mask;
  const kd_i64 mask_base = mask ? static_cast<kd_i64>(static_cast<const KD_MIP_T*>(p.mask_indptr)[b]) : 0;
  // causal without a mask: no row of the block sees a column past prefix + its last token, so the
  // split's steps end there (the columns cut off are draft columns, hidden by the rule anyway);
  // with a mask the mask decides, as in mla_tc.cu
  const int kv_stop = !mask && p.causal ? min(kv_end, prefix + (row0 + nrows - 1) / H + 1) : kv_end;
  const int nsteps = kv_begin < kv_stop ? kd::cdiv(kv_stop - kv_begin, KD_BN) : 0;

  // ---- the loader: thread -> KV row tid >> 3 of a step, chunks (tid & 7) + 8 j; a pool index
  // fetched a step ahead of its copy (a step is long), each copy a step ahead of its use. A row
  // past the split's end is zero-filled (its scores are hidden below).
  const kd_u32 s_ring = kd::smem_addr(smem);
  const int ld_row = tid >> 3, ld_c0 = tid & 7;
  const kd_u32 ld_dst = kd::swz_off(ld_row, ld_c0, KP_ROWB);
  auto fetch_index = [&](int k) -> KD_KVI_T {
    const int pos = kv_begin + k * KD_BN + ld_row;
    return pos < kv_stop && pos < pool_len ? kv_indices[kv_start + pos] : static_cast<KD_KVI_T>(0);
  };
  auto copy_step = [&](int k, KD_KVI_T idx) {
    const int pos = kv_begin + k * KD_BN + ld_row;
    const bool valid = pos < kv_stop;
    const bf16* src = !valid ? pool
                      : pos < pool_len ? pool + static_cast<kd_i64>(idx) * p.kv_stride_row
                                       : static_cast<const bf16*>(p.k) + static_cast<kd_i64>(qs + pos - pool_len) * p.k_stride_tok;
    const kd_u32 dst = s_ring + (k & 1) * KP_STAGE_BYTES + ld_dst;
#pragma unroll
    for (int j = 0; j < KP_CHUNKS / 8; ++j) kd::cp_async_16(dst + j * 128, src + ld_c0 * 8 + j * 64, valid);
    kd::cp_async_commit();
  };
  if (nsteps > 0) copy_step(0, fetch_index(0));
  KD_KVI_T idx1 = fetch_index(1);

  // ---- this lane's two rows (g, g + 8 of the row group) and Q as A fragments of them over the
  // half's dims: qa[ks] = {Q[g][d + 2t, +1], Q[g + 8][d + 2t, +1], Q[g][d + 8 + 2t, +1],
  // Q[g + 8][d + 8 + 2t, +1]}, d = 256 h + 16 ks (ks < 16) or 512 + 32 h + 16 (ks - 16). A row
  // past the block's (another block's, or past the request) is zeros and is never written (on a
  // step inside the prefix its scores are 0; elsewhere it sees nothing).
  const int lr0 = 16 * rg + g;  // the lane's first row in the block; the second is lr0 + 8
  kd_u32 qa[KP_KS][4];
  {
    const bf16* qrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int rr = row0 + (lr0 + 8 * r < nrows ? lr0 + 8 * r : 0);
      qrow[r] = static_cast<const bf16*>(p.q) + static_cast<kd_i64>(qs + rr / H) * p.q_stride_tok +
                static_cast<kd_i64>(KD_MUT_HEAD(rr % H, H)) * p.q_stride_head + 2 * t;
    }
    const bool v0 = lr0 < nrows, v1 = lr0 + 8 < nrows;
#pragma unroll
    for (int ks = 0; ks < KP_KS; ++ks) {
      const int d = ks < 16 ? (KD_DL / 2) * half + 16 * ks : KD_DL + 32 * half + 16 * (ks - 16);
      qa[ks][0] = v0 ? *reinterpret_cast<const kd_u32*>(qrow[0] + d) : 0u;
      qa[ks][1] = v1 ? *reinterpret_cast<const kd_u32*>(qrow[1] + d) : 0u;
      qa[ks][2] = v0 ? *reinterpret_cast<const kd_u32*>(qrow[0] + d + 8) : 0u;
      qa[ks][3] = v1 ? *reinterpret_cast<const kd_u32*>(qrow[1] + d + 8) : 0u;
    }
  }

  // ---- a lane's ldmatrix row and chunks: matrices (KV 0-7, chunk lo), (KV 0-7, hi), (KV 8-15, lo),
  // (KV 8-15, hi) of a 16-row slab; QK reads them as B fragments (K rows = n), PV through .trans
  // (V^T: KV rows = k). Chunk 2 i (+1), i = 4 m + q, of the half lies at off[q] + 128 m from the
  // half's base (its low three bits are the swizzled ones): four offsets serve QK's latent k-steps
  // and PV's dims; the rope's k-steps, chunks 64 + 4 h + 2 j (+1), sit at rope[j]
  const int lrow = (lane & 7) + ((lane >> 4) << 3), lhi = (lane >> 3) & 1, r7 = KD_MUT_SWZ_READ(lrow);
  const kd_u32 lane_base = lrow * KP_ROWB + KD_DL * half;  // (+ the half's 256 latent dims: 512 B)
  kd_u32 off[4];
#pragma unroll
  for (int q4 = 0; q4 < 4; ++q4) off[q4] = kd::chunk_off(lhi, q4, r7);
  const kd_u32 rope[2] = {half ? KD_DL + off[2] : 2 * KD_DL + off[0], half ? KD_DL + off[3] : 2 * KD_DL + off[1]};

  float o[KP_NTV][4];  // O[g or g + 8][256 h + 8 j + 2 t, +1] (unnormalised)
#pragma unroll
  for (int j = 0; j < KP_NTV; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {KP_M_FLOOR, KP_M_FLOOR}, l_run[2] = {0.f, 0.f};  // rows lr0, lr0 + 8 (l: this lane's share)
  const kd_u32 x_mine = s_ring + KP_OFF_X + (warp * 4 * 32 + lane) * 16;
  const kd_u32 x_peer = half ? x_mine - 4 * 32 * 16 : x_mine + 4 * 32 * 16;  // the pair's other warp
  const float scale = KD_MUT_SCALE(p.sm_scale);
  const float scale_log2 = scale * KD_LOG2E;
  const float cap = p.logit_cap;

  for (int k = 0; KD_KO != KD_KO_LOOP && k < nsteps; ++k) {
    // the step's one block barrier: tile k landed for every thread, and every warp is done with
    // tile k - 1, whose slot takes tile k + 1 now
    if (KD_KO != KD_KO_COPY_WAIT) kd::cp_async_wait<0>();
    if (KD_KO != KD_KO_BARRIER) __syncthreads();
    const bool last = k + 1 == nsteps;
    if (!last && !KD_KO_NO_LOADS) copy_step(k + 1, idx1);
    if (!KD_KO_NO_LOADS) idx1 = fetch_index(k + 2);
    const int start = kv_begin + k * KD_BN;
    const kd_u32 tile_s = s_ring + KD_MUT_READ_STAGE(k & 1, last) * KP_STAGE_BYTES + lane_base;

    // which of this lane's 16 scores are visible: bit 4 nt + i of s[nt][i] (row lr0 + 8 (i >> 1),
    // column start + 8 nt + 2t + (i & 1)). A step wholly inside the prefix sees all of it (a row
    // past the block's is zeros and never written); otherwise the mask's bytes are read here.
    kd_u32 vis = 0xFFFFu;
    if (start + KD_BN > prefix || start + KD_BN > kv_end) {  // block-uniform
      vis = 0u;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (lr0 + 8 * r >= nrows) continue;
        const int i = (row0 + lr0 + 8 * r) / H;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const int pos = start + 8 * (c >> 1) + 2 * t + (c & 1);
          bool visible = pos < kv_end;
          if (visible && pos >= prefix) {
            const int jc = pos - prefix;
            visible = mask ? mask[mask_base + static_cast<kd_i64>(KD_MUT_MASK_ROW(i, n)) * (prefix + n) + prefix +
                                  KD_MUT_MASK_COL(jc, n)] != 0
                           : !p.causal || jc <= i;
          }
          vis |= visible ? 1u << (4 * (c >> 1) + 2 * r + (c & 1)) : 0u;
        }
      }
    }

    // QK over the half's dims: s[nt] = S[lr0, lr0 + 8][8 nt + 2t, +1], KV n-tile nt
    float s[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KP_KS && !KD_KO_NO_QK; ++ks) {
      const int d = ks < 16 ? (KD_DL / 2) * half + 16 * ks : KD_DL + 32 * half + 16 * (ks - 16);
      if (KD_MUT_QK_DIMS(KP_D) < KP_D && d >= KD_MUT_QK_DIMS(KP_D)) continue;
      kd_u32 b0[4], b1[4];
      const kd_u32 o_ks = ks < 16 ? off[ks & 3] + 128 * (ks >> 2) : rope[ks - 16];
      if (KD_KO == KD_KO_LDSM) {  // (operands that change each step, so the MMAs stay in the loop)
#pragma unroll
        for (int i = 0; i < 4; ++i) b0[i] = tile_s + o_ks + i, b1[i] = tile_s + o_ks + 4 + i;
      } else {
        kd::ldsm_x4(tile_s + o_ks, b0);                 // KV 0..15
        kd::ldsm_x4(tile_s + 16 * KP_ROWB + o_ks, b1);  // KV 16..31
      }
      kd::mma_bf16(s[0], qa[ks], b0[0], b0[1]);
      kd::mma_bf16(s[1], qa[ks], b0[2], b0[3]);
      kd::mma_bf16(s[2], qa[ks], b1[0], b1[1]);
      kd::mma_bf16(s[3], qa[ks], b1[2], b1[3]);
    }
    // the pair's partial scores meet: both warps add the same two fp32 values (the peer's next
    // write is behind the next step's block barrier, after this read)
    if (KD_KO != KD_KO_EXCHANGE) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) kd::st_shared4(x_mine + nt * 32 * 16, s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
      kd::bar_sync(1 + rg, 64);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float4 v = kd::ld_shared4(x_peer + nt * 32 * 16);
        s[nt][0] += v.x; s[nt][1] += v.y; s[nt][2] += v.z; s[nt][3] += v.w;
      }
    }

    // online softmax in log2 units, a row's four lanes (a quad) together; hidden scores are -inf.
    // The max moves only when a score passes it by KP_MAX_SLACK (then p <= 2^KP_MAX_SLACK, fine in bf16), so
    // most steps rescale nothing
    kd_u32 pa[2][4];  // P (bf16) as the A fragments of PV's k-steps (KV 0..15, 16..31)
    if (KD_KO_NO_SOFTMAX) {  // knocked out: P is the raw scores (a constant P would let QK go too)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        pa[nt >> 1][(nt & 1) * 2] = kd::pack_bf16(s[nt][0], s[nt][1]);
        pa[nt >> 1][(nt & 1) * 2 + 1] = kd::pack_bf16(s[nt][2], s[nt][3]);
      }
    } else {
      if (cap > 0.f) {  // (one branch for the cap, not one per score: uniform)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[nt][i] = cap * tanhf(s[nt][i] * scale / cap) * KD_LOG2E;
      } else {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[nt][i] *= scale_log2;
      }
      float mx[2] = {-KD_INF, -KD_INF};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nt][i] = (vis >> (4 * nt + i)) & 1u ? s[nt][i] : -KD_INF;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      const bool mv0 = mx[0] > m_run[0] + KP_MAX_SLACK, mv1 = mx[1] > m_run[1] + KP_MAX_SLACK;
      if (__any_sync(0xffffffffu, mv0 || mv1)) {  // rare after the first steps
        float a0 = 1.f, a1 = 1.f;
        if (mv0) { a0 = kd::fast_exp2(m_run[0] - mx[0]); m_run[0] = mx[0]; l_run[0] *= a0; }
        if (mv1) { a1 = kd::fast_exp2(m_run[1] - mx[1]); m_run[1] = mx[1]; l_run[1] *= a1; }
#pragma unroll
        for (int j = 0; j < KP_NTV; ++j) { o[j][0] *= a0; o[j][1] *= a0; o[j][2] *= a1; o[j][3] *= a1; }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float p0 = kd::fast_exp2(s[nt][0] - m_run[0]), p1 = kd::fast_exp2(s[nt][1] - m_run[0]);
        const float p2 = kd::fast_exp2(s[nt][2] - m_run[1]), p3 = kd::fast_exp2(s[nt][3] - m_run[1]);
        l_run[0] += p0 + p1;
        l_run[1] += p2 + p3;
        pa[nt >> 1][(nt & 1) * 2] = kd::pack_bf16(p0, p1);
        pa[nt >> 1][(nt & 1) * 2 + 1] = kd::pack_bf16(p2, p3);
      }
    }

    // sglang layout: the draft rows' V comes from v, copied over the tile's first 512 dims once
    // every warp's QK has read them (block-uniform: the steps that reach the draft)
    if (!p.unified && start + KD_BN > pool_len) {
      __syncthreads();
      const kd_u32 tile0 = s_ring + (k & 1) * KP_STAGE_BYTES;  // (the slot the step's tile landed in)
      for (int e = tid; e < KD_BN * (KD_DL / 8); e += KP_THREADS) {
        const int r = e / (KD_DL / 8), c = e % (KD_DL / 8), vpos = start + r;
        if (vpos >= pool_len && vpos < kv_end)
          kd::cp_async_16(tile0 + kd::swz_off(r, c, KP_ROWB),
                          static_cast<const bf16*>(p.v) + static_cast<kd_i64>(qs + vpos - pool_len) * p.v_stride_tok + c * 8, true);
      }
      kd::cp_async_commit();
      kd::cp_async_wait<0>();  // (the next tile's copy too: this is a split's last step or two)
      __syncthreads();
    }

    // PV: the half's 256 output dims, 16 at a time (one ldmatrix.x4.trans: two n-tiles' B)
    const kd_u32 v_s = tile_s + KD_MUT_V_DIM0 * 2;
#pragma unroll
    for (int kk = 0; kk < 2 && !KD_KO_NO_PV; ++kk) {
#pragma unroll
      for (int jp = 0; jp < KP_NTV / 2; ++jp) {
        kd_u32 bv[4];
        const kd_u32 a = v_s + kk * 16 * KP_ROWB + off[jp & 3] + 128 * (jp >> 2);
        if (KD_KO == KD_KO_LDSM) {
#pragma unroll
          for (int i = 0; i < 4; ++i) bv[i] = a + i;
        } else {
          kd::ldsm_x4_trans(a, bv);
        }
        kd::mma_bf16(o[2 * jp], pa[kk], bv[0], bv[2]);
        kd::mma_bf16(o[2 * jp + 1], pa[kk], bv[1], bv[3]);
      }
    }
  }

  // (the knockouts that leave copies in flight land them before the fused merge reuses the ring)
  if (KD_KO == KD_KO_LOOP || KD_KO == KD_KO_COPY_WAIT) kd::cp_async_wait<0>();

  // ---- epilogue: each row's sum over its quad; one split: the output (bf16) and the LSE; else
  // the split's partial row (normalised, fp32) and its LSE. A row that saw nothing (an empty split)
  // gets zeros and -inf
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const bool direct = p.nsplit == 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (lr0 + 8 * r >= nrows) continue;
    const int row = row0 + lr0 + 8 * r, i = row / H, h = row % H;
    const kd_i64 grow = static_cast<kd_i64>(qs + i) * H + h;
    const float inv = l_run[r] > 0.f ? 1.f / l_run[r] : 0.f;
    const float lse = l_run[r] > 0.f ? (m_run[r] + log2f(l_run[r])) * KD_LN2 : -KD_INF;
    const int d0 = (KD_DL / 2) * half + 2 * t;
    if (direct) {
      bf16* dst = static_cast<bf16*>(p.out) + static_cast<kd_i64>(qs + i) * p.out_stride_tok +
                  static_cast<kd_i64>(h) * p.out_stride_head + d0;
#pragma unroll
      for (int j = 0; j < KP_NTV; ++j)
        *reinterpret_cast<kd_u32*>(dst + 8 * j) = kd::pack_bf16(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      if (p.lse && half == 0 && t == 0) p.lse[grow] = lse;
    } else {
      float* dst = p.o_part + (static_cast<kd_i64>(split) * p.total_rows + grow) * KD_DL + d0;
#pragma unroll
      for (int j = 0; j < KP_NTV; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      if (half == 0 && t == 0) p.lse_part[static_cast<kd_i64>(split) * p.total_rows + grow] = lse;
    }
  }
  // the fused merge (KD_FUSED builds, more than one split): the split blocks merge their row block's
  // rows in place (kd_fused.cuh), so run() is one launch; its weights take the ring's first 8 KB
  static_assert(KP_THREADS / 32 * KD_MAX_SPLITS * 4 <= KP_OFF_X, "the fused merge's weights fit the ring");
  if (KD_FUSED && !direct) kd_fused_merge<KP_THREADS / 32>(p, smem, tid, warp, lane, nrows, qs, H, false);
}
