// kdkit's MLA tree-verify attention on tensor cores (mma.sync m16n8k16 bf16 -> fp32, ldmatrix,
// cp.async): split-KV partial kernel + log-sum-exp merge kernel. Fits sm_120 (<= 99 KB of shared
// memory per block, nothing newer than sm_80's instructions) and runs on sm_80..sm_120.
//
// Orientation (FlashMLA-ETAP): KV rows sit on the MMA's M dimension and the (token, head) query
// rows on N (n = 8), so a request of q_len 9 x 8 heads = 72 rows needs no padding to 16.
// One block = (up to KD_NQ = 8*KD_NT query rows of one request, one KV split, one request). The
// block streams its split of the request's KV once, 32 rows per step, through a double-buffered
// cp.async ring of swizzled tiles; blocks holding the other rows of the same request and split are
// adjacent in the grid, so their read of the same KV hits L2. Steps whose columns no row of the
// block sees (draft columns outside its tokens' tree ancestry) are skipped: see "the steps this
// block streams" below.
//   QK:  S^T[32 x NQ] = K[32 x 576] Q^T. Warp w: KV m-tile (w & 1), dim group dg = (w >> 1) & 3
//        (the k-steps of 16 dims dg, dg + 4, ..., dg + 32), query half w >> 3 (KD_NH = 2: 16
//        warps); Q lives in registers as B fragments; the four dim groups' partial scores meet in
//        shared memory.
//   softmax: warp w owns query columns w, w + KD_WARPS, ...; lane = KV row: online softmax in the
//        log2 domain; P (bf16) and each column's rescale go to shared memory.
//   PV:  O^T[512 x NQ] += V^T[512 x 32] P^T. Warp w owns output dims KD_VDIMS_WARP w .. (64 at 8
//        warps, 32 at 16); V^T is the K tile's first 512 dims read through ldmatrix.trans.
// SGLang's semantics: prefix columns always visible (skip_prefix_custom_mask); draft column j of
// token i visible iff custom_mask[mask_indptr[b] + i*(prefix+n) + prefix + j]; without a mask,
// causal -> j <= i, else all. Layout "sglang": prefix from the pool via kv_indices, the draft's K/V
// from k/v; "unified": everything from the pool. Every KD_MUT_* hook is the identity in production.
#include "kd_common.cuh"
#include "kd_mutants.cuh"
#include "kd_knockouts.cuh"  // timing-only builds (KD_KO 0 here: every test folds away)
// KdParams (the one argument) is generated from kdkit/kernel/params.py ahead of this file

using bf16 = __nv_bfloat16;

// ---- compile-time configuration: set by kdkit/kernel/spec.py as -D defines -----------------
#ifndef KD_DL
#error "KD_DL (latent dims) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_DR
#error "KD_DR (rope dims) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_MERGE_GROUPS
#error "KD_MERGE_GROUPS (the merge kernel's most thread groups per row) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_MAX_SPLITS
#error "KD_MAX_SPLITS (the most KV splits a plan may ask for) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_NT
#error "KD_NT (query n-tiles of 8 rows per block) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_QO_T
#error "KD_QO_T (the C type of qo_indptr) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_KVP_T
#error "KD_KVP_T (the C type of kv_indptr) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_KVI_T
#error "KD_KVI_T (the C type of kv_indices) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_MIP_T
#error "KD_MIP_T (the C type of mask_indptr) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_PFX_T
#error "KD_PFX_T (the C type of prefix_lens) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_SMEM_LIMIT
#error "KD_SMEM_LIMIT (sm_120's shared memory per block) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_MERGE_THREADS
#error "KD_MERGE_THREADS (threads of one merge group) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_NH
#error "KD_NH (query halves: 1 -> 8 warps, 2 -> 16 warps per block) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_SKIP
#error "KD_SKIP (1: skip the draft steps no row of a block sees; 2: gather its visible columns) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_FUSED
#error "KD_FUSED (1: the split blocks merge in place, a cooperative launch) comes from kdkit/kernel/spec.py"
#endif
#ifndef KD_PAIR
#error "KD_PAIR (1: the 64-row build, kd_pair.cuh's partial kernel) comes from kdkit/kernel/spec.py"
#endif
#include "kd_fused.cuh"  // the fused merge, both partial kernels
#if KD_PAIR
// the 64-row build (query rows on the MMA's M dimension, a warp pair per 16 rows): its own partial
// kernel, this file's merge kernel below
#include "kd_pair.cuh"
#else  // the 8- to 40-row builds: the partial kernel of this file
// KD_SKIP 2, the column gather: of the split's draft steps the block streams only the columns
// that some row of it sees, packed 32 to a tile (a deep tree's node sees its ancestors only)
#define KD_GATHER (KD_SKIP == 2)

#define KD_D (KD_DL + KD_DR)            // score dims (576)
#define KD_NQ (8 * KD_NT)               // query rows per block
#define KD_BN 32                        // KV rows per pipeline step
#define KD_STAGES 2                     // KV tiles in the ring
// KD_NH = 2 runs 16 warps: each QK warp takes half the query n-tiles, each softmax warp half the
// columns, each PV warp half the output dims, so twice the warps hide the latencies of a step
// (4 per scheduler instead of 2) at <= 128 registers each
#define KD_THREADS (256 * KD_NH)
#define KD_WARPS (KD_THREADS / 32)
#define KD_NTH ((KD_NT + KD_NH - 1) / KD_NH)  // query n-tiles per QK warp, columns per softmax warp
// an odd KD_NT at KD_NH 2 splits unevenly (3 + 2 n-tiles): the second half's last n-tile and the
// softmax columns past KD_NQ do not exist; every use of them below is skipped (compile-time true
// when the split is even)
#define KD_EVEN (KD_NT % KD_NH == 0)
#define KD_LD_THREADS (KD_BN * 8)       // the KV loader's threads: 8 per KV row of a step
#define KD_KG 4                         // dim groups of the QK product
#define KD_KSTEPS (KD_D / 16 / KD_KG)   // k-steps of 16 dims per warp (9)
#define KD_CHUNKS (KD_D / 8)            // 16-byte chunks per KV row (72)
#define KD_ROW_BYTES (KD_D * 2)
#define KD_VDIMS_WARP (KD_DL / KD_WARPS)  // output dims per warp (64; 32 at KD_NH 2)
#define KD_VMT (KD_VDIMS_WARP / 16)     // output m-tiles per warp (4; 2 at KD_NH 2)
#define KD_VCH (KD_VDIMS_WARP / 8)      // 16-byte chunks of V per warp
#define KD_SPITCH 36                    // score tile pitch (fp32): word 8t+g, no bank conflict
#define KD_PPITCH (KD_BN + 8)           // P tile pitch (bf16): 80-byte rows, ldmatrix conflict-free
#ifndef KD_MAX_SLACK                    // (an experiment may set it: PlanOptions.extra_defines)
#define KD_MAX_SLACK 8.f                // a column's max moves when a score passes it by this (log2)
#endif
// a column's max before it has seen a score: the most negative finite float, so 2^(x - max) needs
// no -inf test (2^-inf = 0 for a hidden score; any finite visible score moves the max, and
// 2^(floor - max) = 0 rescales the zero sum and output it had); a row that sees nothing keeps it
// and its sum 0 (LSE -inf)
#define KD_M_FLOOR (-3.40282347e38f)

// the most draft steps of a split whose visibility the block checks before it streams them (a
// 64-bit vote word): 2048 draft columns; a split with more streams every step (correct, not skipped)
#define KD_SKIP_MAX 64

// the gather's column list, 16-bit entries: every column of the 64 candidate steps, then 3 tiles of
// KD_COL_END (the rest of the last tile and the look-ahead past it: the furthest read, 3 steps ahead
// of the step before the last, is entry ncols + 94 at most)
#define KD_COL_CAP (KD_SKIP_MAX * KD_BN + 3 * KD_BN)
#define KD_COL_END 0xFFFFu              // the column list's end: a position past kv_end

