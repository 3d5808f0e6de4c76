/*
 * What the portable driver hands the per-ISA kernels for one call: the validated problem, block
 * sizes, the visibility window and the packed operands of the heads being worked on. Each task
 * also gets a workspace slot of its own (the tiles below) as an argument.
 *
 * A call runs head chunk by head chunk. For each chunk a pack pass converts that chunk's operands
 * once into the panel layouts the micro-kernel reads (below: f32, or bf16 pairs); then a compute
 * pass runs the tiles, every task reading the shared packs. Packing per tile instead would redo
 * the conversion and transposition once per row block, which costs as much as the products
 * themselves. Decoding (few query rows per head) packs nothing: see the end of this file.
 *
 * Layouts live here, not in the kernels, because the driver sizes every allocation before any
 * kernel runs (an allocation failure is reported before any output is written). Everything is
 * static inline so each per-ISA translation unit gets private copies.
 */
#ifndef MFA_CPU_PLAN_H
#define MFA_CPU_PLAN_H

#include "core/backend.h"

#include <stdint.h>
#include <string.h>

static const float mfa_cpu_log2e = 1.44269504088896341f;

/* One sequence of the problem: its lengths, where its rows start in the operand views, and its
 * visibility band (backend.h). Dense problems have one geometry for every batch index; packed
 * sequences (varlen) start at their offsets; a paged sequence has its own key count. */
typedef struct mfa_cpu_sequence {
    int64_t batch;   /* b: indexes the modifiers, the mask, and the dense or paged operands */
    int64_t q_first; /* the sequence's first row in q, out, lse, dout, dq (packed: cu_q[b]) */
    int64_t k_first; /* ... in k, v, dk, dv (packed: cu_k[b]; otherwise 0) */
    int64_t seq_q, seq_k;
    int64_t band_lo, band_hi; /* visible(i, j) = band_lo <= j - i <= band_hi */
    int64_t diag;             /* p(i) - i, the alignment of ALiBi */
} mfa_cpu_sequence;

typedef struct mfa_cpu_plan {
    const mfa_problem* problem;
    int64_t elem_size;
    /* Floats per packed panel (the micro-kernel's register width); every packed width is a
     * multiple, and the padded sequence lengths below are too. */
    int64_t panel_width;
    /* 1 when the products take bf16 operands in pairs (a 32-bit unit holds the values at two
     * consecutive reduction indices, as dot-product instructions read them); 0 for f32
     * operands, one value per unit. Every packed size below is counted in 32-bit units. */
    int operand_pairs;
    /* The longest sequence's lengths (dense: seq_q and seq_k; packed and paged: the longest
     * there is, not the bound the caller gave), padded: every pack and tile is sized by them. */
    int64_t seq_q_max, seq_k_max;
    int64_t seq_q_padded;
    int64_t seq_k_padded;
    /* Rows of one compute task: query rows (forward, dQ) or key rows (dK/dV); the reduction
     * side is walked in blocks of the other size. Multiples of panel_width, and no larger than
     * the padded sequence they walk, so that tiles are sized by the work. */
    int64_t block_q;
    int64_t block_k;
    /* The forward's longest block of keys, for keys that every row of a query block sees with
     * no mask: a multiple of block_k, at least block_k (forward_block_keys). */
    int64_t wide_block_k;
    /* Rows converted by one pack task. */
    int64_t pack_rows;
    /* The chunk: units (key/value heads of sequences) [first_kv_head, first_kv_head +
     * chunk_kv_heads), counted over batch x heads_kv, with all their query heads. */
    int64_t first_kv_head;
    int64_t chunk_kv_heads;
    /* The pass being run: its tasks, unit by unit of the chunk, are numbered consecutively;
     * unit u's start at task_prefix[u] (chunk_kv_heads + 1 entries), so that sequences of
     * different lengths get exactly the tasks their lengths need. */
    const int64_t* task_prefix;
    float* kv_packs; /* kv_pack_floats per key/value head of the chunk */
    int64_t kv_pack_floats;
    /* Backward: the query heads of each key/value head this pass handles, as members
     * [first_member, first_member + members) of its group. A group too large for the pack
     * budget takes several passes, and then kv_grads carries each key/value head's f32 dK and
     * dV (mfa_cpu_kv_grads) from pass to pass; NULL when one pass covers the group. */
    int64_t first_member;
    int64_t members;
    float* q_packs; /* q_pack_floats per query head of the pass (backward only) */
    int64_t q_pack_floats;
    float* kv_grads;
    int64_t kv_grads_floats;
    /* Backward: the key blocks of each key/value head are dealt round-robin to up to `stripes`
     * tasks; each stripe adds its dQ contributions into f32 accumulators of its own
     * (dq_stripe_floats per query head of the pass), which a last step sums in stripe order:
     * race-free and the same sum every run. */
    int64_t stripes;
    float* dq_stripes;
    int64_t dq_stripe_floats;
    /* Backward with sinks and dsinks: each query-side pack task leaves the sum of its rows'
     * p_sink * delta at sink_parts[(b * heads_q + h) * pack_blocks(seq_q_max) + block]; the
     * driver adds them up, in order, into dsinks. */
    double* sink_parts;
    /* Decoding (mfa_cpu_decode_*): the keys that some query row of a unit sees, split into
     * ranges of key_split_size keys starting at multiples of it (counted from the first
     * visible key rounded down to a decode block), each one task of the pass. With more than
     * one, every task leaves its rows' out and lse in partials (mfa_cpu_decode_partial_row_floats
     * per row, rows_max rows per task) and counts itself in its unit's splits_done (one counter
     * per unit, zero before the pass); the task that completes the count merges the unit. */
    int64_t key_split_size;
    int64_t* splits_done;
    float* partials;
} mfa_cpu_plan;

