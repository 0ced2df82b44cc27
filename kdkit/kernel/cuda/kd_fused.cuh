// The fused merge (KD_FUSED builds): the split blocks of a row block merge its rows in place, so
// run() is one launch. Both partial kernels (mla_tc.cu's 8- to 40-row builds and kd_pair.cuh's
// 64-row build) end with kd_fused_merge once their partial rows are written.
#pragma once

// The fused merge (KD_FUSED): W warps merge one (token, head) row from the split partials, out =
// sum_s w_s o_s / sum_s w_s, w_s = exp(lse_s - max), as mla_tc.cu's merge kernel computes it with a
// block per row. A block merges rows / nsplit rows: where that is fewer than its warps, W (1, 2
// or 4) warps share a row, each owning 512 / W of its dims, so each runs a chain over the splits
// W times shorter; no warp waits on another. Each finds the max and the weights itself (the LSEs
// and then the weights in its s_w, nsplit floats). Lane l holds dims 4 l + 128 j for
// the j = sub (mod W); a batch is 8 loads a lane: 2 W splits x 4 / W dim runs. One body for every
// W (a template per W took the 40-row sm_90 build, at 255 registers, into a spill). The partials
// are read from L2 (ld.global.cg): other blocks of the launch wrote them.
__device__ __forceinline__ void kd_merge_share(const KdParams& p, int grow, int lane, int W, int sub, float* s_w) {
  const int ns = p.nsplit, rows = p.total_rows;
  // the LSEs into s_w, their max, then the weights in place (shared memory, not a register array:
  // this code sits beside the 40-row build's 255-register loop)
  float m = -KD_INF;
  for (int s = lane; s < ns; s += 32) {
    const float ls = __ldcg(p.lse_part + static_cast<kd_i64>(s) * rows + grow);
    s_w[s] = ls;
    m = fmaxf(m, ls);
  }
  m = kd::warp_max(m);
  // an empty split (lse -inf) weighs nothing, and so does every split of a row that sees nothing;
  // their partial rows are written as zeros, so reading them below is harmless
  float wsum = 0.f;
  for (int s = lane; s < ns; s += 32) {  // (each lane rewrites the entries it wrote)
    const float ls = s_w[s];
    const float w = (m == -KD_INF || ls == -KD_INF) ? 0.f : KD_MUT_MERGE_W(exp2f((ls - m) * KD_LOG2E));
    s_w[s] = w;
    wsum += w;
  }
  wsum = kd::warp_sum(wsum);
  __syncwarp();  // s_w written by every lane
  const float* part = p.o_part + static_cast<kd_i64>(grow) * KD_DL + lane * 4;
  const kd_i64 split_pitch = static_cast<kd_i64>(rows) * KD_DL;
  const int lw = W == 4 ? 2 : W == 2 ? 1 : 0, lj = 2 - lw;  // log2 W, log2 (4 / W)
  float4 acc[4];  // dim runs j: only j = sub (mod W) are this warp's
#pragma unroll
  for (int j = 0; j < 4; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
  for (int s0 = 0; s0 < ns; s0 += 2 * W) {
    float4 v[8];  // load u: split s0 + (u >> lj), dim run ((u mod 4 / W) << lw) | sub
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int s = s0 + (u >> lj), j = ((u & ((1 << lj) - 1)) << lw) | sub;
      v[u] = s < ns ? __ldcg(reinterpret_cast<const float4*>(part + s * split_pitch + 128 * j)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int s = s0 + (u >> lj), j = ((u & ((1 << lj) - 1)) << lw) | sub;
      const float w = s < ns ? s_w[s] : 0.f;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        if (jj != j) continue;
        acc[jj].x = fmaf(w, v[u].x, acc[jj].x); acc[jj].y = fmaf(w, v[u].y, acc[jj].y);
        acc[jj].z = fmaf(w, v[u].z, acc[jj].z); acc[jj].w = fmaf(w, v[u].w, acc[jj].w);
      }
    }
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const int H = p.num_heads;
  bf16* o = static_cast<bf16*>(p.out) + static_cast<kd_i64>(grow / H) * p.out_stride_tok +
            static_cast<kd_i64>(grow % H) * p.out_stride_head + lane * 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if ((j & (W - 1)) != sub) continue;
    const __nv_bfloat162 lo = __floats2bfloat162_rn(acc[j].x * inv, acc[j].y * inv);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(acc[j].z * inv, acc[j].w * inv);
    uint2 packed;
    packed.x = *reinterpret_cast<const kd_u32*>(&lo);
    packed.y = *reinterpret_cast<const kd_u32*>(&hi);
    *reinterpret_cast<uint2*>(o + 128 * j) = packed;
  }
  // lse = m + log(sum w) is exact only with the true weights: a mutant's weights show here too
  if (p.lse && sub == 0 && lane == 0) p.lse[grow] = wsum > 0.f ? m + log2f(wsum) * KD_LN2 : -KD_INF;
  __syncwarp();  // s_w read by every lane before a next row rewrites it
}