// dynamic shared memory, bytes: KV ring | partial scores | P | rescale per column | token per column
// | the block's row count (for the epilogue) | the skip table: the starts of the visible draft
// steps, then 3 x kv_end (KD_SKIP 1), or the visible columns' offsets, then KD_COL_END (KD_SKIP 2)
#define KD_STAGE_BYTES (KD_BN * KD_ROW_BYTES)
#define KD_OFF_S (KD_STAGES * KD_STAGE_BYTES)
#define KD_OFF_P (KD_OFF_S + KD_KG * KD_NQ * KD_SPITCH * 4)
#define KD_OFF_ALPHA (KD_OFF_P + KD_NQ * KD_PPITCH * 2)
#define KD_OFF_TOK (KD_OFF_ALPHA + KD_NQ * 4)
#define KD_OFF_TAB (KD_OFF_TOK + KD_NQ * 4)
#define KD_SMEM_BYTES (KD_OFF_TAB + 16 + (KD_GATHER ? KD_COL_CAP * 2 : KD_SKIP ? (KD_SKIP_MAX + 3) * 4 : 0))
#define KD_OPITCH (KD_DL + 4)           // epilogue's O tile pitch (fp32): fragment stores conflict-free

static_assert(KD_SMEM_BYTES <= KD_SMEM_LIMIT, "shared memory per block exceeds sm_120's 99 KB");
static_assert(KD_WARPS == 2 * KD_KG * KD_NH && KD_BN == 32,
              "QK: 2 KV m-tiles x 4 dim groups x KD_NH query halves; softmax: lane = KV row");
static_assert((KD_NH == 1 || KD_NH == 2) && KD_NT >= KD_NH, "every query half holds an n-tile");
static_assert(KD_LD_THREADS <= KD_THREADS && KD_LD_THREADS % 32 == 0, "the loader is whole warps");
static_assert(KD_KG == 4, "dim group dg's k-steps dg + 4 ks keep the swizzled chunk of a lane constant");
static_assert(KD_MUT_V_DIM0 % 64 == 0, "V's first dim keeps the 8-chunk swizzle groups aligned");
static_assert(KD_D % (16 * KD_KG) == 0, "each dim group is a whole number of 16-dim k-steps");
static_assert(KD_DL % (16 * KD_WARPS) == 0, "output dims split evenly in m-tiles over the warps");
static_assert(KD_CHUNKS % 8 == 0, "the XOR swizzle permutes 16-byte chunks within groups of 8");
static_assert(KD_NT >= 1 && KD_NQ <= KD_THREADS, "query rows per block");
static_assert(KD_NQ * KD_OPITCH * 4 <= KD_OFF_P, "the epilogue's O tile fits in the ring and score tile");
static_assert(3 * KD_NQ * 4 + KD_NQ * 8 <= KD_NQ * KD_PPITCH * 2 && KD_OFF_P % 8 == 0,
              "the epilogue's max, sum, 1 / sum and row destinations fit in the P tile");
static_assert(KD_OPITCH % 32 == 4, "O tile stores: bank 8t + 4c + g, no conflict");
static_assert(KD_SKIP_MAX == 64 && KD_WARPS * 8 <= KD_NQ * KD_PPITCH * 2,
              "the skip pass: 64 candidate steps, each warp's 64-bit vote word in the P tile until the first step");
static_assert(KD_SKIP_MAX * KD_BN <= KD_COL_END, "a column's offset in the candidate steps fits 16 bits, below the end mark");
static_assert(!KD_GATHER || KD_SKIP_MAX * 4 <= KD_NQ * KD_PPITCH * 2,
              "the gather pass: a 32-bit column word per candidate step in the P tile until the first step");

// what Python reads back from the build (kdkit/kernel/spec.py): one source for these numbers
extern "C" __device__ int kd_meta_smem_bytes = KD_SMEM_BYTES;
extern "C" __device__ int kd_meta_threads = KD_THREADS;
extern "C" __device__ int kd_meta_rows = KD_NQ;
extern "C" __device__ int kd_meta_block_n = KD_BN;

// byte offset of 16-byte chunk c of KV row r inside a tile: chunk c ^ (r & 7), so the 8 rows an
// ldmatrix reads at the same logical chunk land in 8 different bank groups
__device__ __forceinline__ kd_u32 tile_off(int r, int c) {
  return static_cast<kd_u32>(r * KD_ROW_BYTES + ((c ^ (r & 7)) << 4));
}