static inline int64_t mfa_cpu_round_up(int64_t n, int64_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

static inline int32_t mfa_cpu_read_i32(const char* p) {
    int32_t value;
    memcpy(&value, p, sizeof value);
    return value;
}

/* Sequence b's geometry. */
static inline mfa_cpu_sequence mfa_cpu_sequence_of(const mfa_cpu_plan* plan, int64_t b) {
    const mfa_problem* p = plan->problem;
    mfa_cpu_sequence s;
    s.batch = b;
    s.q_first = 0;
    s.k_first = 0;
    s.seq_q = p->seq_q;
    s.seq_k = p->seq_k;
    if (p->layout == MFA_LAYOUT_VARLEN) {
        const mfa_view* cu_q = &p->varlen.cu_seqlens_q;
        const mfa_view* cu_k = &p->varlen.cu_seqlens_k;
        s.q_first = mfa_cpu_read_i32(cu_q->data + 4 * b * cu_q->stride[3]);
        s.k_first = mfa_cpu_read_i32(cu_k->data + 4 * b * cu_k->stride[3]);
        s.seq_q = mfa_cpu_read_i32(cu_q->data + 4 * (b + 1) * cu_q->stride[3]) - s.q_first;
        s.seq_k = mfa_cpu_read_i32(cu_k->data + 4 * (b + 1) * cu_k->stride[3]) - s.k_first;
    } else if (p->layout == MFA_LAYOUT_PAGED) {
        const mfa_view* lengths = &p->paged.cache_seqlens;
        s.seq_k = mfa_cpu_read_i32(lengths->data + 4 * b * lengths->stride[0]) + p->paged.new_len;
    }
    if (p->layout == MFA_LAYOUT_DENSE) {
        s.band_lo = p->band_lo;
        s.band_hi = p->band_hi;
    } else {
        mfa_problem_band(p, s.seq_q, s.seq_k, &s.band_lo, &s.band_hi);
    }
    s.diag = p->alignment == MFA_ALIGN_BOTTOM_RIGHT ? s.seq_k - s.seq_q : 0;
    return s;
}

/* Unit u of the problem (a key/value head of a sequence) as (sequence, key/value head). */
static inline int64_t mfa_cpu_unit_batch(const mfa_cpu_plan* plan, int64_t u) {
    return u / plan->problem->heads_kv;
}

/* The unit of the chunk that task `task` of the current pass belongs to, and (into *local) the
 * task's index within that unit: the last unit whose first task is at or before it. */
static inline int64_t mfa_cpu_task_unit(const int64_t* prefix, int64_t units, int64_t task,
                                        int64_t* local) {
    int64_t lo = 0, hi = units; /* prefix[lo] <= task < prefix[hi] */
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (prefix[mid] <= task)
            lo = mid;
        else
            hi = mid;
    }
    *local = task - prefix[lo];
    return lo;
}

