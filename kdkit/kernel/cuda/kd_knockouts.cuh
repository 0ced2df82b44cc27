// Knockouts: timing-only builds with one part of the partial kernel switched off (kdkit/kernel/
// knockouts.py: `KernelConfig(knockout=...)`, `plan(knockout=...)`). Their results are wrong by
// design. The production build leaves KD_KO at 0, so every test below folds away.
#pragma once

#ifndef KD_KO
#define KD_KO 0
#endif
#define KD_KO_ENTRY 1      // return at entry
#define KD_KO_LOOP 2       // no KV step
#define KD_KO_LOADS 3      // no copy or index load in the loop
#define KD_KO_COPY_WAIT 4  // the loop's copies never waited for
#define KD_KO_QK 5         // no QK ldmatrix or MMA
#define KD_KO_SOFTMAX 6    // no softmax work
#define KD_KO_PV 7         // no PV ldmatrix or MMA
#define KD_KO_MMA_ONLY 8   // no loads and no softmax work: the step's MMAs, their ldmatrix and barriers
#define KD_KO_NO_MMA 9     // no QK and no PV: the step's loads, softmax and barriers
// the 64-row build's own (kd_pair.cuh: spec.KernelConfig refuses them in the other builds)
#define KD_KO_EXCHANGE 10  // no pair exchange: each warp keeps its half's partial scores
#define KD_KO_BARRIER 11   // no ring barrier at the step's start (copies still waited for; the draft V's stay)
#define KD_KO_LDSM 12      // no ldmatrix in QK or PV: the MMAs take their B operands from registers
// what each knockout switches off (the two combined ones bound what overlapping the parts can win)
#define KD_KO_NO_LOADS (KD_KO == KD_KO_LOADS || KD_KO == KD_KO_MMA_ONLY)
#define KD_KO_NO_SOFTMAX (KD_KO == KD_KO_SOFTMAX || KD_KO == KD_KO_MMA_ONLY)
#define KD_KO_NO_QK (KD_KO == KD_KO_QK || KD_KO == KD_KO_NO_MMA)
#define KD_KO_NO_PV (KD_KO == KD_KO_PV || KD_KO == KD_KO_NO_MMA)