extern "C" __global__ void __launch_bounds__(KD_THREADS, 1) kd_mla_tc_partial(const KdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // MMA fragment coordinates
  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  if (KD_KO == KD_KO_ENTRY) return;

  const KD_QO_T* qo_indptr = static_cast<const KD_QO_T*>(p.qo_indptr);
  const KD_KVP_T* kv_indptr = static_cast<const KD_KVP_T*>(p.kv_indptr);
  const KD_KVI_T* kv_indices = static_cast<const KD_KVI_T*>(p.kv_indices);
  const bf16* qg = static_cast<const bf16*>(p.q);
  const bf16* kg_ = static_cast<const bf16*>(p.k);
  const bf16* vg = static_cast<const bf16*>(p.v);
  const bf16* pool = static_cast<const bf16*>(p.kv_buf);

  const int H = p.num_heads;
  // The 8-row builds (short KV: the prologue is much of their time) issue every load that needs
  // only the request's number here, with its token range: its KV range, prefix and mask row are
  // then one memory round trip on the way to the first KV tile, not two (a plain load's issue
  // sinks past the early return below, so these are kd::ld_now). The larger builds keep their
  // measured code (the constexpr choices below fold to it): hoisted, these loads cost them 2%
  // (kernel-hoist in benchmarks/LOG.md: their loop's registers moved).
  constexpr bool kHoist = KD_NT == 1 && KD_NH == 1;
  KD_KVP_T kvp0 = 0, kvp1 = 0;
  KD_PFX_T pfx = 0;
  KD_MIP_T mip = 0;
  if (kHoist) {
    kvp0 = kd::ld_now(kv_indptr + b);
    kvp1 = kd::ld_now(kv_indptr + b + 1);
    if (p.unified) pfx = kd::ld_now(static_cast<const KD_PFX_T*>(p.prefix_lens) + b);
    if (p.mask) mip = kd::ld_now(static_cast<const KD_MIP_T*>(p.mask_indptr) + b);
  }
  const int qs = static_cast<int>(qo_indptr[b]);
  const int n = static_cast<int>(qo_indptr[b + 1]) - qs;  // draft tokens of this request
  const int rows = n * H;
  const int row0 = tile * p.rows_per_cta;
  if (row0 >= rows) return;  // the grid is sized for the longest request
  const int nrows = min(p.rows_per_cta, rows - row0);

  const kd_i64 kv_start = static_cast<kd_i64>(kHoist ? kvp0 : kv_indptr[b]);
  const int pool_len = static_cast<int>(kHoist ? kvp1 - kvp0 : kv_indptr[b + 1] - kv_indptr[b]);
  const int prefix = p.unified ? static_cast<int>(kHoist ? pfx : static_cast<const KD_PFX_T*>(p.prefix_lens)[b]) : pool_len;
  const int kv_len = KD_MUT_KV_LEN(p.unified ? pool_len : pool_len + n, prefix);
  const int span = kd::cdiv(kd::cdiv(kv_len, p.nsplit), KD_BN) * KD_BN;
  const int kv_begin = split * span;
  const int kv_end = min(kv_len, kv_begin + span);
  const int nsteps_all = kv_begin < kv_end ? kd::cdiv(kv_end - kv_begin, KD_BN) : 0;
  const kd_u8* mask = p.mask;
  const kd_i64 mask_base = mask ? static_cast<kd_i64>(kHoist ? mip : static_cast<const KD_MIP_T*>(p.mask_indptr)[b]) : 0;
  const int mask_pitch = prefix + n;
  const float scale = KD_MUT_SCALE(p.sm_scale);
  const float scale_log2 = scale * KD_LOG2E;
  const float cap = p.logit_cap;
  const int i0 = row0 / H, i1 = (row0 + nrows - 1) / H;  // the block's draft tokens

  // ---- the steps this block streams: none that no row of the block can see. Prefix columns are
  // seen by every row; a step of draft columns that no token i0..i1 sees adds p = 0 to every sum
  // and never moves a column's max (hidden scores are -inf; the softmax moves a max only for a
  // score above it), so skipping it changes no bit of the result. The block streams a compacted
  // sequence of steps, k -> start step_start(k):
  //   k < nlin   kv_begin + KD_BN k: the prefix steps, and always the split's first step (its
  //              index chain starts before the visibility pass below has ended)
  //   k >= nlin  sTab[k - nlin]: with a mask, the visible ones of the split's other steps; then
  //              kv_end, which ends the sequence
  // Causal without a mask: columns past prefix + i1 are hidden from every row, so the split ends
  // there (nlin shrinks, no table). Non-causal without a mask: every step.
  int nlin = nsteps_all;  // leading steps streamed in order
  int ncand = 0;          // the steps after them whose visibility the pass checks (mask only)
  if (KD_SKIP && mask) {
    const int first_draft = max(kv_begin, prefix / KD_BN * KD_BN);  // first step holding a draft column
    const int npre = nsteps_all > 0 ? kd::cdiv(min(first_draft, kv_end) - kv_begin, KD_BN) : 0;
    const int lead = max(npre, 1);
    if (nsteps_all - lead >= 1 && nsteps_all - lead <= KD_SKIP_MAX) {  // else every step
      nlin = lead;
      ncand = nsteps_all - lead;
    }
  } else if (!mask && p.causal) {  // (with a mask the mask decides, in either build: SGLang passes
    // causal with it, and a mask need not number parents before children)
    const int last = min(kv_end, prefix + i1 + 1);  // one past the last column that token i1 sees
    nlin = kv_begin < last ? kd::cdiv(last - kv_begin, KD_BN) : 0;  // 0: an empty split (LSE -inf)
  }
  // the table: the visible candidates' starts, then kv_end three times: the step after the last
  // and the loader's look-ahead past it (two more) read kv_end: no step, nothing loaded. A leading
  // step's start is computed (no shared-memory load on the loop's path where nothing is skipped).
  // The epilogue reads nrows back from shared memory: the register it held across the loop is
  // the one that nlin needs (the 40-row sm_90 build is at 255 and spilled otherwise; three of its
  // mutant builds spill 4 bytes). Should it spill again: step_start reading nlin and kv_begin from
  // shared memory fit in 252 (one shared-memory load's latency per step).
  int* sRows = reinterpret_cast<int*>(smem + KD_OFF_TAB);
  int* sTab = sRows + 4;
  if (tid == 0) *sRows = nrows;  // (published by the barriers before the loop)
#if KD_GATHER
  // row r of step k: in order for k < nlin, else entry 32 (k - nlin) + r of the column list. An
  // entry is 16 bits (half the list's shared memory: the 32-row block fits beside it): a column's
  // offset from the first candidate step's start (below 32 KD_SKIP_MAX), or KD_COL_END, which
  // reads as a position past kv_end (every reader of a position tests >= kv_end, never == kv_end)
  unsigned short* sCol = reinterpret_cast<unsigned short*>(sTab);
  if (ncand == 0 && tid < 3 * KD_BN) sCol[tid] = KD_COL_END;
  auto pos_of = [&](int k, int r) -> int {
    return k < nlin ? kv_begin + k * KD_BN + r : kv_begin + nlin * KD_BN + sCol[(k - nlin) * KD_BN + r];
  };
  auto step_start = [&](int k) -> int { return pos_of(k, 0); };
#elif KD_SKIP
  if (ncand == 0 && tid < 3) sTab[tid] = kv_end;
  auto step_start = [&](int k) -> int { return k < nlin ? kv_begin + k * KD_BN : sTab[k - nlin]; };
#else
  // KD_SKIP 0 (the build for shapes with little to skip: its loop costs nothing for the table):
  // the split's steps in order, up to nlin (a look-ahead start past kv_end loads nothing)
  auto step_start = [&](int k) -> int { return kv_begin + k * KD_BN; };
#endif
#if !KD_GATHER
  auto pos_of = [&](int k, int r) -> int { return step_start(k) + r; };  // a step's rows are consecutive
#endif

  float* sS = reinterpret_cast<float*>(smem + KD_OFF_S);
  bf16* sP = reinterpret_cast<bf16*>(smem + KD_OFF_P);
  float* sAlpha = reinterpret_cast<float*>(smem + KD_OFF_ALPHA);
  int* sTok = reinterpret_cast<int*>(smem + KD_OFF_TOK);  // query column -> its token in the request
  if (tid < KD_NQ) sTok[tid] = (row0 + tid) / H;  // read after the first step's barrier
  const kd_u32 s_ring = kd::smem_addr(smem);
  const kd_u32 s_p = kd::smem_addr(sP);

  // ---- KV step loader (the first KD_LD_THREADS threads). Thread -> KV row (tid >> 3) of a step,
  // 16-byte chunks (tid & 7) + 8j of it:
  // one pool index per thread per step, fetched three steps ahead, and the row copied to shared
  // memory (cp.async) one step ahead, so no copy waits on an index. The loop pulls nothing into L2
  // ahead of the copy (at 8 warps): a step's copy has a whole step (1.5 us at 40 rows) to land, and
  // measured, not waiting for it at all saved 1% at most, while the prefetch's own instructions
  // cost 1-3.6% (benchmarks/LOG.md, kernel-np). The prologue pulls step 1, whose copy follows it.
  const bool loader = tid < KD_LD_THREADS;  // warp-uniform; the other warps commit empty groups
  const int ld_row = (tid / 8) & (KD_BN - 1), ld_c0 = tid & 7;
  // chunk ld_c0 + 8j of the row lands at ld_dst + 128 j: the swizzle permutes within groups of 8,
  // so the nine copies of a step share one address register and use immediate offsets
  const kd_u32 ld_dst = tile_off(ld_row, ld_c0);
  // the pool index is kept as loaded (widened where it is used, two steps later), so the load's
  // latency never stalls the step that issues it
  auto fetch_index = [&](int pos) -> KD_KVI_T {
    return (loader && pos < kv_end && pos < pool_len) ? kv_indices[kv_start + pos] : static_cast<KD_KVI_T>(0);
  };
  auto row_src = [&](int pos, KD_KVI_T idx) -> const bf16* {
    if (pos >= kv_end) return nullptr;
    return pos < pool_len ? pool + static_cast<kd_i64>(idx) * p.kv_stride_row
                          : kg_ + static_cast<kd_i64>(qs + pos - pool_len) * p.k_stride_tok;
  };
  // In the plain build the blocks holding a request's other rows stream the same steps: only the
  // first of them (tile 0) pulls step 1 into L2, so L2 takes one prefetch per line, not one per
  // sibling (13 at q_len 64, H 8). (The skip builds' siblings may stream different steps: each
  // pulls its own.)
  const bool puller = loader && (KD_SKIP || tile == 0);
  auto prefetch_l2 = [&](const bf16* src) {
    if (!puller || src == nullptr) return;  // 9 lines of 128 B per KV row: line ld_c0 + 8 l
#pragma unroll
    for (int l = 0; l < 9; l += 8)
      if (ld_c0 + l < 9) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src + (ld_c0 + l) * 64));
  };
  auto copy_step = [&](int stage, const bf16* src) {
    const kd_u32 dst = s_ring + stage * KD_STAGE_BYTES;
    const bool valid = src != nullptr;
    const bf16* from = (valid ? src : pool) + ld_c0 * 8;  // src-size 0 reads nothing when !valid
    if (loader) {
#pragma unroll
      for (int j = 0; j < KD_CHUNKS / 8; ++j) kd::cp_async_16(dst + ld_dst + j * 128, from + j * 64, valid);
    }
    kd::cp_async_commit();
  };
  // ---- Q: the block's rows copied (cp.async, first, so their flight overlaps the index chain of
  // the first KV tile) into the ring's second stage and the score tile, both free until the first
  // step, then read as B fragments through ldmatrix: a dozen 16-byte copies per thread instead of
  // 2 x KD_KSTEPS x KD_NT four-byte loads. Rows past nrows are zero-filled (their columns are idle).
  static_assert(KD_OFF_S == 2 * KD_STAGE_BYTES && KD_NQ * KD_ROW_BYTES <= KD_OFF_P - KD_STAGE_BYTES,
                "Q's rows fit in the ring's second stage and the score tile behind it");
  static_assert(KD_THREADS >= KD_NQ, "at least one thread per Q row");
  const kd_u32 s_q = s_ring + KD_STAGE_BYTES;
  {
    constexpr int TPR = KD_THREADS / KD_NQ;  // threads per Q row
    const int qr = tid / TPR, sub = tid % TPR;
    if (qr < KD_NQ) {
      const bool valid = qr < nrows;
      const int r = row0 + (valid ? qr : 0);
      const bf16* qrow = qg + static_cast<kd_i64>(qs + r / H) * p.q_stride_tok +
                         static_cast<kd_i64>(KD_MUT_HEAD(r % H, H)) * p.q_stride_head;
      for (int c = sub; c < KD_CHUNKS; c += TPR) kd::cp_async_16(s_q + tile_off(qr, c), qrow + c * 8, valid);
    }
    kd::cp_async_commit();
  }

  // steps 0..2 as far as they are leading steps (the table is not written yet: its steps are
  // fetched once it is published, below)
  auto lead_start = [&](int k) { return !KD_SKIP || k < nlin ? kv_begin + k * KD_BN : kv_end; };
  KD_KVI_T idx1 = fetch_index(lead_start(1) + ld_row);  // step 1
  KD_KVI_T idx2 = fetch_index(lead_start(2) + ld_row);  // step 2
  const KD_KVI_T idx0 = fetch_index(lead_start(0) + ld_row);

  // ---- the visibility pass (mask only): candidate c (step nlin + c) is visible iff a token
  // i0..i1 sees one of its columns. The (candidate, token) pairs are dealt to the warps, lane =
  // column: each lane loads one mask byte per pair (a warp reads 32 consecutive bytes), 8 pairs'
  // loads in flight before their votes (the pass is on the path to the first tile: one or two
  // memory latencies at H >= 8, where a block holds <= 6 tokens). Each warp ORs its votes into
  // a 64-bit word of candidates, published in the P tile (free until the first step). The mask
  // is read through the same hooks as the per-score test below, so a mutant's misread mask
  // decides the skipping too.