// The split blocks of this (request, row block) count in on its counter once their partial rows
// are written. The counter only grows (64 bits: each launch adds nsplit or, for a row block past a
// shorter request, which returns at entry, nothing), so no replay of a CUDA graph needs it zeroed.
// Two ways to meet, the plan's choice (p.fused_last):
//  - wait (0; a cooperative launch, every block of the grid resident): each block waits for the
//    next multiple of nsplit past its own count and merges rows split, split + nsplit, ... ;
//  - last (1; any grid): the block whose count completes the multiple merges every row of the
//    row block, a warp a row; the others return. No block waits, so the grid need not be resident.
// WARPS: the block's warps; erows: its rows; qs, H: its request's first token and the heads;
// warp_a_row: one warp a row always.
// The ring (smem) is free by now and takes the weights: warps x KD_MAX_SPLITS floats.
template <int WARPS>
__device__ __forceinline__ void kd_fused_merge(const KdParams& p, unsigned char* smem, int tid, int warp, int lane,
                                               int erows, int qs, int H, bool warp_a_row) {
  // (the block's coordinates read again, not held in registers across the loop)
  int f_tile, f_split, f_b;  // (asm volatile: the compiler may not reuse the loop's copies of them)
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(f_tile));
  asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(f_split));
  asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(f_b));
  const int f_row0 = f_tile * p.rows_per_cta;
  __threadfence();  // this thread's partial rows reach the whole GPU ...
  __syncthreads();  // ... before thread 0 counts the block in
  bool merges = false;
  if (tid == 0) {
    unsigned long long* cnt = p.counters + static_cast<kd_i64>(f_b) * gridDim.x + f_tile;
    const unsigned long long ns = static_cast<unsigned long long>(p.nsplit);
    const unsigned long long old = atomicAdd(cnt, 1ull);
    if (p.fused_last) {
      merges = (old + 1) % ns == 0;
    } else {
      const unsigned long long target = (old / ns + 1) * ns;
      while (kd::ld_acquire_u64(cnt) < target) __nanosleep(32);
      merges = true;
    }
    __threadfence();  // (acquire: the other splits' rows, counted in before, are read after this)
  }
  // every split's rows are in L2 where this block merges
  if (!__syncthreads_or(merges)) return;
  // this block's rows: q = first + step i, i < R; W warps a row (W | 4), WARPS / W rows a pass
  const int first = p.fused_last ? 0 : f_split, step = p.fused_last ? 1 : p.nsplit;
  const int R = first < erows ? (erows - first + step - 1) / step : 0;  // block-uniform
  const int W = warp_a_row ? 1 : R * 4 <= WARPS ? 4 : R * 2 <= WARPS ? 2 : 1;
  float* s_w = reinterpret_cast<float*>(smem) + warp * KD_MAX_SPLITS;
  for (int i = warp / W; i < R; i += WARPS / W) {  // warp-uniform
    const int r = f_row0 + first + step * i, grow = (qs + r / H) * H + r % H;
    kd_merge_share(p, grow, lane, W, warp & (W - 1), s_w);
  }
}
