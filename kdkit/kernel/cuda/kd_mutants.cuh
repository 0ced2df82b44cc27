// Hooks for the mutants: deliberately wrong builds that the judge must catch (negative controls).
// The production kernel calls every hook below; each default is the identity. A mutant is one
// registry entry in kdkit/judge/wrong_kernels.py that redefines one hook with -D'HOOK(args)=expr'.
// Nothing else in the kernel changes, so a mutant differs from production by exactly one thing.
#pragma once

#ifndef KD_MUT_SCALE          // the softmax scale applied to q.k
#define KD_MUT_SCALE(s) (s)
#endif
#ifndef KD_MUT_MASK_ROW       // the mask row of draft token i (n draft tokens)
#define KD_MUT_MASK_ROW(i, n) (i)
#endif
#ifndef KD_MUT_MASK_COL       // the mask column of draft column j (n draft tokens)
#define KD_MUT_MASK_COL(j, n) (j)
#endif
#ifndef KD_MUT_KV_LEN         // the KV length of a request (prefix + draft)
#define KD_MUT_KV_LEN(len, prefix) (len)
#endif
#ifndef KD_MUT_MERGE_W        // the weight of one split in the log-sum-exp merge
#define KD_MUT_MERGE_W(w) (w)
#endif
#ifndef KD_MUT_QK_DIMS        // how many of the 576 score dims enter q.k
#define KD_MUT_QK_DIMS(d) (d)
#endif
#ifndef KD_MUT_V_DIM0         // the first dim of a KV row that is read as V
#define KD_MUT_V_DIM0 0
#endif
#ifndef KD_MUT_HEAD           // the head whose q row a (token, head) row reads
#define KD_MUT_HEAD(h, H) (h)
#endif
#ifndef KD_MUT_SWZ_READ       // the XOR swizzle the readers of a KV tile assume (writers use r & 7)
#define KD_MUT_SWZ_READ(r) ((r) & 7)
#endif
#ifndef KD_MUT_READ_STAGE     // the ring slot a step's QK and PV read (last: the split's last step)
#define KD_MUT_READ_STAGE(stage, last) (stage)
#endif