/* Keys [key_begin, key_end) are visible from query row i (possibly empty). */
static inline int64_t mfa_cpu_key_begin(const mfa_cpu_sequence* s, int64_t i) {
    const int64_t lo = i + s->band_lo;
    return lo > 0 ? lo : 0;
}

static inline int64_t mfa_cpu_key_end(const mfa_cpu_sequence* s, int64_t i) {
    const int64_t end = i + s->band_hi + 1;
    return end < s->seq_k ? end : s->seq_k;
}

/* Query rows [query_begin, query_end) see key j: the same rule solved for i. */
static inline int64_t mfa_cpu_query_begin(const mfa_cpu_sequence* s, int64_t j) {
    const int64_t lo = j - s->band_hi;
    return lo > 0 ? lo : 0;
}

static inline int64_t mfa_cpu_query_end(const mfa_cpu_sequence* s, int64_t j) {
    const int64_t end = j - s->band_lo + 1;
    return end < s->seq_q ? end : s->seq_q;
}

/* Blocks of `block` rows covering n rows. */
static inline int64_t mfa_cpu_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

/* Units holding `depth` consecutive reduction values: one per value, or one per pair. */
static inline int64_t mfa_cpu_units(const mfa_cpu_plan* plan, int64_t depth) {
    return plan->operand_pairs ? (depth + 1) / 2 : depth;
}

/* Carves consecutive 64-byte-aligned float arrays out of one region. With base NULL it only
 * counts, which is how the driver sizes the region. */
typedef struct mfa_cpu_carver {
    float* base;
    int64_t used;
} mfa_cpu_carver;

static inline float* mfa_cpu_carve(mfa_cpu_carver* carver, int64_t floats) {
    float* region = carver->base ? carver->base + carver->used : (float*)0;
    carver->used += mfa_cpu_round_up(floats, 16);
    return region;
}

/* ---- Packs: one head's operands as panels of 32-bit units ---------------------------------
 * "Transposed" panels (for Q K^T-type products, reduction over the head dimension): panel p holds
 * sequence rows [p*NR, p*NR + NR) as units(depth) x NR, at p * units(depth) * NR.
 * "Row" panels (for P V-type products, reduction over the sequence): panel p holds columns
 * [p*NR, p*NR + NR) of every sequence row as units(seq_padded) x NR, at
 * p * units(seq_padded) * NR. With operand pairs, unit (u, c) of a panel holds reduction
 * indices 2u (low half) and 2u + 1 (high half) of column c. */

/* The backward reads K and V as rows of the key block it works on (its products' A operands),
 * so its only panels of them are K's row panels for dQ. */
typedef struct mfa_cpu_kv_pack {
    float* kt; /* K, transposed panels (S = Q K^T); forward only */
    float* v;  /* V, row panels (O += P V); forward only */
    float* k;  /* K, row panels (dQ += dS K); backward only */
} mfa_cpu_kv_pack;

/* One operand of n padded sequence rows as transposed panels (reduction over its `depth`) or as
 * row panels (reduction over the sequence; `width` columns). */
static inline float* mfa_cpu_carve_transposed(mfa_cpu_carver* c, const mfa_cpu_plan* plan,
                                              int64_t depth, int64_t n) {
    return mfa_cpu_carve(c, mfa_cpu_units(plan, depth) * n);
}

