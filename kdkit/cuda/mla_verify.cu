// kdkit's MLA tree-verify attention: split-KV partial kernel + log-sum-exp reduce kernel.
//
// One block = (tile of KD_ROWS (token, head) rows of one request, one KV split, one request).
// Rows of request b are r = i * H + h (draft token i, head h). The block streams its split of the
// request's KV (prefix from the pool through kv_indices; the draft from k/v in the "sglang" layout
// or from the pool in the "unified" layout) through shared memory in chunks of KD_BLOCK_N rows,
// double-buffered with cp.async, and keeps an online softmax per row:
//   score phase: warp w owns rows w*RPW .. w*RPW+RPW-1, lane c owns KV row c of the chunk;
//   value phase: thread t owns value dims 4t .. 4t+3 of every row of the tile.
// SGLang's mask semantics: prefix columns are always visible (skip_prefix_custom_mask=True);
// draft column j of row i is visible iff custom_mask[mask_indptr[b] + i*(prefix+n) + prefix + j];
// without a mask, causal -> j <= i, else all.
//
// Negative controls (KD_VARIANT): 1 = no softmax scale, 2 = mask row read one row down,
// 3 = prefix-only KV (the seed's bug: the draft tokens' K/V never enter the softmax).
#include "mla_verify_common.cuh"

using bf16 = __nv_bfloat16;

// min 1 block per SM: lets ptxas use up to 255 registers (NVRTC 13.0 otherwise caps sm_90 at 128
// and spills); the ~95 KB of shared memory allows 1 block per SM on sm_120 anyway.
extern "C" __global__ void __launch_bounds__(KD_THREADS, 1)
kd_mla_verify_partial(const bf16* __restrict__ q, int q_stride_tok, int q_stride_head,
                      const bf16* __restrict__ k, int k_stride_tok,
                      const bf16* __restrict__ v, int v_stride_tok,
                      const bf16* __restrict__ kv_buf, int kv_stride_row,
                      const KD_QO_T* __restrict__ qo_indptr, const KD_KVP_T* __restrict__ kv_indptr,
                      const KD_KVI_T* __restrict__ kv_indices, const KD_PFX_T* __restrict__ prefix_lens,
                      const kd_u8* __restrict__ mask, const KD_MIP_T* __restrict__ mask_indptr,
                      int num_heads, int nsplit, int unified, int causal, float sm_scale, float logit_cap,
                      int total_rows, float* __restrict__ o_part, float* __restrict__ lse_part,
                      bf16* __restrict__ out, int out_stride_tok, int out_stride_head,
                      float* __restrict__ lse_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = reinterpret_cast<bf16*>(smem + KD_SMEM_Q);
  float* sP = reinterpret_cast<float*>(smem + KD_SMEM_Q + KD_SMEM_K);
  float* sScale = sP + KD_ROWS * KD_BLOCK_N;
  float* sM = sScale + KD_ROWS;
  float* sL = sM + KD_ROWS;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int qs = static_cast<int>(qo_indptr[b]);
  const int n = static_cast<int>(qo_indptr[b + 1]) - qs;
  const int rows = n * num_heads;
  const int row0 = tile * KD_ROWS;
  if (row0 >= rows) return;  // grid is sized for the longest request

  const long long kv_start = static_cast<long long>(kv_indptr[b]);
  const int pool_len = static_cast<int>(kv_indptr[b + 1] - kv_indptr[b]);
  const int prefix = unified ? static_cast<int>(prefix_lens[b]) : pool_len;
  int kv_len = unified ? pool_len : pool_len + n;
#if KD_VARIANT == 3
  kv_len = prefix;
#endif
  const int chunk_len = kd::cdiv(kd::cdiv(kv_len, nsplit), KD_BLOCK_N) * KD_BLOCK_N;
  const int kv_begin = split * chunk_len;
  const int kv_end = min(kv_len, kv_begin + chunk_len);
  const long long mask_base = mask ? static_cast<long long>(mask_indptr[b]) : 0;
  const int mask_pitch = prefix + n;
#if KD_VARIANT == 1
  const float scale = 1.0f;
#else
  const float scale = sm_scale;
#endif

  // ---- Q tile -> shared memory (rows past the request's end are zero) --------------------
  for (int e = tid; e < KD_ROWS * (KD_D / KD_VEC); e += KD_THREADS) {
    const int r = e / (KD_D / KD_VEC), c = (e % (KD_D / KD_VEC)) * KD_VEC;
    const int row = row0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < rows) {
      const int i = row / num_heads, h = row % num_heads;
      val = *reinterpret_cast<const uint4*>(q + static_cast<long long>(qs + i) * q_stride_tok +
                                            static_cast<long long>(h) * q_stride_head + c);
    }
    *reinterpret_cast<uint4*>(sQ + r * KD_LD + c) = val;
  }

  // ---- chunk loader: KV position p -> pool row (prefix, or everything when unified) or k row
  auto load_chunk = [&](int buf, int start) {
    bf16* dst = sK + buf * KD_BLOCK_N * KD_LD;
    for (int e = tid; e < KD_BLOCK_N * (KD_D / KD_VEC); e += KD_THREADS) {
      const int r = e / (KD_D / KD_VEC), c = (e % (KD_D / KD_VEC)) * KD_VEC;
      const int pos = start + r;
      const bf16* src = kv_buf;  // any valid address: a zero-fill reads nothing
      const bool valid = pos < kv_end;
      if (valid) {
        if (pos < pool_len)
          src = kv_buf + static_cast<long long>(kv_indices[kv_start + pos]) * kv_stride_row + c;
        else
          src = k + static_cast<long long>(qs + pos - pool_len) * k_stride_tok + c;
      }
      kd::cp_async_16(dst + r * KD_LD + c, src, valid);
    }
    kd::cp_async_commit();
  };

  // running max / sum of this lane's warp rows (replicated over the warp's lanes)
  float m_run[KD_ROWS_PER_WARP], l_run[KD_ROWS_PER_WARP];