#if KD_GATHER
  // the gather's pass: a warp per candidate step (its tokens' loads in flight together), lane =
  // column; the step's column word, every token's ballot ORed (prefix columns: all seen), goes to
  // the P tile (free until the first step)
  kd_u32* sColW = reinterpret_cast<kd_u32*>(smem + KD_OFF_P);  // [KD_SKIP_MAX]
  if (ncand > 0) {  // block-uniform
    // warp w owns candidates w, w + 8, ...: its pairs (candidate, token) in that order, 8 loads in
    // flight before their ballots; a candidate's word is written once its last token is ORed in
    constexpr int U = 8;
    const int ntok = i1 - i0 + 1;
    const int nown = ncand > warp ? (ncand - 1 - warp) / KD_WARPS + 1 : 0, npairs = nown * ntok;
    kd_u32 cw = 0;
    for (int e0 = 0; e0 < npairs; e0 += U) {  // warp-uniform
      kd_u8 seen[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // every load first, then the ballots
        const int e = e0 + u, c = warp + KD_WARPS * (e / ntok), tok = e % ntok;
        const int pos = kv_begin + (nlin + c) * KD_BN + lane;
        seen[u] = (e < npairs && pos >= prefix && pos < kv_end)
                      ? mask[mask_base + static_cast<kd_i64>(KD_MUT_MASK_ROW(i0 + tok, n)) * mask_pitch + prefix +
                             KD_MUT_MASK_COL(pos - prefix, n)]
                      : kd_u8(0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int e = e0 + u, c = warp + KD_WARPS * (e / ntok), tok = e % ntok;
        if (e >= npairs) break;  // warp-uniform
        const int pos = kv_begin + (nlin + c) * KD_BN + lane;
        if (tok == 0) cw = __ballot_sync(0xffffffffu, pos < prefix && pos < kv_end);  // prefix: all seen
        cw |= __ballot_sync(0xffffffffu, seen[u] != 0);
        if (tok == ntok - 1 && lane == 0) sColW[c] = cw;
      }
    }
  }
#else
  kd_u32* sVisW = reinterpret_cast<kd_u32*>(smem + KD_OFF_P);  // [KD_WARPS][2]
  if (ncand > 0) {  // block-uniform
    constexpr int U = 8;  // 16 took the 8-row build past 128 registers on sm_90: one block per SM, not two
    const int ntok = i1 - i0 + 1, npairs = ncand * ntok;
    const int dc = KD_WARPS / ntok, dt = KD_WARPS % ntok;  // pair e + KD_WARPS: candidate + dc, token + dt
    kd_u32 m0 = 0, m1 = 0;  // this warp's visible candidates 0..31, 32..63
    // pair e = cand ntok + tok (warp-uniform), e = warp + KD_WARPS r
    int cand = warp / ntok, tok = warp % ntok;
    for (int e0 = warp; e0 < npairs; e0 += U * KD_WARPS) {
      kd_u32 seen[U];
      int cu[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // every load first, then the votes
        const int s0 = kv_begin + (nlin + cand) * KD_BN, pos = s0 + lane;
        seen[u] = 0u;
        cu[u] = cand;
        if (cand < ncand) {
          if (s0 < prefix)  // the candidate holds prefix columns: every row sees them
            seen[u] = 1u;
          else if (pos < kv_end)
            seen[u] = mask[mask_base + static_cast<kd_i64>(KD_MUT_MASK_ROW(i0 + tok, n)) * mask_pitch + prefix +
                           KD_MUT_MASK_COL(pos - prefix, n)];
        }
        cand += dc;
        tok += dt;
        if (tok >= ntok) { tok -= ntok; ++cand; }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (__any_sync(0xffffffffu, seen[u] != 0u)) {  // (past the last pair: seen 0)
          if (cu[u] < 32) m0 |= 1u << cu[u]; else m1 |= 1u << (cu[u] - 32);
        }
    }
    if (lane == 0) { sVisW[2 * warp] = m0; sVisW[2 * warp + 1] = m1; }
  }
#endif
  if (nlin > 0)
    copy_step(0, row_src(kv_begin + ld_row, idx0));
  else
    kd::cp_async_commit();  // an empty group: the wait for Q below counts on one group after it
  if (nlin > 1) prefetch_l2(row_src(kv_begin + KD_BN + ld_row, idx1));
  // The split that reaches the draft reads, at its last step, bytes nothing has touched yet: the
  // mask's draft columns of this block's tokens and (sglang layout) the draft's V rows. Pull them
  // into L2 now, so that step waits on L2, not on DRAM (for short KV this overlaps the index chain).
  if (kv_end > prefix) {
    if (mask) {
      for (int i = i0 + tid; i <= i1; i += KD_THREADS) {
        const kd_u8* mrow = mask + mask_base + static_cast<kd_i64>(i) * mask_pitch + prefix;
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(mrow));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(mrow + n - 1));
      }
    }
    if (!p.unified) {
      const int first = max(kv_begin, pool_len) - pool_len, last = kv_end - pool_len;  // draft rows here
      for (int e = first * 8 + tid; e < last * 8; e += KD_THREADS)  // 8 lines of 128 B per V row
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vg + static_cast<kd_i64>(qs + (e >> 3)) * p.v_stride_tok + (e & 7) * 64));
    }
  }

  // ---- Q as B fragments, this warp's dim group only: B[k = dim][n = row] = q[row][dim] --------
  // QK warp: KV m-tile mg, dim group dg, query half nh
  const int mg = warp & 1, dg = (warp >> 1) & (KD_KG - 1), nh = warp / (2 * KD_KG);
  const int nt0 = nh * KD_NTH;  // this warp's first query n-tile in QK
  // does this QK warp's n-tile nt exist / softmax column col_of(j) exist (warp-uniform)
  auto has_tile = [&](int nt) { return KD_EVEN || nt0 + nt < KD_NT; };
  auto col_of = [&](int j) { return warp + KD_WARPS * j; };  // this warp's softmax column j
  auto has_col = [&](int j) { return KD_WARPS * KD_NTH == KD_NQ || col_of(j) < KD_NQ; };
  // qf[nt][ks] = {q[8nt + g][d + 2t, +1], q[8nt + g][d + 8 + 2t, +1]}, d = 16 (dg + 4 ks) (k-step
  // dg + 4 ks: see the QK loop). ldmatrix matrix m of a lane's x4 is 8 Q rows x 8 dims: k-step
  // ks + (m >> 1), dims + 8 (m & 1); its lane (g, t) receives row g, dims 2t, 2t + 1
  kd::cp_async_wait<1>();  // Q's group landed (the first tile's, committed after it, may still fly)
  __syncthreads();         // (and the visibility flags are published)