static inline float* mfa_cpu_carve_row_panels(mfa_cpu_carver* c, const mfa_cpu_plan* plan,
                                              int64_t width, int64_t n) {
    return mfa_cpu_carve(c, mfa_cpu_round_up(width, plan->panel_width) * mfa_cpu_units(plan, n));
}

static inline int64_t mfa_cpu_kv_pack_carve(const mfa_cpu_plan* plan, int backward, float* base,
                                            mfa_cpu_kv_pack* pack) {
    const mfa_problem* p = plan->problem;
    const int64_t n = plan->seq_k_padded, d = p->head_dim, dv = p->head_dim_v;
    mfa_cpu_carver c = {base, 0};
    pack->kt = backward ? (float*)0 : mfa_cpu_carve_transposed(&c, plan, d, n);
    pack->v = backward ? (float*)0 : mfa_cpu_carve_row_panels(&c, plan, dv, n);
    pack->k = backward ? mfa_cpu_carve_row_panels(&c, plan, d, n) : (float*)0;
    return c.used;
}

typedef struct mfa_cpu_q_pack {
    float* qt;    /* Q, transposed panels (S^T = K Q^T) */
    float* q;     /* Q, row panels (dK += dS^T Q) */
    float* doutt; /* dO, transposed panels (dP^T = V dO^T) */
    float* dout;  /* dO, row panels (dV += P^T dO) */
    float* lse;   /* f32 lse; +inf for rows that see no key and for padding */
    float* delta; /* rowsum(dO * O); 0 for padding */
} mfa_cpu_q_pack;

static inline int64_t mfa_cpu_q_pack_carve(const mfa_cpu_plan* plan, float* base,
                                           mfa_cpu_q_pack* pack) {
    const mfa_problem* p = plan->problem;
    const int64_t n = plan->seq_q_padded, d = p->head_dim, dv = p->head_dim_v;
    mfa_cpu_carver c = {base, 0};
    pack->qt = mfa_cpu_carve_transposed(&c, plan, d, n);
    pack->q = mfa_cpu_carve_row_panels(&c, plan, d, n);
    pack->doutt = mfa_cpu_carve_transposed(&c, plan, dv, n);
    pack->dout = mfa_cpu_carve_row_panels(&c, plan, dv, n);
    pack->lse = mfa_cpu_carve(&c, n);
    pack->delta = mfa_cpu_carve(&c, n);
    return c.used;
}

/* One stripe's dQ accumulator for one query head: seq_q_padded rows of padded D. */
static inline int64_t mfa_cpu_dq_stripe_floats(const mfa_cpu_plan* plan) {
    return plan->seq_q_padded * mfa_cpu_round_up(plan->problem->head_dim, plan->panel_width);
}

/* The accumulator of stripe `stripe` for query head `member` (of the pass) of the chunk's key/value
 * head g_local. */
static inline float* mfa_cpu_dq_stripe(const mfa_cpu_plan* plan, int64_t g_local, int64_t stripe,
                                       int64_t member) {
    return plan->dq_stripes +
           ((g_local * plan->stripes + stripe) * plan->members + member) * plan->dq_stripe_floats;
}

/* The dK and dV accumulators of one key/value head between passes: seq_k_padded rows of padded
 * D, then seq_k_padded rows of padded Dv. */
typedef struct mfa_cpu_kv_grads {
    float* dk;
    float* dv;
} mfa_cpu_kv_grads;

static inline int64_t mfa_cpu_kv_grads_carve(const mfa_cpu_plan* plan, float* base,
                                             mfa_cpu_kv_grads* grads) {
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width, n = plan->seq_k_padded;
    mfa_cpu_carver c = {base, 0};
    grads->dk = mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim, nr) * n);
    grads->dv = mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim_v, nr) * n);
    return c.used;
}

/* ---- Per-thread tiles ---------------------------------------------------------------------- */