#pragma unroll
  for (int rr = 0; rr < KD_ROWS_PER_WARP; ++rr) { m_run[rr] = -KD_INF; l_run[rr] = 0.f; }
  float acc[KD_ROWS][4];
#pragma unroll
  for (int r = 0; r < KD_ROWS; ++r)
#pragma unroll
    for (int x = 0; x < 4; ++x) acc[r][x] = 0.f;
  const int d0 = tid * 4;

  if (kv_begin < kv_end) load_chunk(0, kv_begin);
  for (int start = kv_begin, it = 0; start < kv_end; start += KD_BLOCK_N, ++it) {
    const int buf = it & 1;
    if (start + KD_BLOCK_N < kv_end) {
      load_chunk(buf ^ 1, start + KD_BLOCK_N);
      kd::cp_async_wait<1>();
    } else {
      kd::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* tK = sK + buf * KD_BLOCK_N * KD_LD;

    // ---- scores: lane = KV row of the chunk, KD_ROWS_PER_WARP rows per warp ------------
    float s[KD_ROWS_PER_WARP];
#pragma unroll
    for (int rr = 0; rr < KD_ROWS_PER_WARP; ++rr) s[rr] = 0.f;
    const bf16* krow = tK + lane * KD_LD;
#pragma unroll 4
    for (int c = 0; c < KD_D; c += KD_VEC) {
      const uint4 kv = *reinterpret_cast<const uint4*>(krow + c);
#pragma unroll
      for (int rr = 0; rr < KD_ROWS_PER_WARP; ++rr) {
        const uint4 qv = *reinterpret_cast<const uint4*>(sQ + (warp * KD_ROWS_PER_WARP + rr) * KD_LD + c);
        s[rr] = kd::dot8(qv, kv, s[rr]);
      }
    }
    const int pos = start + lane;
#pragma unroll
    for (int rr = 0; rr < KD_ROWS_PER_WARP; ++rr) {
      const int r = warp * KD_ROWS_PER_WARP + rr;
      const int row = row0 + r;
      const int i = row / num_heads;
      bool visible = row < rows && pos < kv_end;
      if (visible && pos >= prefix) {
        const int j = pos - prefix;
        if (mask) {
#if KD_VARIANT == 2
          const int mi = min(i + 1, n - 1);
#else
          const int mi = i;
#endif
          visible = mask[mask_base + static_cast<long long>(mi) * mask_pitch + prefix + j] != 0;
        } else {
          visible = !causal || j <= i;
        }
      }
      float x = s[rr] * scale;
      if (logit_cap > 0.f) x = logit_cap * tanhf(x / logit_cap);
      x = visible ? x : -KD_INF;
      const float m_new = fmaxf(m_run[rr], kd::warp_max(x));
      // a row with nothing visible yet keeps m = -inf: its p and rescale are 0 and 1
      const float p = (m_new == -KD_INF) ? 0.f : __expf(x - m_new);
      const float alpha = (m_new == -KD_INF) ? 1.f : __expf(m_run[rr] - m_new);
      l_run[rr] = l_run[rr] * alpha + kd::warp_sum(p);
      m_run[rr] = m_new;
      sP[r * KD_BLOCK_N + lane] = p;
      if (lane == 0) sScale[r] = alpha;
    }
    __syncthreads();

    // ---- sglang layout: the draft's V comes from v, not from k's latent half -------------
    if (!unified && start + KD_BLOCK_N > pool_len) {
      bf16* dst = sK + buf * KD_BLOCK_N * KD_LD;
      for (int e = tid; e < KD_BLOCK_N * (KD_DL / KD_VEC); e += KD_THREADS) {
        const int r = e / (KD_DL / KD_VEC), c = (e % (KD_DL / KD_VEC)) * KD_VEC;
        const int p2 = start + r;
        if (p2 >= pool_len && p2 < kv_end)
          *reinterpret_cast<uint4*>(dst + r * KD_LD + c) =
              *reinterpret_cast<const uint4*>(v + static_cast<long long>(qs + p2 - pool_len) * v_stride_tok + c);
      }
      __syncthreads();
    }

    // ---- values: thread owns dims d0..d0+3 of every row ----------------------------------
#pragma unroll
    for (int r = 0; r < KD_ROWS; ++r) {
      const float a = sScale[r];
#pragma unroll
      for (int x = 0; x < 4; ++x) acc[r][x] *= a;
    }
    for (int j = 0; j < KD_BLOCK_N; j += 4) {
      float2 vv[4][2];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const uint2 raw = *reinterpret_cast<const uint2*>(tK + (j + jj) * KD_LD + d0);
        vv[jj][0] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
        vv[jj][1] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      }
#pragma unroll
      for (int r = 0; r < KD_ROWS; ++r) {
        const float4 p4 = *reinterpret_cast<const float4*>(sP + r * KD_BLOCK_N + j);
        const float pj[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          acc[r][0] = fmaf(pj[jj], vv[jj][0].x, acc[r][0]);
          acc[r][1] = fmaf(pj[jj], vv[jj][0].y, acc[r][1]);
          acc[r][2] = fmaf(pj[jj], vv[jj][1].x, acc[r][2]);
          acc[r][3] = fmaf(pj[jj], vv[jj][1].y, acc[r][3]);
        }
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites the other buffer
  }

  // ---- epilogue: publish each row's max and sum, then normalise and write -----------------
  if (lane == 0) {
#pragma unroll
    for (int rr = 0; rr < KD_ROWS_PER_WARP; ++rr) {
      sM[warp * KD_ROWS_PER_WARP + rr] = m_run[rr];
      sL[warp * KD_ROWS_PER_WARP + rr] = l_run[rr];
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < KD_ROWS; ++r) {
    const int row = row0 + r;
    if (row >= rows) break;
    const float l = sL[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? sM[r] + logf(l) : -KD_INF;
    const int i = row / num_heads, h = row % num_heads;
    const long long grow = static_cast<long long>(qs + i) * num_heads + h;
    if (nsplit == 1) {
      bf16* o = out + static_cast<long long>(qs + i) * out_stride_tok + static_cast<long long>(h) * out_stride_head + d0;
      __nv_bfloat162 lo = __floats2bfloat162_rn(acc[r][0] * inv, acc[r][1] * inv);
      __nv_bfloat162 hi = __floats2bfloat162_rn(acc[r][2] * inv, acc[r][3] * inv);
      uint2 packed;
      packed.x = *reinterpret_cast<unsigned*>(&lo);
      packed.y = *reinterpret_cast<unsigned*>(&hi);
      *reinterpret_cast<uint2*>(o) = packed;
      if (lse_out && tid == 0) lse_out[grow] = lse;
    } else {
      const long long prow = static_cast<long long>(split) * total_rows + grow;
      *reinterpret_cast<float4*>(o_part + prow * KD_DL + d0) =
          make_float4(acc[r][0] * inv, acc[r][1] * inv, acc[r][2] * inv, acc[r][3] * inv);
      if (tid == 0) lse_part[prow] = lse;
    }
  }
}

// Merge the splits of one (token, head) row: out = sum_s w_s o_s / sum_s w_s, w_s = exp(lse_s - max).
extern "C" __global__ void __launch_bounds__(KD_THREADS)
kd_mla_verify_reduce(const float* __restrict__ o_part, const float* __restrict__ lse_part, int nsplit,
                     int total_rows, int num_heads, bf16* __restrict__ out, int out_stride_tok,
                     int out_stride_head, float* __restrict__ lse_out) {
  const int grow = blockIdx.x;
  const int d0 = threadIdx.x * 4;
  float m = -KD_INF;
  for (int sp = 0; sp < nsplit; ++sp) m = fmaxf(m, lse_part[static_cast<long long>(sp) * total_rows + grow]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  if (m != -KD_INF) {
    for (int sp = 0; sp < nsplit; ++sp) {
      const long long prow = static_cast<long long>(sp) * total_rows + grow;
      const float w = __expf(lse_part[prow] - m);  // exp(-inf) = 0 for empty splits
      if (w == 0.f) continue;
      const float4 o = *reinterpret_cast<const float4*>(o_part + prow * KD_DL + d0);
      acc.x = fmaf(w, o.x, acc.x); acc.y = fmaf(w, o.y, acc.y);
      acc.z = fmaf(w, o.z, acc.z); acc.w = fmaf(w, o.w, acc.w);
      wsum += w;
    }
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const int tok = grow / num_heads, h = grow % num_heads;
  bf16* o = out + static_cast<long long>(tok) * out_stride_tok + static_cast<long long>(h) * out_stride_head + d0;
  __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  uint2 packed;
  packed.x = *reinterpret_cast<unsigned*>(&lo);
  packed.y = *reinterpret_cast<unsigned*>(&hi);
  *reinterpret_cast<uint2*>(o) = packed;
  if (lse_out && threadIdx.x == 0) lse_out[grow] = wsum > 0.f ? m + logf(wsum) : -KD_INF;
}
