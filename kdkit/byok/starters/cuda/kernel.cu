// kdkit_starter: MLA tree-verify attention for SGLang's speculative decoding, plainly written.
//
// One query row (a draft token i of request b, a head h) against its request's KV:
//   KV position t < prefix       a committed token, read from the pool row kv_indices[kv_indptr[b] + t]
//   KV position t = prefix + j   draft token j, read from k and v (SGLang's layout: kv_indices cover
//                                 the prefix only; kdkit converts a unified case to it before it runs)
// Row i sees every prefix position and the draft tokens the tree mask gives it: request b's mask is
// a row-major q_len x (prefix + q_len) block of bytes at custom_mask + mask_indptr[b], whose prefix
// columns (all true) are skipped. Without a mask, causal means j <= i, else every draft token.
// score = (q . k) * sm_scale, soft-capped by logit_cap * tanh(score / logit_cap) when logit_cap > 0.
//
// Split-KV: the KV of a request is cut into nsplit equal spans; one block per (row, span) keeps an
// online softmax (running max m, sum l, output acc) in fp32 and writes its span's normalised output
// and LSE to the workspace. The merge kernel weighs the spans by exp(lse_s - max) into out and lse.
// No tensor cores, no shared-memory tiling of K: a place to start, not a fast kernel.
//
// kdkit writes the typedefs of the index arrays ahead of this file (their dtypes in the case):
// qo_indptr_t, kv_indptr_t, kv_indices_t, mask_indptr_t (int or long long).
#include <cuda_bf16.h>
#include <math_constants.h>

#define DL 512            // the latent: K's first 512 dims, and all of V
#define DR 64             // the rope part of q and k
#define D (DL + DR)       // 576
#define THREADS 128       // 4 warps; each thread owns DL / THREADS = 4 output dims
#define WARPS (THREADS / 32)
#define TILE 32           // KV positions scored before their V rows are added
#define DIMS (DL / THREADS)
#define NEG_INF (-CUDART_INF_F)

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// (no __launch_bounds__(THREADS): with it ptxas aims sm_120 at 12 blocks per SM, 40 registers, and spills)
extern "C" __global__ void kdkit_starter_partial(
    const bf16* q, const bf16* k, const bf16* v, const bf16* kv_buffer,
    const qo_indptr_t* qo_indptr, const kv_indptr_t* kv_indptr, const kv_indices_t* kv_indices,
    const unsigned char* custom_mask, const mask_indptr_t* mask_indptr,  // null: no tree mask
    float* o_part, float* lse_part,                                        // [nsplit, T*H, DL], [nsplit, T*H]
    long long q_stride_tok, long long q_stride_head, long long k_stride_tok, long long v_stride_tok,
    long long kv_stride_row,
    int num_heads, int num_tokens, int nsplit, float sm_scale, float logit_cap, int causal)
{
    const int b = blockIdx.z, split = blockIdx.y;
    const int i = blockIdx.x / num_heads, h = blockIdx.x % num_heads;  // draft row, head
    const long long q0 = qo_indptr[b], q_len = qo_indptr[b + 1] - q0;
    if (i >= q_len) return;  // the grid covers the longest request
    const long long kv0 = kv_indptr[b];
    const long long prefix = kv_indptr[b + 1] - kv0;
    const long long kv_len = prefix + q_len;
    const long long span = (kv_len + nsplit - 1) / nsplit;
    const long long lo = split * span, hi = min(kv_len, lo + span);
    const long long tok = q0 + i, row = tok * num_heads + h;
    const unsigned char* mask_row = custom_mask
        ? custom_mask + (long long)mask_indptr[b] + i * kv_len + prefix : nullptr;

    __shared__ float q_s[D];             // this row's query, fp32
    __shared__ float score_s[TILE];      // scores of the tile's positions (-inf: not seen)
    __shared__ const bf16* vrow_s[TILE]; // each position's V row: its pool row's first DL dims, or
                                         // the v row of a draft token

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    for (int d = tid; d < D; d += THREADS)
        q_s[d] = __bfloat162float(q[tok * q_stride_tok + h * q_stride_head + d]);

    float m = NEG_INF, l = 0.f, acc[DIMS];
    for (int c = 0; c < DIMS; ++c) acc[c] = 0.f;

    for (long long t0 = lo; t0 < hi; t0 += TILE) {
        __syncthreads();  // q_s is written; the last tile's score_s / rows are read
        // 1) scores: each warp takes every WARPS-th position of the tile
        for (int jj = warp; jj < TILE; jj += WARPS) {
            const long long t = t0 + jj;
            bool seen = t < hi;
            if (seen && t >= prefix) {
                const long long j = t - prefix;  // draft column
                seen = mask_row ? mask_row[j] != 0 : (!causal || j <= i);
            }
            float s = NEG_INF;
            if (seen) {
                const bf16 *krow, *vrow;
                if (t < prefix) {
                    krow = kv_buffer + (long long)kv_indices[kv0 + t] * kv_stride_row;
                    vrow = krow;
                } else {
                    krow = k + (q0 + t - prefix) * k_stride_tok;
                    vrow = v + (q0 + t - prefix) * v_stride_tok;
                }
                float dot = 0.f;
                for (int d = lane; d < D; d += 32) dot += q_s[d] * __bfloat162float(krow[d]);
                dot = warp_sum(dot);
                s = dot * sm_scale;
                if (logit_cap > 0.f) s = logit_cap * tanhf(s / logit_cap);
                if (lane == 0) vrow_s[jj] = vrow;
            }
            if (lane == 0) score_s[jj] = s;
        }
        __syncthreads();
        // 2) online softmax over the tile, then its V rows into this thread's DIMS output dims
        float tile_max = NEG_INF;
        for (int jj = 0; jj < TILE; ++jj) tile_max = fmaxf(tile_max, score_s[jj]);
        if (tile_max == NEG_INF) continue;  // nothing seen in this tile
        const float m_new = fmaxf(m, tile_max);
        const float rescale = expf(m - m_new);  // 0 while m is still -inf
        l *= rescale;
        for (int c = 0; c < DIMS; ++c) acc[c] *= rescale;
        for (int jj = 0; jj < TILE; ++jj) {
            if (score_s[jj] == NEG_INF) continue;  // never read a row the mask hides
            const float p = expf(score_s[jj] - m_new);
            l += p;
            const bf16* vr = vrow_s[jj] + tid * DIMS;
            for (int c = 0; c < DIMS; ++c) acc[c] += p * __bfloat162float(vr[c]);
        }
        m = m_new;
    }

    // this span's normalised output and LSE; a span that saw nothing: 0 and -inf
    const long long rows = (long long)num_tokens * num_heads;
    float* o = o_part + ((long long)split * rows + row) * DL + tid * DIMS;
    for (int c = 0; c < DIMS; ++c) o[c] = l > 0.f ? acc[c] / l : 0.f;
    if (tid == 0) lse_part[(long long)split * rows + row] = l > 0.f ? m + logf(l) : NEG_INF;
}