/* The distance in floats between rows of the forward's S (and, halved, of its P pairs) for tiles
 * of n_pad columns. Rows a multiple of 1 KiB apart fall into a few L1 sets (4 for 1 KiB, 2 for
 * 2 KiB, as the 512-key blocks of the AMX build are), and the 16 rows an AMX tile stores or loads
 * at once then evict each other: such rows get 32 floats more, which keeps P's rows of pairs at
 * 64-byte boundaries. bf16 forward at D 64 on Emerald Rapids: 3-11 % faster. */
static inline int64_t mfa_cpu_score_stride(int64_t n_pad) {
    return n_pad % 256 == 0 ? n_pad + 32 : n_pad;
}

/* Forward task: its Q rows (units(D) per row), S, P as operand units when they are pairs (else
 * P is S itself), the O accumulator, the running max and sum per row, and with a mask the
 * tile's additive bias (f32; -inf hides). */
typedef struct mfa_cpu_forward_tiles {
    float *q, *s, *p, *o, *row_max, *row_sum, *bias;
} mfa_cpu_forward_tiles;

static inline int64_t mfa_cpu_forward_tiles_carve(const mfa_cpu_plan* plan, float* base,
                                                  mfa_cpu_forward_tiles* tiles) {
    const mfa_problem* p = plan->problem;
    const int64_t bq = plan->block_q, bk = plan->wide_block_k;
    const int64_t dv = mfa_cpu_round_up(p->head_dim_v, plan->panel_width);
    mfa_cpu_carver c = {base, 0};
    tiles->q = mfa_cpu_carve(&c, bq * mfa_cpu_units(plan, p->head_dim));
    const int64_t s_ld = mfa_cpu_score_stride(bk); /* at least any block's own: bk is the widest */
    tiles->s = mfa_cpu_carve(&c, bq * s_ld);
    tiles->p = plan->operand_pairs ? mfa_cpu_carve(&c, bq * s_ld / 2) : tiles->s;
    tiles->o = mfa_cpu_carve(&c, bq * dv);
    tiles->row_max = mfa_cpu_carve(&c, bq);
    tiles->row_sum = mfa_cpu_carve(&c, bq);
    tiles->bias = mfa_view_present(&p->mask) ? mfa_cpu_carve(&c, bq * bk) : (float*)0;
    return c.used;
}

/* Backward task: its rows' operands (Q and dO for dQ, K and V for dK/dV), S/P/dS and dP in f32,
 * P and dS as operand units when they are pairs (else S itself), the accumulators (dQ, or dK
 * and dV), with a mask the tile's bias, and with softcap its derivative 1 - tanh^2 per pair.
 * Both kinds of task share one slot size. */
typedef struct mfa_cpu_backward_tiles {
    float *rows, *rows_out_grad;
    float *s, *dp, *operand;
    float *acc, *acc_v;
    float *bias, *softcap_grad;
} mfa_cpu_backward_tiles;

static inline int64_t mfa_cpu_backward_tiles_carve(const mfa_cpu_plan* plan, float* base,
                                                   mfa_cpu_backward_tiles* tiles) {
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width;
    const int64_t rows = plan->block_q > plan->block_k ? plan->block_q : plan->block_k;
    const int64_t d_pad = mfa_cpu_round_up(p->head_dim, nr);
    const int64_t dv_pad = mfa_cpu_round_up(p->head_dim_v, nr);
    mfa_cpu_carver c = {base, 0};
    tiles->rows = mfa_cpu_carve(&c, rows * mfa_cpu_units(plan, p->head_dim));
    tiles->rows_out_grad = mfa_cpu_carve(&c, rows * mfa_cpu_units(plan, p->head_dim_v));
    tiles->s = mfa_cpu_carve(&c, rows * rows);
    tiles->dp = mfa_cpu_carve(&c, rows * rows);
    tiles->operand = plan->operand_pairs ? mfa_cpu_carve(&c, rows * rows / 2) : tiles->s;
    tiles->acc = mfa_cpu_carve(&c, rows * d_pad);
    tiles->acc_v = mfa_cpu_carve(&c, rows * dv_pad);
    tiles->bias = mfa_view_present(&p->mask) ? mfa_cpu_carve(&c, rows * rows) : (float*)0;
    tiles->softcap_grad = p->softcap > 0.0f ? mfa_cpu_carve(&c, rows * rows) : (float*)0;
    return c.used;
}