#if KD_GATHER
  if (ncand > 0) {  // block-uniform: the column list. Lane l holds candidates l and l + 32: their
    // column words and, by a scan of their counts, where their columns start in the list; warp w
    // writes the columns of candidates w, w + 8, ...
    const kd_u32 wa = lane < ncand ? sColW[lane] : 0u, wb = lane + 32 < ncand ? sColW[lane + 32] : 0u;
    int ia = __popc(wa), ib = __popc(wb);  // inclusive scans over the lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int xa = __shfl_up_sync(0xffffffffu, ia, d), xb = __shfl_up_sync(0xffffffffu, ib, d);
      if (lane >= d) { ia += xa; ib += xb; }
    }
    const int ta = __shfl_sync(0xffffffffu, ia, 31), ncols = ta + __shfl_sync(0xffffffffu, ib, 31);
    const int oa = ia - __popc(wa), ob = ta + ib - __popc(wb);  // exclusive: candidate lane, lane + 32
    for (int c = warp; c < ncand; c += KD_WARPS) {  // warp-uniform
      const kd_u32 cw = __shfl_sync(0xffffffffu, c < 32 ? wa : wb, c & 31);
      const int off = __shfl_sync(0xffffffffu, c < 32 ? oa : ob, c & 31);
      if ((cw >> lane) & 1u) sCol[off + __popc(cw & ((1u << lane) - 1u))] = static_cast<unsigned short>(c * KD_BN + lane);
    }
    if (tid < 3 * KD_BN) sCol[ncols + tid] = KD_COL_END;  // the last tile's rest and the look-ahead
    // the prologue's steps 1, 2 where they are gathered (nlin >= 1 here), their indices in flight
    // before Q's fragments fill the registers: the list is published by one more barrier
    __syncthreads();
    if (nlin < 3) {
      if (nlin == 1) idx1 = fetch_index(pos_of(1, ld_row));
      idx2 = fetch_index(pos_of(2, ld_row));
    }
  }
#else
  if (ncand > 0) {  // block-uniform: every warp counts the visible candidates, warp 0 lists their starts
    kd_u32 b0 = 0, b1 = 0;  // the visible candidates: every warp's votes
#pragma unroll
    for (int w = 0; w < KD_WARPS; ++w) {
      const uint2 m = *reinterpret_cast<const uint2*>(sVisW + 2 * w);
      b0 |= m.x;
      b1 |= m.y;
    }
    const bool v0 = (b0 >> lane) & 1u, v1 = (b1 >> lane) & 1u;
    const int nvis = __popc(b0) + __popc(b1);
    if (warp == 0) {
      const kd_u32 below = (1u << lane) - 1u;
      if (v0) sTab[__popc(b0 & below)] = kv_begin + (nlin + lane) * KD_BN;
      if (v1) sTab[__popc(b0) + __popc(b1 & below)] = kv_begin + (nlin + lane + 32) * KD_BN;
      if (lane < 3) sTab[nvis + lane] = kv_end;
    }
    // the prologue's steps 1, 2 where they are table steps: the first visible candidates, read off
    // the vote words (every thread has them), so their indices are in flight before Q's
    // fragments fill the registers and before the table is published
    if (nlin < 3) {
      unsigned long long bits = (static_cast<unsigned long long>(b1) << 32) | b0;
      const int c1 = __ffsll(static_cast<long long>(bits)) - 1;  // -1: none
      bits &= bits - 1;
      const int c2 = __ffsll(static_cast<long long>(bits)) - 1;
      const int s1 = c1 < 0 ? kv_end : kv_begin + (nlin + c1) * KD_BN;
      const int s2 = c2 < 0 ? kv_end : kv_begin + (nlin + c2) * KD_BN;
      if (nlin == 1) idx1 = fetch_index(s1 + ld_row);
      idx2 = fetch_index((nlin == 1 ? s2 : s1) + ld_row);
    }
  }
#endif
  kd_u32 qf[KD_NTH][KD_KSTEPS][2];
  {
    const int mi = lane >> 3;
#pragma unroll
    for (int nt = 0; nt < KD_NTH; ++nt) {
      const int row = (nt0 + nt) * 8 + (lane & 7);
      if (!has_tile(nt)) {  // a missing n-tile: zeros (its MMAs are skipped anyway)
#pragma unroll
        for (int ks = 0; ks < KD_KSTEPS; ++ks) qf[nt][ks][0] = qf[nt][ks][1] = 0u;
        continue;
      }
#pragma unroll
      for (int ks = 0; ks + 1 < KD_KSTEPS; ks += 2) {
        kd_u32 r4[4];
        kd::ldsm_x4(s_q + tile_off(row, 2 * (dg + KD_KG * (ks + (mi >> 1))) + (mi & 1)), r4);
        qf[nt][ks][0] = r4[0]; qf[nt][ks][1] = r4[1];
        qf[nt][ks + 1][0] = r4[2]; qf[nt][ks + 1][1] = r4[3];
      }
      if (KD_KSTEPS % 2) {
        constexpr int ks = KD_KSTEPS - 1;
        kd_u32 r2[2];
        kd::ldsm_x2(s_q + tile_off(row, 2 * (dg + KD_KG * ks) + (mi & 1)), r2);
        qf[nt][ks][0] = r2[0]; qf[nt][ks][1] = r2[1];
      }
    }
  }
  __syncthreads();  // the first step copies the next tile over Q (and the skip table is published)

  float m_run[KD_NTH], l_run[KD_NTH];  // softmax state of columns col_of(j): max (log2
                                           // units, the warp's), this lane's share of the sum
  // O^T fragments: dims KD_VDIMS_WARP warp + 16 mt + (g, g + 8), cols 8 nt + 2t (+1)
  float o[KD_VMT][KD_NT][4];
#pragma unroll
  for (int j = 0; j < KD_NTH; ++j) { m_run[j] = KD_M_FLOOR; l_run[j] = 0.f; }