// One block per (token, head) row: out = sum_s w_s o_s / sum_s w_s, w_s = exp(lse_s - max_s lse_s).
extern "C" __global__ void __launch_bounds__(THREADS) kdkit_starter_merge(
    const float* o_part, const float* lse_part, bf16* out, float* lse,
    long long out_stride_tok, long long out_stride_head, int num_heads, int num_tokens, int nsplit)
{
    const long long row = blockIdx.x, rows = (long long)num_tokens * num_heads;
    const long long tok = row / num_heads, h = row % num_heads;
    const int tid = threadIdx.x;
    float M = NEG_INF;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, lse_part[s * rows + row]);
    float sum = 0.f, acc[DIMS];
    for (int c = 0; c < DIMS; ++c) acc[c] = 0.f;
    if (M > NEG_INF) {
        for (int s = 0; s < nsplit; ++s) {
            const float w = expf(lse_part[s * rows + row] - M);  // 0 for a span that saw nothing
            if (w == 0.f) continue;
            sum += w;
            const float* o = o_part + (s * rows + row) * DL + tid * DIMS;
            for (int c = 0; c < DIMS; ++c) acc[c] += w * o[c];
        }
    }
    bf16* dst = out + tok * out_stride_tok + h * out_stride_head + tid * DIMS;
    for (int c = 0; c < DIMS; ++c) dst[c] = __float2bfloat16(sum > 0.f ? acc[c] / sum : 0.f);
    if (tid == 0) lse[row] = sum > 0.f ? M + logf(sum) : NEG_INF;  // a row that sees nothing: 0, -inf
}
