/*
 * The table one instruction-set build of the attention kernels exports. isa_select.cpp picks one
 * table per context; everything below a table entry runs at that single ISA. Task indices are
 * counted within the plan's head chunk; the mfa_cpu_*_tasks functions give the counts.
 */
#ifndef MFA_CPU_KERNELS_H
#define MFA_CPU_KERNELS_H

#include "cpu/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*mfa_cpu_task)(const mfa_cpu_plan* plan, int64_t task, float* slot);

typedef struct mfa_cpu_kernels {
    const char* isa_name;      /* "AVX-512 + BF16", "AVX-512", "AVX2", "NEON", "SSE2", "portable" */
    int64_t panel_width;       /* units per packed panel: the micro-kernel's register width */
    int bf16_pairs;            /* bf16 problems run on bf16 operand pairs (plan.h operand_pairs) */
    int64_t wide_block_k;      /* keys of a bf16 forward block that no mask or band cuts
                                  (plan.h wide_block_k); 0: plain blocks only */
    mfa_cpu_task append;       /* paged caches: one unit's k_new and v_new rows into the caches */
    mfa_cpu_task forward_pack; /* K and V of the chunk's key/value heads */
    mfa_cpu_task forward;      /* blocks of query rows: O and, if requested, lse */
    mfa_cpu_task backward_pack; /* K of the key/value heads; Q, dO, lse, delta =
                                   rowsum(dO * O) of the pass's query heads */
    mfa_cpu_task backward;      /* stripes of key blocks: dK, dV, and dQ into the stripe's sums */
    mfa_cpu_task backward_dq;   /* blocks of query rows: the stripes' dQ sums, scaled, stored */
    mfa_cpu_task decode;        /* one key range of one key/value head, all its query rows; the last
                            of a head's ranges to finish merges them into out and lse */
} mfa_cpu_kernels;

/* How many tasks a pass has for one unit (a key/value head of sequence s); the driver sums them
 * into the pass's task_prefix. */
typedef int64_t (*mfa_cpu_task_count)(const mfa_cpu_plan* plan, const mfa_cpu_sequence* s);

static inline int64_t mfa_cpu_pack_blocks(const mfa_cpu_plan* plan, int64_t seq) {
    return mfa_cpu_blocks(seq, plan->pack_rows);
}

static inline int64_t mfa_cpu_append_tasks(const mfa_cpu_plan* plan, const mfa_cpu_sequence* s) {
    (void)s;
    return plan->problem->paged.new_len > 0 ? 1 : 0;
}

static inline int64_t mfa_cpu_forward_pack_tasks(const mfa_cpu_plan* plan,
                                                 const mfa_cpu_sequence* s) {
    return mfa_cpu_pack_blocks(plan, s->seq_k);
}

static inline int64_t mfa_cpu_forward_tasks(const mfa_cpu_plan* plan, const mfa_cpu_sequence* s) {
    return plan->problem->group * mfa_cpu_blocks(s->seq_q, plan->block_q);
}

/* K is packed in the first pass over a group only; Q and dO in every pass. */
static inline int64_t mfa_cpu_backward_key_pack_tasks(const mfa_cpu_plan* plan,
                                                      const mfa_cpu_sequence* s) {
    return plan->first_member == 0 ? mfa_cpu_pack_blocks(plan, s->seq_k) : 0;
}

/* The stripes of a unit: no more than it has key blocks. */
static inline int64_t mfa_cpu_backward_tasks(const mfa_cpu_plan* plan, const mfa_cpu_sequence* s) {
    const int64_t blocks = mfa_cpu_blocks(s->seq_k, plan->block_k);
    return blocks < plan->stripes ? blocks : plan->stripes;
}

/* The packs of a unit, in blocks: K's, then each query head's Q and dO. */
static inline int64_t mfa_cpu_backward_unit_pack_tasks(const mfa_cpu_plan* plan,
                                                       const mfa_cpu_sequence* s) {
    return mfa_cpu_backward_key_pack_tasks(plan, s) +
           plan->members * mfa_cpu_pack_blocks(plan, s->seq_q);
}

/* A unit of one stripe runs whole in that stripe's task: its packs, its key blocks, and its dQ
 * (the stripe's sums are dQ). The pack and dQ passes have no task for it, so a chunk of such
 * units (many short heads) takes one pass where it would take three, and each unit's packs are
 * still in cache when its products read them. */
static inline int mfa_cpu_backward_whole_unit(const mfa_cpu_plan* plan, const mfa_cpu_sequence* s) {
    return mfa_cpu_backward_tasks(plan, s) == 1;
}

static inline int64_t mfa_cpu_backward_pack_tasks(const mfa_cpu_plan* plan,
                                                  const mfa_cpu_sequence* s) {
    return mfa_cpu_backward_whole_unit(plan, s) ? 0 : mfa_cpu_backward_unit_pack_tasks(plan, s);
}

static inline int64_t mfa_cpu_backward_dq_tasks(const mfa_cpu_plan* plan,
                                                const mfa_cpu_sequence* s) {
    return mfa_cpu_backward_whole_unit(plan, s)
               ? 0
               : plan->members * mfa_cpu_blocks(s->seq_q, plan->block_q);
}

/* Decoding: the keys some row of s sees, [first, end), with first rounded down to a decode
 * block; a unit with query rows has at least one task, even where it sees no key. */
static inline int64_t mfa_cpu_decode_first_key(const mfa_cpu_sequence* s) {
    return mfa_cpu_key_begin(s, 0) / mfa_cpu_decode_block * mfa_cpu_decode_block;
}

static inline int64_t mfa_cpu_decode_end_key(const mfa_cpu_sequence* s) {
    return s->seq_q > 0 ? mfa_cpu_key_end(s, s->seq_q - 1) : 0;
}

static inline int64_t mfa_cpu_decode_tasks(const mfa_cpu_plan* plan, const mfa_cpu_sequence* s) {
    if (s->seq_q == 0) return 0;
    const int64_t span = mfa_cpu_decode_end_key(s) - mfa_cpu_decode_first_key(s);
    const int64_t splits = mfa_cpu_blocks(span, plan->key_split_size);
    return splits > 1 ? splits : 1;
}

const mfa_cpu_kernels* mfa_cpu_kernels_portable(void);
#if defined(__x86_64__)
const mfa_cpu_kernels* mfa_cpu_kernels_avx2(void);
const mfa_cpu_kernels* mfa_cpu_kernels_avx512(void);
const mfa_cpu_kernels* mfa_cpu_kernels_amx_bf16(void);
const mfa_cpu_kernels* mfa_cpu_kernels_avx512_bf16(void);
#elif defined(__aarch64__)
const mfa_cpu_kernels* mfa_cpu_kernels_neon_bf16(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* MFA_CPU_KERNELS_H */