#pragma unroll
  for (int mt = 0; mt < KD_VMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < KD_NT; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[mt][nt][x] = 0.f;

  // bit j: query column col_of(j) holds a row; a step wholly inside the prefix sees all of it
  kd_u32 vis_live = 0;
#pragma unroll
  for (int j = 0; j < KD_NTH; ++j) vis_live |= has_col(j) && col_of(j) < nrows ? 1u << j : 0u;

  // ---- the phases of a step, called in order by the step loop below

  // which of this lane's scores of step it (start: its first row) are visible: bit j for query
  // column col_of(j), KV row start + lane (gathered: the column list's row). A step wholly inside
  // the prefix (every step but a split's last, mostly) sees all of it; otherwise the mask's bytes
  // are loaded here, all at once, and arrive during QK.
  auto step_vis = [&](int it, int start) -> kd_u32 {
    const bool gathered = KD_GATHER && it >= nlin;  // block-uniform: rows from the column list
    const int pos = KD_GATHER ? pos_of(it, lane) : start + lane;
    const bool plain = !gathered && start + KD_BN <= prefix && start + KD_BN <= kv_end;  // block-uniform
    if (plain) return vis_live;
    kd_u32 vis = 0;
#pragma unroll
    for (int j = 0; j < KD_NTH; ++j) {
      bool visible = ((vis_live >> j) & 1u) && pos < kv_end;  // idle columns (q >= nrows) see nothing: p = 0
      if (visible && pos >= prefix) {
        const int i = sTok[col_of(j)], jc = pos - prefix;
        if (mask)
          visible = mask[mask_base + static_cast<kd_i64>(KD_MUT_MASK_ROW(i, n)) * mask_pitch + prefix +
                         KD_MUT_MASK_COL(jc, n)] != 0;
        else
          visible = !p.causal || jc <= i;
      }
      vis |= visible ? 1u << j : 0u;
    }
    return vis;
  };

  // QK: partial S^T of KV m-tile mg over dim group dg, into sS[dg][col][row]
  auto qk_phase = [&](kd_u32 s_tile) {
    float s[KD_NTH][4];
#pragma unroll
    for (int nt = 0; nt < KD_NTH; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) s[nt][x] = 0.f;
    // dim group dg takes k-steps dg, dg + 4, ..., dg + 32: the 16-byte chunk of k-step dg + 4 ks is
    // 2 dg + 8 ks (+1 for lanes 16..31), and its swizzled place is ((2 dg + hi) ^ (row & 7)) + 8 ks,
    // so a lane's address is one register plus a compile-time offset per k-step
    const int lr = mg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;  // this lane's ldmatrix row
    const kd_u32 a_lane = s_tile + lr * KD_ROW_BYTES + ((((2 * dg + (lane >> 4)) ^ KD_MUT_SWZ_READ(lr)) & 7) << 4);
    // A fragments double-buffered: k-step ks + 1's ldmatrix is in flight while ks's MMAs issue
    // (at 16 warps, 128 registers, single-buffered: the other warps hide the load instead)
    constexpr int kABufs = KD_NH == 2 ? 1 : 2;
    kd_u32 a[2][4];
    if (!KD_KO_NO_QK) kd::ldsm_x4(a_lane, a[0]);
#pragma unroll
    for (int ks = 0; ks < KD_KSTEPS && !KD_KO_NO_QK; ++ks) {
      if (kABufs == 1 && ks > 0) kd::ldsm_x4(a_lane + ks * 128, a[0]);
      if (kABufs == 2 && ks + 1 < KD_KSTEPS) kd::ldsm_x4(a_lane + (ks + 1) * 128, a[(ks + 1) & 1]);
      if (KD_MUT_QK_DIMS(KD_D) < KD_D && (dg + KD_KG * ks) * 16 >= KD_MUT_QK_DIMS(KD_D)) continue;
#pragma unroll
      for (int nt = 0; nt < KD_NTH; ++nt)
        if (has_tile(nt)) kd::mma_bf16(s[nt], a[kABufs == 2 ? ks & 1 : 0], qf[nt][ks][0], qf[nt][ks][1]);
    }
    // S^T fragment (row = KV mg*16 + g (+8), col = query 8 (nt0 + nt) + 2t (+1)) -> sS[dg][col][row]
#pragma unroll
    for (int nt = 0; nt < KD_NTH; ++nt) {
      if (!has_tile(nt)) continue;
      float* d0 = sS + (dg * KD_NQ + (nt0 + nt) * 8 + 2 * t) * KD_SPITCH + mg * 16 + g;
      d0[0] = s[nt][0];
      d0[KD_SPITCH] = s[nt][1];
      d0[8] = s[nt][2];
      d0[KD_SPITCH + 8] = s[nt][3];
    }
  };

  // sglang layout: the draft's V comes from v, not from k's first 512 dims. Called by every
  // thread once the step's QK reads of the tile are done; PV reads it after the next barrier.
  // Whether the step needs it is block-uniform (the steps that reach the draft).
  // (vstart: the step's start, read again from the table, not held in a register across QK)
  auto needs_vcopy = [&](int it, int vstart) {
    return !p.unified && ((KD_GATHER && it >= nlin) || vstart + KD_BN > pool_len);
  };
  // (slot: the ring slot the copies land in; wait: wait for them here, else the caller does)
  auto vcopy = [&](int it, int slot, int vstart, bool wait) {
    const bool gathered = KD_GATHER && it >= nlin;
    const kd_u32 tile_s = s_ring + slot * KD_STAGE_BYTES;
    for (int e = tid; e < KD_BN * (KD_DL / 8); e += KD_THREADS) {  // all copies in flight at once
      const int r = e / (KD_DL / 8), c = e % (KD_DL / 8);
      const int vpos = gathered ? pos_of(it, r) : vstart + r;
      if (vpos >= pool_len && vpos < kv_end)
        kd::cp_async_16(tile_s + tile_off(r, c), vg + static_cast<kd_i64>(qs + vpos - pool_len) * p.v_stride_tok + c * 8, true);
    }
    kd::cp_async_commit();
    if (wait) kd::cp_async_wait<0>();  // this thread's copies (and the next step's tile) landed; the
  };                                   // barrier after it publishes them before PV
  // The 8-row build (kEarlyV) waits for the draft's V only behind the softmax, so its flight
  // overlaps the softmax; and at a split's last step, where the other ring slot is free (no next
  // tile; every warp's PV of the step before is behind the step's barrier), the copy goes there
  // before QK and overlaps QK too, and PV reads a draft row's V from that slot at its row's place.
  // That is the seed's shape: one step, whose draft V was an L2 round trip in series. Off in the
  // two mutants that move V's dims or the slot a step reads (each stays the one wrong thing it
  // names), and in the larger builds, whose code stays as measured.
  constexpr bool kEarlyV = KD_NT == 1 && KD_NH == 1 && KD_MUT_V_DIM0 == 0 && KD_MUT_READ_STAGE(0, true) == 0;

  // online softmax: column col_of(j), lane = KV row of this step. Each lane keeps its own share of
  // the column's sum (reduced once, at the end), and the column's max moves only when a score
  // passes it by more than KD_MAX_SLACK (log2 units): until then p <= 2^KD_MAX_SLACK (fine in
  // fp32 and bf16) and the rescale is 1, so a step costs one vote per warp, not two five-level
  // shuffle reductions per column and a rescale of O. Returns: did a column of this warp move
  // its max (warp-uniform); P (bf16) and the rescales go to shared memory.
  auto softmax_phase = [&](kd_u32 vis) -> bool {
    // every column's score first (their shared-memory loads in flight together), then one vote:
    // does any column's max move this step? Only then the per-column votes and reductions
    if (KD_KO_NO_SOFTMAX) {
#pragma unroll
      for (int j = 0; j < KD_NTH; ++j)
        if (has_col(j)) sP[col_of(j) * KD_PPITCH + lane] = __float2bfloat16(0.01f);
      return false;
    }
    float x[KD_NTH];
    bool moves = false;
#pragma unroll
    for (int j = 0; j < KD_NTH; ++j) {
      const float* sc = sS + col_of(j) * KD_SPITCH + lane;
      x[j] = has_col(j) ? (sc[0] + sc[KD_NQ * KD_SPITCH]) + (sc[2 * KD_NQ * KD_SPITCH] + sc[3 * KD_NQ * KD_SPITCH])
                        : -KD_INF;  // a missing column (its vis bit is 0 too)
    }
    // the score in log2 units, -inf where not visible (one branch for the cap, not one per column)
    if (cap > 0.f) {
#pragma unroll
      for (int j = 0; j < KD_NTH; ++j) x[j] = cap * tanhf(x[j] * scale / cap) * KD_LOG2E;
    } else {
#pragma unroll
      for (int j = 0; j < KD_NTH; ++j) x[j] *= scale_log2;
    }
#pragma unroll
    for (int j = 0; j < KD_NTH; ++j) {
      if (!((vis >> j) & 1u)) x[j] = -KD_INF;
      moves |= x[j] > m_run[j] + KD_MAX_SLACK;
    }
    float alpha[KD_NTH];
#pragma unroll
    for (int j = 0; j < KD_NTH; ++j) alpha[j] = 1.f;
    const bool warp_moved = __any_sync(0xffffffffu, moves);
    if (warp_moved) {  // rare after the start
#pragma unroll
      for (int j = 0; j < KD_NTH; ++j) {
        if (__any_sync(0xffffffffu, x[j] > m_run[j] + KD_MAX_SLACK)) {
          const float m_new = fmaxf(m_run[j], kd::warp_max(x[j]));
          alpha[j] = kd::fast_exp2(m_run[j] - m_new);
          l_run[j] *= alpha[j];
          m_run[j] = m_new;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < KD_NTH; ++j) {
      const float pj = kd::fast_exp2(x[j] - m_run[j]);
      l_run[j] += pj;  // this lane's share
      if (!has_col(j)) continue;
      sP[col_of(j) * KD_PPITCH + lane] = __float2bfloat16(pj);
      if (lane == 0) sAlpha[col_of(j)] = alpha[j];
    }
    return warp_moved;
  };

  // PV: O^T[KD_VDIMS_WARP dims of this warp x NQ] = alpha * O^T + V^T P^T; moved: did any column
  // move its max this step (block-uniform: only then are the rescales read and applied)
  // (vaside: this step's draft rows' V is in the other ring slot, at their rows' places; step it)
  auto pv_phase = [&](kd_u32 s_tile, bool moved, bool vaside, int it) {
    if (moved) {
#pragma unroll
      for (int nt = 0; nt < KD_NT; ++nt) {
        const float2 al = *reinterpret_cast<const float2*>(sAlpha + nt * 8 + 2 * t);
#pragma unroll
        for (int mt = 0; mt < KD_VMT; ++mt) {
          o[mt][nt][0] *= al.x; o[mt][nt][1] *= al.y;
          o[mt][nt][2] *= al.x; o[mt][nt][3] *= al.y;
        }
      }
    }
    // P^T as B fragments: rows 8nt.. of P, KV 0..31 -> {ks0: r0, r1; ks1: r2, r3}. At 16 warps
    // (128 registers) each k-step's half is loaded just before its MMAs instead (x2: KV
    // 16 ks .. 16 ks + 15), 2 KD_NT registers fewer held
    constexpr bool kPbPerStep = KD_NH == 2;
    kd_u32 pb[KD_NT][4];
#pragma unroll
    for (int nt = 0; nt < KD_NT; ++nt)
      if (!kPbPerStep && !KD_KO_NO_PV) kd::ldsm_x4(s_p + ((nt * 8 + (lane & 7)) * KD_PPITCH + (lane >> 3) * 8) * 2, pb[nt]);
    // V^T: lane row (lane & 7) + 8 (lane >> 4) of each 16-row k-step, chunk
    // V_DIM0/8 + KD_VCH warp + 2 mt + hi, swizzled in its low 3 bits by the row's (lane & 7)
    const int vr0 = (lane & 7) + (lane >> 4) * 8, vhi = (lane >> 3) & 1;
    // where this lane's V rows vr0 and vr0 + 16 are: the K tile, or (vaside, a draft row) the
    // same place in the other slot
    kd_i32 vslot[2] = {0, 0};
    if (kEarlyV && vaside) {  // block-uniform
      const kd_i32 other = static_cast<kd_i32>(s_ring + (KD_STAGE_BYTES ^ (s_tile - s_ring)) - s_tile);
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int vpos = pos_of(it, vr0 + 16 * ks);
        vslot[ks] = vpos >= pool_len && vpos < kv_end ? other : 0;
      }
    }
    kd_u32 v_lane[KD_VMT];
#pragma unroll
    for (int mt = 0; mt < KD_VMT; ++mt) {
      const int vc = KD_MUT_V_DIM0 / 8 + warp * KD_VCH + 2 * mt + vhi;
      v_lane[mt] = s_tile + vr0 * KD_ROW_BYTES + (((vc & ~7) | ((vc ^ KD_MUT_SWZ_READ(vr0)) & 7)) << 4);
    }
#pragma unroll
    for (int ks = 0; ks < 2 && !KD_KO_NO_PV; ++ks) {
      if (kPbPerStep) {
#pragma unroll
        for (int nt = 0; nt < KD_NT; ++nt) {
          kd_u32 h[2];
          kd::ldsm_x2(s_p + ((nt * 8 + (lane & 7)) * KD_PPITCH + ks * 16 + ((lane >> 3) & 1) * 8) * 2, h);
          pb[nt][2 * ks] = h[0];
          pb[nt][2 * ks + 1] = h[1];
        }
      }
#pragma unroll
      for (int mt = 0; mt < KD_VMT; ++mt) {
        kd_u32 a[4];
        kd::ldsm_x4_trans(v_lane[mt] + ks * 16 * KD_ROW_BYTES + (kEarlyV ? vslot[ks] : 0), a);
#pragma unroll
        for (int nt = 0; nt < KD_NT; ++nt) kd::mma_bf16(o[mt][nt], a, pb[nt][2 * ks], pb[nt][2 * ks + 1]);
      }
    }
  };

  // ---- all warps in one phase: QK, softmax, PV, a block barrier between each
  // KD_SKIP: the compacted sequence (the loader follows it too) ends at a start of kv_end; the loop
  // keeps no step count, a register fewer at the 40-row build's limit. Else nlin steps in order.
  constexpr bool kCopyAfterBarrier = KD_NH == 1;  // (see the step's first barrier)
  for (int it = 0; KD_KO != KD_KO_LOOP && (KD_SKIP || it < nlin); ++it) {
    const int start = step_start(it);
    if (KD_SKIP && start >= kv_end) break;  // block-uniform
    const int stage = it & 1;
    const int next = step_start(it + 1);
    const bool last = KD_SKIP ? next >= kv_end : it + 1 == nlin;  // block-uniform
    // 8 warps: one barrier for two things: this step's tile has landed for every thread, and every
    // warp is done with the previous step's tile (its PV), so the next step's copy may overwrite
    // it. The copy is issued after the wait and the barrier (before them, until this change), still
    // a step ahead of its use; so only this step's tile is in flight at the wait, not two (a cost
    // to measure where the step is short against memory latency). 16 warps (128
    // registers) keep the copy before the wait and a barrier after PV: the other order spills there.
    auto issue_next = [&]() {
      if (KD_KO_NO_LOADS) { kd::cp_async_commit(); return; }
      copy_step(stage ^ 1, row_src(KD_GATHER ? pos_of(it + 1, ld_row) : next + ld_row, idx1));
      idx1 = idx2;                                           // step it + 2
      idx2 = fetch_index(pos_of(it + 3, ld_row));            // step it + 3
      // (the 16-warp builds keep their measured loop, L2 prefetch and all: without it the sm_120
      // 40-row build spills; they are a choice to measure, not the plan's)
      if (KD_NH == 2) prefetch_l2(row_src(pos_of(it + 2, ld_row), idx1));
    };
    if (!kCopyAfterBarrier && !last) {
      issue_next();
      kd::cp_async_wait<1>();
    } else if (KD_KO != KD_KO_COPY_WAIT) {
      kd::cp_async_wait<0>();
    }
    __syncthreads();
    if (kCopyAfterBarrier && !last) issue_next();
    const kd_u32 s_tile = s_ring + KD_MUT_READ_STAGE(stage, last) * KD_STAGE_BYTES;
    const kd_u32 vis = step_vis(it, start);
    // kEarlyV at a split's last step: the draft's V into the free slot before QK (block-uniform)
    const bool vaside = kEarlyV && last && needs_vcopy(it, start);
    if (vaside) vcopy(it, stage ^ 1, start, false);
    qk_phase(s_tile);
    __syncthreads();
    const int vstart = step_start(it);
    const bool vc = needs_vcopy(it, vstart);  // block-uniform
    if (vc && !vaside) vcopy(it, stage, vstart, !kEarlyV);
    const bool warp_moved = softmax_phase(vis);
    if (kEarlyV && vc) kd::cp_async_wait<0>();  // this thread's V copies landed
    // the barrier also tells every warp whether any column's max moved (block-uniform): only then
    // are the rescales read and applied; it publishes the V copies before PV
    const bool moved = __syncthreads_or(warp_moved);
    pv_phase(s_tile, moved, vaside, it);
    if (!kCopyAfterBarrier) __syncthreads();  // the next step's copy overwrites this tile
  }
  // (the knockouts that leave copies in flight land them before the epilogue reuses the ring)
  if (KD_KO == KD_KO_LOOP || KD_KO == KD_KO_COPY_WAIT) kd::cp_async_wait<0>();
  if (kCopyAfterBarrier) __syncthreads();  // every warp's PV is done: the epilogue writes over the ring

  // ---- epilogue: O^T fragments (unnormalised) and each column's max and sum to shared memory
  // (the ring and score tile are free now), then whole rows out with 16-byte stores: one row of
  // the output or of the split's fp32 partial is 128 consecutive float4s
  float* sO = reinterpret_cast<float*>(smem);  // [KD_NQ][KD_OPITCH]
  float* sM = reinterpret_cast<float*>(smem + KD_OFF_P);
  float* sL = sM + KD_NQ;
  kd_i64* sDst = reinterpret_cast<kd_i64*>(sL + KD_NQ);  // each row's first element in out / o_part
  float* sInv = reinterpret_cast<float*>(sDst + KD_NQ);   // each row's 1 / sum (0: it saw nothing)
  const bool direct = p.nsplit == 1;
  // each row's destination, computed once (the store loop below then has no division by H)
  const int erows = *sRows;  // nrows (see sRows)
  if (tid < erows) {
    const int r = row0 + tid, i = r / H, h = r % H;
    sDst[tid] = direct ? static_cast<kd_i64>(qs + i) * p.out_stride_tok + static_cast<kd_i64>(h) * p.out_stride_head
                       : (static_cast<kd_i64>(split) * p.total_rows + static_cast<kd_i64>(qs + i) * H + h) * KD_DL;
  }
#pragma unroll
  for (int j = 0; j < KD_NTH; ++j) l_run[j] = kd::warp_sum(l_run[j]);
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < KD_NTH; ++j) {
      if (!has_col(j)) continue;
      sM[col_of(j)] = m_run[j];
      sL[col_of(j)] = l_run[j];
      sInv[col_of(j)] = l_run[j] > 0.f ? 1.f / l_run[j] : 0.f;  // one division per row, not per store
    }
  }