/* ---- Decoding -------------------------------------------------------------------------------
 * When a key/value head has few query rows (group x seq_q), K and V are read where they lie,
 * one block of keys at a time, and the keys are split over tasks. Each task holds its rows'
 * queries (f32, and transposed for the products that put rows in lanes), a block of scores
 * (query-major, or key-major with the rows in the lanes: room for 16 rows either way), the
 * block's probabilities as bf16 pairs, its O accumulator (transposed with the rows in the
 * lanes) and running max and sum (16 rows' room at least), the addresses of the block's K and V
 * rows, where K or V cannot be read in place (f16, or elements not adjacent) one converted block
 * of each (V's tile also holds a block of V as bf16 pairs of rows, and the rows of O at the
 * start and end of a task in the lanes), and with a mask the block's bias. Decode blocks start
 * at multiples of their size, which is MFA_MASK_BLOCK, so that each is one column of a mask
 * summary. */
static const int64_t mfa_cpu_decode_block = 64;
/* The most query rows a unit takes to the decoding path. */
#define mfa_cpu_decode_max_rows 16

typedef struct mfa_cpu_decode_tiles {
    float *q, *qt, *s, *p_pairs, *o, *row_max, *row_sum, *k, *v, *bias;
    const char **key_rows, **next_key_rows, **value_rows;
} mfa_cpu_decode_tiles;

/* Query rows of one unit's decode task: group x seq_q of the longest sequence. */
static inline int64_t mfa_cpu_decode_rows(const mfa_cpu_plan* plan) {
    return plan->problem->group * plan->seq_q_max;
}

static inline int64_t mfa_cpu_decode_tiles_carve(const mfa_cpu_plan* plan, float* base,
                                                 mfa_cpu_decode_tiles* tiles) {
    const mfa_problem* p = plan->problem;
    const int64_t rows = mfa_cpu_decode_rows(plan), bk = mfa_cpu_decode_block;
    const int64_t lanes = mfa_cpu_round_up(rows, 16);
    const int64_t d = mfa_cpu_round_up(p->head_dim, 16), dv = mfa_cpu_round_up(p->head_dim_v, 16);
    const int64_t pointer_floats = (int64_t)(bk * sizeof(const char*) / sizeof(float));
    mfa_cpu_carver c = {base, 0};
    tiles->q = mfa_cpu_carve(&c, rows * d);
    tiles->qt = mfa_cpu_carve(&c, lanes * d);
    tiles->s = mfa_cpu_carve(&c, lanes * bk);
    tiles->p_pairs = mfa_cpu_carve(&c, lanes * bk / 2);
    tiles->o = mfa_cpu_carve(&c, lanes * dv);
    tiles->row_max = mfa_cpu_carve(&c, lanes);
    tiles->row_sum = mfa_cpu_carve(&c, lanes);
    tiles->k = mfa_cpu_carve(&c, bk * d);
    tiles->v = mfa_cpu_carve(&c, bk * dv);
    tiles->bias = mfa_view_present(&p->mask) ? mfa_cpu_carve(&c, lanes * bk) : (float*)0;
    tiles->key_rows = (const char**)mfa_cpu_carve(&c, pointer_floats);
    tiles->next_key_rows = (const char**)mfa_cpu_carve(&c, pointer_floats);
    tiles->value_rows = (const char**)mfa_cpu_carve(&c, pointer_floats);
    return c.used;
}

/* One task's partial result with split keys: per row, out normalized over the task's keys
 * (Dv floats, padded) then its natural-log lse. */
static inline int64_t mfa_cpu_decode_partial_row_floats(const mfa_cpu_plan* plan) {
    return mfa_cpu_round_up(plan->problem->head_dim_v + 1, 16);
}

#endif /* MFA_CPU_PLAN_H */