#pragma unroll
  for (int nt = 0; nt < KD_NT; ++nt)
#pragma unroll
    for (int mt = 0; mt < KD_VMT; ++mt) {
      float* d0 = sO + (nt * 8 + 2 * t) * KD_OPITCH + warp * KD_VDIMS_WARP + mt * 16 + g;  // bank 8t + 4c + g
      d0[0] = o[mt][nt][0];
      d0[KD_OPITCH] = o[mt][nt][1];
      d0[8] = o[mt][nt][2];
      d0[KD_OPITCH + 8] = o[mt][nt][3];
    }
  __syncthreads();
  // KD_EPI_ROWS rows per pass, a row's KD_DL / 4 float4s over consecutive threads
  static_assert(KD_THREADS % (KD_DL / 4) == 0, "the epilogue's passes cover whole rows");
  constexpr int KD_EPI_ROWS = KD_THREADS / (KD_DL / 4);
  const int d = (tid % (KD_DL / 4)) * 4;
  for (int q = tid / (KD_DL / 4); q < erows; q += KD_EPI_ROWS) {
    const float inv = sInv[q];
    const float4 v = *reinterpret_cast<const float4*>(sO + q * KD_OPITCH + d);
    const kd_i64 dst = sDst[q] + d;
    if (direct) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * inv, v.y * inv);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * inv, v.w * inv);
      uint2 packed;
      packed.x = *reinterpret_cast<const kd_u32*>(&lo);
      packed.y = *reinterpret_cast<const kd_u32*>(&hi);
      *reinterpret_cast<uint2*>(static_cast<bf16*>(p.out) + dst) = packed;
    } else {
      *reinterpret_cast<float4*>(p.o_part + dst) = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    }
  }
  if (tid < erows) {
    const int q = tid, r = row0 + q;
    const float l = sL[q];
    const float lse = l > 0.f ? (sM[q] + log2f(l)) * KD_LN2 : -KD_INF;
    const kd_i64 grow = static_cast<kd_i64>(qs + r / H) * H + r % H;
    if (direct) {
      if (p.lse) p.lse[grow] = lse;
    } else {
      p.lse_part[static_cast<kd_i64>(split) * p.total_rows + grow] = lse;
    }
  }
  // ---- the fused merge (KD_FUSED builds, nsplit > 1; kd_fused.cuh): no second kernel, so run() is
  // one launch. (KD_FUSED is a build option, not a run-time switch: the 40-row sm_90 build is at 255
  // registers, and this code beside its loop moves the loop's allocation into a spill there; the way
  // to meet, inside the fused builds only, is read at run time.) The skip builds, chosen for deep
  // trees at a short prefix, split little: their blocks merge many rows, a warp each; W 1 there also
  // keeps their 40-row sm_90 build out of a spill
  static_assert(KD_WARPS * KD_MAX_SPLITS * 4 <= KD_OFF_P, "the fused merge's weights fit the ring");
  if (KD_FUSED && !direct) kd_fused_merge<KD_WARPS>(p, smem, tid, warp, lane, erows, qs, H, KD_SKIP);  // block-uniform
}

#endif  // KD_PAIR

// Merge the splits of one (token, head) row: out = sum_s w_s o_s / sum_s w_s, w_s = exp(lse_s - max).
// One block per row: blockDim.y = G groups (G <= KD_MERGE_GROUPS, G <= nsplit, chosen by the
// plan: kdkit/kernel/schedule.py merge_groups) of KD_MERGE_THREADS threads, 4 output dims per
// thread. The block finds the max and the weights once (each thread reads at most two splits'
// LSE; the warps' values meet by one shared-memory read per lane and shuffles); group y then sums
// splits y, y + G, ... of its 4 dims, KD_MERGE_BATCH partial rows in flight per thread; the
// groups' sums meet in shared memory. The code is kept short (no loop unrolled beyond its batch):
// after an L2 flush, or in a decode step where other kernels have run since, its instructions
// come from memory too.
#define KD_MERGE_BATCH 4
extern "C" __global__ void __launch_bounds__(KD_MERGE_THREADS * KD_MERGE_GROUPS) kd_mla_tc_merge(const KdParams p) {
  static_assert(KD_DL == KD_MERGE_THREADS * 4, "the merge maps 4 output dims to each thread of a group");
  static_assert(KD_MAX_SPLITS <= 2 * KD_MERGE_THREADS, "each merge thread holds at most two splits' LSE");
  static_assert(KD_MERGE_THREADS / 32 * KD_MERGE_GROUPS <= 32, "one lane per warp of the block");
  __shared__ float s_w[KD_MAX_SPLITS];
  __shared__ float s_red[2][32];
  __shared__ float4 s_acc[KD_MERGE_GROUPS][KD_MERGE_THREADS];
  const int grow = blockIdx.x, tx = threadIdx.x, gy = threadIdx.y, G = blockDim.y;
  const int tid = gy * KD_MERGE_THREADS + tx, nthreads = KD_MERGE_THREADS * G, lane = tid & 31, warp = tid >> 5;
  const int nwarps = KD_MERGE_THREADS / 32 * G;
  const int ns = p.nsplit, rows = p.total_rows;
  const float ls0 = tid < ns ? p.lse_part[static_cast<kd_i64>(tid) * rows + grow] : -KD_INF;
  const float ls1 = tid + nthreads < ns ? p.lse_part[static_cast<kd_i64>(tid + nthreads) * rows + grow] : -KD_INF;
  float m = kd::warp_max(fmaxf(ls0, ls1));
  if (lane == 0) s_red[0][warp] = m;
  __syncthreads();
  m = kd::warp_max(lane < nwarps ? s_red[0][lane] : -KD_INF);
  // an empty split (lse -inf) weighs nothing, and so does every split of a row that sees nothing;
  // their partial rows are written as zeros, so reading them below is harmless
  const float w0 = (m == -KD_INF || ls0 == -KD_INF) ? 0.f : KD_MUT_MERGE_W(exp2f((ls0 - m) * KD_LOG2E));
  const float w1 = (m == -KD_INF || ls1 == -KD_INF) ? 0.f : KD_MUT_MERGE_W(exp2f((ls1 - m) * KD_LOG2E));
  if (tid < ns) s_w[tid] = w0;
  if (tid + nthreads < ns) s_w[tid + nthreads] = w1;
  const float wpart = kd::warp_sum(w0 + w1);
  if (lane == 0) s_red[1][warp] = wpart;
  __syncthreads();
  const float wsum = kd::warp_sum(lane < nwarps ? s_red[1][lane] : 0.f);
  const float* part = p.o_part + static_cast<kd_i64>(grow) * KD_DL + tx * 4;
  const kd_i64 split_pitch = static_cast<kd_i64>(rows) * KD_DL;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
  for (int s0 = gy; s0 < ns; s0 += KD_MERGE_BATCH * G) {
    float4 v[KD_MERGE_BATCH];
#pragma unroll
    for (int k = 0; k < KD_MERGE_BATCH; ++k) {  // past ns: nothing (weight 0)
      const int sp = s0 + k * G;
      v[k] = sp < ns ? *reinterpret_cast<const float4*>(part + sp * split_pitch) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < KD_MERGE_BATCH; ++k) {
      const int sp = s0 + k * G;
      const float w = sp < ns ? s_w[sp] : 0.f;
      acc.x = fmaf(w, v[k].x, acc.x); acc.y = fmaf(w, v[k].y, acc.y);
      acc.z = fmaf(w, v[k].z, acc.z); acc.w = fmaf(w, v[k].w, acc.w);
    }
  }
  s_acc[gy][tx] = acc;
  __syncthreads();
  if (gy != 0) return;
#pragma unroll 1
  for (int y = 1; y < G; ++y) {
    const float4 a = s_acc[y][tx];
    acc.x += a.x; acc.y += a.y; acc.z += a.z; acc.w += a.w;
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const int H = p.num_heads, tok = grow / H, h = grow % H;
  bf16* o = static_cast<bf16*>(p.out) + static_cast<kd_i64>(tok) * p.out_stride_tok +
            static_cast<kd_i64>(h) * p.out_stride_head + tx * 4;
  const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  uint2 packed;
  packed.x = *reinterpret_cast<const kd_u32*>(&lo);
  packed.y = *reinterpret_cast<const kd_u32*>(&hi);
  *reinterpret_cast<uint2*>(o) = packed;
  // lse = m + log(sum w) is exact only with the true weights: a mutant's weights show here too
  if (p.lse && tx == 0) p.lse[grow] = wsum > 0.f ? m + log2f(wsum) * KD_LN2 : -KD_INF;
}
