/*
 * Decoding: few query rows per key/value head (group x seq_q, e.g. one new token per query head
 * against a long cache). Packing K and V into panels would cost as much as reading them, so these
 * tasks read K and V where they lie, one block of keys at a time, and are memory-bound: every
 * byte of K and V is read once per call. Rows are reached through their addresses (a block's
 * rows are gathered first), so dense, packed and paged caches run the same loops. The keys of
 * each unit are split into ranges, one task each, so that a single head's cache still keeps
 * every thread streaming; tasks of a split unit leave partial states, and the task that finishes
 * a unit's last range combines them through their log-sum-exps (decode_merge_unit, merge.h), in
 * one pool job per call. Sinks and an initial state enter the first range's rows only.
 *
 * A unit of few rows (at most W / 2: one new token per head, small groups) is bandwidth-bound: its
 * scores are dot products (rows of Q against rows of K, reduced across the vector), its softmax
 * runs row by row, and out is broadcasts (P times rows of V). A unit of more rows, up to W (query
 * groups: 4 new tokens of 4 query heads per KV head are 16 rows), multiplies every element of K and
 * V into each of its rows, which is compute-bound done that way; it keeps its rows in the lanes of
 * one vector through the whole block instead (but on AVX2, whose 8 lanes make that the slower way:
 * decode_task): scores K times Q transposed (one broadcast key element per FMA for all rows, no
 * reduction), the softmax on all rows per instruction, and O transposed += P V, one broadcast V
 * element per FMA. f32 and bf16 rows with adjacent elements are read in place, bf16 widened in
 * registers; on a bf16 dot-product build the products multiply bf16 pairs instead (keys as they
 * lie; in the lanes V interleaved a block at a time as pairs of rows and P rounded to bf16, as the
 * forward pass rounds it); anything else is converted a block at a time into the task's tiles
 * first. On the AMX build, bf16 pairs of a unit of more than W / 4 rows multiply on AMX tiles
 * instead (amx_scores, amx_values; the softmax stays on the lanes). Each products pass prefetches
 * the rows the next pass reads (row_prefetch).
 */
#ifndef MFA_CPU_DECODE_INL
#define MFA_CPU_DECODE_INL

#include "cpu/forward.inl"
#include "cpu/merge.h"
#include "cpu/pack.inl"
#include "cpu/plan.h"
#include "cpu/scores.inl"
#include "cpu/simd.inl"
#if MFA_CPU_AMX
#include "cpu/gemm_amx.inl"
#elif MFA_CPU_BF16_DOT
#include "cpu/gemm_bf16.inl"
#endif

#include <math.h>
#include <stdint.h>
#if MFA_CPU_BF16_DOT && defined(__x86_64__)
#include <immintrin.h>
#elif MFA_CPU_BF16_DOT && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace {

/* How rows of one storage dtype are read as f32 vectors, where they can be. */
template <class Storage>
struct vector_rows {
    enum { in_place = 0 };
    typedef f32_storage read_as; /* converted into f32 tiles first */
};

/* For the scores (dot_rows): each vector of a key row holds `step` elements, multiplied into
 * the sums by mac() with the query's vector at query_offset(x) floats of its row. */
template <>
struct vector_rows<f32_storage> {
    enum { in_place = 1, step = W };
    typedef f32_storage read_as;
    static vf load(const char* p) { return vload_units(p); }
    static int64_t query_offset(int64_t x) { return x; }
    static vf mac(vf acc, vf query, vf key) { return acc + query * key; }
};

template <>
struct vector_rows<bf16_storage> {
    enum { in_place = 1, step = W };
    typedef bf16_storage read_as;
    static vf load(const char* p) { return vload_bf16(p); }
    static int64_t query_offset(int64_t x) { return x; }
    static vf mac(vf acc, vf query, vf key) { return acc + query * key; }
};

#if MFA_CPU_BF16_DOT
/* bf16 key rows multiplied as they lie, pairs of adjacent elements, by a dot-product
 * instruction against the query rows as bf16 pairs too (bf16 inputs: exact, no rounding): 2W
 * elements per vector, half the instructions of widening them. */
struct bf16_pair_rows {
    enum { size = 2 };
};

template <>
struct vector_rows<bf16_pair_rows> {
    enum { in_place = 1, step = 2 * W };
    static vf load(const char* p) { return vload_units(p); }
    static int64_t query_offset(int64_t x) { return x / 2; }
#if defined(__x86_64__)
    static vf mac(vf acc, vf query, vf key) {
        return (vf)_mm512_dpbf16_ps((__m512)acc, __builtin_bit_cast(__m512bh, query),
                                    __builtin_bit_cast(__m512bh, key));
    }
#elif defined(__aarch64__)
    static vf mac(vf acc, vf query, vf key) {
        return (vf)vbfdotq_f32((float32x4_t)acc, vreinterpretq_bf16_f32((float32x4_t)query),
                               vreinterpretq_bf16_f32((float32x4_t)key));
    }
#endif
};
#endif

/* Accumulator registers the products below keep in flight: half the register file. */
#if MFA_CPU_VECTOR_BYTES == 64 || defined(__aarch64__)
static const int kDecodeAccumulators = 16;
#else
static const int kDecodeAccumulators = 8;
#endif

/* ... in a pass of ROWS rows of the row passes (dot_rows, accumulate_columns). On AVX2 (16
 * registers) a pass of 4 bf16 rows keeps 12: 3 keys' sums (the queries FMA operands from
 * memory) or 3 column vectors of O, beside the 3 widened vectors and the weight. With 8
 * accumulators of 4-cycle FMAs each chain was as long as the pass's FMAs took, and the widening
 * beside them left the FMA ports idle. On 2 cores of an AMD EPYC (Zen 3), bf16 decoding of 4
 * query heads per key/value head ran 1.02-1.10x faster with 3 column vectors (D 128) and
 * 1.01-1.08x faster again with 3 keys (D 64 and 128). f32 rows, not widened, ran 0.89-0.96x as
 * fast with 3 column vectors and 0.93-1.04x with 3 keys, and keep 8. */
template <int ROWS, class Rows>
struct pass_accumulators {
    enum {
        count =
            MFA_CPU_VECTOR_BYTES == 32 && Rows::size == 2 && ROWS == 4 ? 12 : kDecodeAccumulators
    };
};

/* The rows the task reads after the ones in hand (this block's V during its K products, the next
 * block's K during its V products), brought into L2 a few rows per step of the products, so that
 * the loads of the products find their lines there: the hardware prefetchers alone follow the
 * rows of one block too late to keep the memory system busy. */
struct row_prefetch {
    const char* const* rows;
    int64_t count, bytes, next;
    int64_t line; /* spread: the next line of row `next` */

    void step(int64_t n) {
        const int64_t end = min64(next + n, count);
        for (; next < end; ++next)
            for (int64_t line = 0; line < bytes; line += 64)
                __builtin_prefetch(rows[next] + line, 0, 2);
    }

    /* The lines to bring per step so that `steps` steps bring all of them. */
    int64_t lines_per(int64_t steps) const {
        const int64_t lines = (count - next) * ((bytes + 63) / 64);
        return (lines + steps - 1) / steps;
    }

    /* n lines, in order: for loops that can spread the rows' lines evenly over their steps. */
    void spread(int64_t n) {
        for (; n > 0 && next < count; --n) {
            __builtin_prefetch(rows[next] + line, 0, 2);
            line += 64;
            if (line >= bytes) line = 0, ++next;
        }
    }
};

/* s[r * lds + j] = q_r . key_j for ROWS query rows (ldq apart) and `keys` key rows at
 * key[0 .. keys), depth a multiple of W. KEYS keys at a time share each load of the queries,
 * and ROWS x KEYS independent sums hide the FMA latency. This pass is the first of `passes`
 * over the block, which share the prefetches evenly. */
template <int ROWS, int KEYS, class Rows>
static inline void dot_rows(const float* q, int64_t ldq, const char* const* key, int64_t keys,
                            int64_t depth, float* s, int64_t lds, row_prefetch* ahead,
                            int64_t passes) {
    typedef vector_rows<Rows> R;
    const int64_t size = Rows::size;
    const int64_t lines = ahead->lines_per(passes * (keys / KEYS) + 1);
    int64_t j = 0;
    for (; j + KEYS <= keys; j += KEYS) {
        ahead->spread(lines);
        vf acc[ROWS * KEYS];
        for (int i = 0; i < ROWS * KEYS; ++i) acc[i] = vsplat(0.0f);
        for (int64_t x = 0; x < depth; x += R::step) {
            vf k[KEYS];
            for (int c = 0; c < KEYS; ++c) k[c] = R::load(key[j + c] + x * size);
            for (int r = 0; r < ROWS; ++r) {
                const vf query = vload(q + r * ldq + R::query_offset(x));
                for (int c = 0; c < KEYS; ++c)
                    acc[r * KEYS + c] = R::mac(acc[r * KEYS + c], query, k[c]);
            }
        }
        /* All the sums folded together: fewer shuffles than row by row. */
        float sums[ROWS * KEYS];
        hsums<ROWS * KEYS>(acc, sums);
        for (int r = 0; r < ROWS; ++r)
            for (int c = 0; c < KEYS; ++c) s[r * lds + j + c] = sums[r * KEYS + c];
    }
    for (; j < keys; ++j) {
        vf acc[ROWS];
        for (int r = 0; r < ROWS; ++r) acc[r] = vsplat(0.0f);
        for (int64_t x = 0; x < depth; x += R::step) {
            const vf k = R::load(key[j] + x * size);
            for (int r = 0; r < ROWS; ++r)
                acc[r] = R::mac(acc[r], vload(q + r * ldq + R::query_offset(x)), k);
        }
        for (int r = 0; r < ROWS; ++r) s[r * lds + j] = hsum(acc[r]);
    }
}

/* o[r * ldo + x0 .. + VECS * W) += sum_j p[r * ldp + j] * value_j[same columns] for ROWS rows:
 * each key's slice of V is read once, contiguously, into ROWS x VECS independent sums; `lines`
 * prefetched per key. */
template <int ROWS, int VECS, class Rows>
static inline void accumulate_columns(const float* p, int64_t ldp, const char* const* value,
                                      int64_t keys, int64_t x0, float* o, int64_t ldo,
                                      row_prefetch* ahead, int64_t lines) {
    const int64_t size = Rows::size;
    vf acc[ROWS][VECS];
    for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < VECS; ++c) acc[r][c] = vload(o + r * ldo + x0 + c * W);
    for (int64_t j = 0; j < keys; ++j) {
        ahead->spread(lines);
        const char* row = opaque(value[j] + x0 * size);
        vf v[VECS];
        for (int c = 0; c < VECS; ++c) v[c] = vector_rows<Rows>::load(row + c * W * size);
        for (int r = 0; r < ROWS; ++r) {
            const vf weight = vsplat(p[r * ldp + j]);
            for (int c = 0; c < VECS; ++c) acc[r][c] += weight * v[c];
        }
    }
    for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < VECS; ++c) vstore(o + r * ldo + x0 + c * W, acc[r][c]);
}

/* ... over all columns [0, width), width a multiple of W, in passes over the keys of a few
 * columns each, the first of `row_passes` that share the prefetches evenly. Issued all in the
 * first pass (the next block's keys in a burst), they come faster than the memory system takes
 * them, and the next block's scores wait: 6-42 % slower on 2 cores of an AMD EPYC (Zen 4). */
template <int ROWS, class Rows>
static inline void accumulate_rows(const float* p, int64_t ldp, const char* const* value,
                                   int64_t keys, int64_t width, float* o, int64_t ldo,
                                   row_prefetch* ahead, int64_t row_passes) {
    /* Column vectors a pass: all its accumulators, at most 8. */
    enum {
        kVecs = pass_accumulators<ROWS, Rows>::count / ROWS > 8
                    ? 8
                    : pass_accumulators<ROWS, Rows>::count / ROWS
    };
    /* What whole passes leave: in pairs of vectors where a pass takes more than 2, then one. */
    const int64_t left = width % (kVecs * W) / W;
    const int64_t passes = width / (kVecs * W) + (kVecs > 2 ? left / 2 + left % 2 : left);
    const int64_t lines = ahead->lines_per(row_passes * passes * keys + 1);
    int64_t x = 0;
    for (; x + kVecs * W <= width; x += kVecs * W)
        accumulate_columns<ROWS, kVecs, Rows>(p, ldp, value, keys, x, o, ldo, ahead, lines);
    if (kVecs > 2)
        for (; x + 2 * W <= width; x += 2 * W)
            accumulate_columns<ROWS, 2, Rows>(p, ldp, value, keys, x, o, ldo, ahead, lines);
    for (; x < width; x += W)
        accumulate_columns<ROWS, 1, Rows>(p, ldp, value, keys, x, o, ldo, ahead, lines);
}

/* The passes over a block of keys that decode_products and decode_accumulate make for `rows`
 * rows: four rows at a time, then two, then one. */
static inline int64_t row_passes(int64_t rows) { return rows / 4 + rows % 4 / 2 + rows % 2; }

/* The scores of one block of keys for every row of the task. Four rows at a time where there
 * are four (one new token of a group of 4 query heads): each key vector loaded once for all of
 * them, 7-10 % faster than two passes of two rows on Emerald Rapids, f32 and bf16 alike. */
template <class Rows>
static void decode_products(const float* q, int64_t rows, int64_t ldq, const char* const* key,
                            int64_t depth, int64_t keys, float* s, int64_t lds,
                            row_prefetch* ahead) {
    /* Keys per pass: all its accumulators, in sums of at most W keys. */
    enum {
        kQuadKeys =
            pass_accumulators<4, Rows>::count / 4 < W ? pass_accumulators<4, Rows>::count / 4 : W,
        kPairKeys =
            pass_accumulators<2, Rows>::count / 2 < W ? pass_accumulators<2, Rows>::count / 2 : W,
        kSingleKeys = pass_accumulators<1, Rows>::count < W ? pass_accumulators<1, Rows>::count : W
    };
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        dot_rows<4, kQuadKeys, Rows>(q + r * ldq, ldq, key, keys, depth, s + r * lds, lds, ahead,
                                     row_passes(rows - r));
    for (; r + 2 <= rows; r += 2)
        dot_rows<2, kPairKeys, Rows>(q + r * ldq, ldq, key, keys, depth, s + r * lds, lds, ahead,
                                     row_passes(rows - r));
    if (r < rows)
        dot_rows<1, kSingleKeys, Rows>(q + r * ldq, ldq, key, keys, depth, s + r * lds, lds, ahead,
                                       row_passes(rows - r));
}

/* The scores with the rows in the lanes (S^T = K Q^T), for a unit of more than W / 2 and at
 * most W rows: s[j * W + r] = q_r . key_j, no horizontal sums at all. qt holds the queries
 * transposed, one vector per reduction step: qt[x * W + r] = q_r[x] (f32 keys), or unit
 * u * W + r = the bf16 pair (q_r[2u], q_r[2u + 1]) (bf16 keys on a dot-product build); every key
 * element (or pair) is broadcast from memory into one FMA (or dot product) for all rows. */
struct f32_lanes {
    enum { size = 4, step = 1 };
    static vf mac(vf acc, vf query, const char* key) {
        float x;
        memcpy(&x, key, sizeof x);
        return acc + query * vsplat(x);
    }
};

#if MFA_CPU_BF16_DOT
struct bf16_pair_lanes {
    enum { size = 2, step = 2 };
    static vf mac(vf acc, vf query, const char* key) { return dot_pairs(acc, query, key); }
};
#endif

template <int KEYS, class Lanes>
static inline void dot_lanes(const float* qt, const char* const* key, int64_t keys, int64_t depth,
                             float* s, row_prefetch* ahead) {
    /* Reduction steps per pass over the keys: their queries stay in registers, and each key's
     * address is loaded once for all of them (KEYS addresses do not fit the registers: opaque
     * keeps the compiler from hoisting them out of the pass). The keys' loop is unrolled, so
     * that the sums stay in registers. */
    enum { kSteps = 4 };
    const int64_t passes = depth / (kSteps * Lanes::step);
    const int64_t lines = ahead->lines_per(keys / KEYS * passes + 1);
    int64_t j = 0;
    for (; j + KEYS <= keys && depth % (kSteps * Lanes::step) == 0; j += KEYS) {
        vf acc[KEYS];
        for (int c = 0; c < KEYS; ++c) acc[c] = vsplat(0.0f);
        for (int64_t x = 0; x < depth; x += kSteps * Lanes::step) {
            ahead->spread(lines);
            vf query[kSteps];
            for (int u = 0; u < kSteps; ++u) query[u] = vload(qt + (x / Lanes::step + u) * W);
            const char* const* rows = opaque(key + j);
#pragma GCC unroll 16
            for (int c = 0; c < KEYS; ++c) {
                const char* row = rows[c] + x * Lanes::size;
                for (int u = 0; u < kSteps; ++u)
                    acc[c] = Lanes::mac(acc[c], query[u], row + u * Lanes::step * Lanes::size);
            }
        }
        for (int c = 0; c < KEYS; ++c) vstore(s + (j + c) * W, acc[c]);
    }
    ahead->step(ahead->count);
    for (; j < keys; ++j) {
        vf acc = vsplat(0.0f);
        for (int64_t x = 0; x < depth; x += Lanes::step)
            acc = Lanes::mac(acc, vload(qt + x / Lanes::step * W), key[j] + x * Lanes::size);
        vstore(s + j * W, acc);
    }
}

/* The block's softmax with the rows in the lanes, s[c * W + r] for keys c < n: the modifiers of
 * scores_row on every lane at once (per-row ALiBi slopes and distances p(i_r) - j0 in the lanes,
 * the mask's bias key-major, W per key), a lane's keys outside [begin, end) hidden unless
 * `full`. Returns the rows' largest scores, NaN where a row has a NaN. */
template <int KINDS>
static vf lanes_scores(float* s, int64_t n, const score_vectors& m, vf distance, const float* bias,
                       vi begin, vi end, bool full) {
    const vf hidden = vsplat(-__builtin_inff());
    vf top = hidden, unused;
    vi nan = vi{};
    for (int64_t c = 0; c < n; ++c) {
        vf v = score_of<KINDS, false>(vload(s + c * W), m, distance - (float)c,
                                      (KINDS & kBias) ? bias + c * W : nullptr, &unused);
        if (!full) {
            const vi key = vi{} + (int32_t)c;
            v = vselect((key >= begin) & (key < end), v, hidden);
        }
        vstore(s + c * W, v);
        top = vmax(top, v);
        nan |= v != v;
    }
    return vselect(nan, vsplat(__builtin_nanf("")), top);
}

typedef vf (*lanes_scores_fn)(float*, int64_t, const score_vectors&, vf, const float*, vi, vi,
                              bool);

static inline lanes_scores_fn lanes_scores_for(int kinds) {
    static const lanes_scores_fn loops[8] = {
        lanes_scores<0>,
        lanes_scores<kSoftcap>,
        lanes_scores<kAlibi>,
        lanes_scores<kSoftcap | kAlibi>,
        lanes_scores<kBias>,
        lanes_scores<kSoftcap | kBias>,
        lanes_scores<kAlibi | kBias>,
        lanes_scores<kSoftcap | kAlibi | kBias>,
    };
    return loops[kinds];
}

/* online_softmax_row for the W rows in the lanes at once: the scores become probabilities
 * against the new running max, the sums and maxima (W floats each) move on, and O is rescaled
 * where a row's max moved: transposed (ldo 0: `width` vectors of the rows at o) for the vector
 * products, or W rows of ldo floats for the tile products. */
static void lanes_softmax(float* s, int64_t n, vf block_max, float* row_max, float* row_sum,
                          float* o, int64_t width, int64_t ldo) {
    const vf old_max = vload(row_max);
    /* NaN wins, so that it reaches O and lse instead of being skipped. */
    const vf new_max =
        vselect((block_max > old_max) | (block_max != block_max), block_max, old_max);
    /* A row that has seen nothing yet (max -inf) has P 0: shifted by 0, e^-inf is 0. */
    const vf shift = vselect(new_max == vsplat(-__builtin_inff()), vsplat(0.0f), new_max);
    const vf log2e = vsplat(kLog2e);
    vf sum = vsplat(0.0f);
    for (int64_t c = 0; c < n; ++c) {
        const vf e = vexp2((vload(s + c * W) - shift) * log2e);
        vstore(s + c * W, e);
        sum += e;
    }
    const vi moved = new_max != old_max;
    const vf correction = vselect(moved, vexp2((old_max - shift) * log2e), vsplat(1.0f));
    vstore(row_sum, vload(row_sum) * correction + sum);
    vstore(row_max, new_max);
    if (!vany(moved)) return;
    if (ldo == 0)
        for (int64_t x = 0; x < width; ++x) vstore(o + x * W, vload(o + x * W) * correction);
    else
        for (int64_t r = 0; r < W; ++r)
            for (int64_t x = 0; x < width; x += W)
                vstore(o + r * ldo + x, vload(o + r * ldo + x) * correction[r]);
}

template <class Rows>
static void decode_accumulate(const float* p, int64_t rows, int64_t ldp, const char* const* value,
                              int64_t width, int64_t keys, float* o, int64_t ldo,
                              row_prefetch* ahead) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        accumulate_rows<4, Rows>(p + r * ldp, ldp, value, keys, width, o + r * ldo, ldo, ahead,
                                 row_passes(rows - r));
    for (; r + 2 <= rows; r += 2)
        accumulate_rows<2, Rows>(p + r * ldp, ldp, value, keys, width, o + r * ldo, ldo, ahead,
                                 row_passes(rows - r));
    for (; r < rows; ++r)
        accumulate_rows<1, Rows>(p + r * ldp, ldp, value, keys, width, o + r * ldo, ldo, ahead,
                                 row_passes(rows - r));
}

/* O += P V with the rows in the lanes, O transposed: ot[x * W + r] += sum_j p[j * W + r] *
 * value_j[x] for x < width, each value element broadcast from memory into one FMA for all rows,
 * kDecodeAccumulators columns at a time, so that every line of V is read once in all. With
 * bf16_pair_lanes the products are dot products of pairs of keys: p holds the rows'
 * probabilities of keys 2k and 2k + 1 as a bf16 pair per lane (round_pairs_across_rows), value_k
 * the pairs of V rows (interleave_value_pairs). Either way a column of a row is 4 bytes. */
template <class Lanes>
static void accumulate_lanes(const float* p, const char* const* value, int64_t count, int64_t width,
                             float* ot, row_prefetch* ahead) {
    enum { kCols = kDecodeAccumulators };
    const int64_t lines = ahead->lines_per(width / kCols * count + 1);
    int64_t x0 = 0;
    for (; x0 + kCols <= width; x0 += kCols) {
        vf acc[kCols];
        for (int c = 0; c < kCols; ++c) acc[c] = vload(ot + (x0 + c) * W);
        for (int64_t j = 0; j < count; ++j) {
            ahead->spread(lines);
            const vf weights = vload(p + j * W);
            const char* row = opaque(value[j] + 4 * x0);
            for (int c = 0; c < kCols; ++c) acc[c] = Lanes::mac(acc[c], weights, row + 4 * c);
        }
        for (int c = 0; c < kCols; ++c) vstore(ot + (x0 + c) * W, acc[c]);
    }
    ahead->step(ahead->count);
    for (; x0 < width; ++x0) {
        vf acc = vload(ot + x0 * W);
        for (int64_t j = 0; j < count; ++j)
            acc = Lanes::mac(acc, vload(p + j * W), value[j] + 4 * x0);
        vstore(ot + x0 * W, acc);
    }
}

#if MFA_CPU_BF16_DOT
/* The block's `count` V rows (bf16, adjacent elements) as pair_rows pairs of rows: unit
 * k * ld + x of dst holds column x of rows 2k and 2k + 1, zero past count; width a multiple of
 * W. */
typedef uint16_t vh_pairs __attribute__((vector_size(MFA_CPU_VECTOR_BYTES)));

static void interleave_value_pairs(const char* const* value, int64_t count, int64_t pair_rows,
                                   int64_t width, float* dst, int64_t ld) {
#define MFA_CPU_PAIR(i) i, W + i
    for (int64_t k = 0; k < pair_rows; ++k) {
        const char* lo = 2 * k < count ? value[2 * k] : (const char*)0;
        const char* hi = 2 * k + 1 < count ? value[2 * k + 1] : (const char*)0;
        for (int64_t x = 0; x < width; x += W) {
            vh a = vh{}, b = vh{};
            if (lo) memcpy(&a, lo + 2 * x, sizeof a);
            if (hi) memcpy(&b, hi + 2 * x, sizeof b);
            const vh_pairs pairs = __builtin_shufflevector(a, b, MFA_CPU_LANES(MFA_CPU_PAIR));
            memcpy(dst + k * ld + x, &pairs, sizeof pairs);
        }
    }
#undef MFA_CPU_PAIR
}
#endif

#if MFA_CPU_AMX
/* The products of a unit on AMX tiles (gemm_amx.inl's configuration, every tile 16 rows of 64
 * bytes), for bf16 K and V read in place, with the rows in the lanes for the softmax as the
 * vector products have them (lanes_scores, lanes_softmax); rows past the unit's are zero queries:
 *   scores, S^T = K Q^T: A = 16 keys x 16 pairs of d, the key rows where they lie (a tile row is
 *     32 elements of one row); B = 16 pairs of d x W rows, a step of qt as the lanes build it
 *     (unit u * W + r is q_r's pair u: TDPBF16PS's layout for B, a pair per column); C = 16 keys
 *     x W rows, key-major as lanes_scores reads s.
 *   O += P V: A = W rows x 16 pairs of keys, P rounded to bf16 (round_pairs_to_rows); B = 16
 *     pairs of keys x 16 columns of V as pairs of rows (interleave_value_pairs); C = 16 rows x
 *     16 columns of O, which the tile products keep as rows (not transposed): then V is a B tile
 *     as it is interleaved, and only P (W x 32 pairs a block) is transposed, not V.
 * Measured here (Emerald Rapids, KVM guest), a tile load or store costs about as much as a
 * TDPBF16PS, and a tile load of data that vector stores have just written waits for them to
 * drain (V's interleaved rows: nearly as long again as the product); so V is interleaved before
 * the softmax, whose vector work covers the drain. The tiles are configured as gemm_amx.inl's
 * products have them, and stay so until the task ends (use_tiles, release_tiles). */

/* The probabilities s[c * W + r] of keys c < n rounded to bf16 (nearest even, as the forward's
 * P), as W rows of pairs of keys: unit r * ldp + k holds keys 2k and 2k + 1 of row r, zero from
 * key n to the end of its step of 32 keys. Rounded a pair of keys per vector, then transposed. */
static void round_pairs_to_rows(const float* s, int64_t n, float* dst, int64_t ldp) {
    static_assert(W == 16, "a vector is a row of 16 units");
    for (int64_t k0 = 0; 2 * k0 < n; k0 += kTileSteps) {
        __m512i units[16];
        for (int i = 0; i < 16; ++i) {
            const int64_t c = 2 * (k0 + i);
            const __m512 lo = c < n ? _mm512_loadu_ps(s + c * W) : _mm512_setzero_ps();
            const __m512 hi = c + 1 < n ? _mm512_loadu_ps(s + (c + 1) * W) : _mm512_setzero_ps();
            units[i] = round_lane_pairs(lo, hi);
        }
        transpose_units(units);
        for (int r = 0; r < W; ++r) _mm512_storeu_si512(dst + r * ldp + k0, units[r]);
    }
}

/* An A tile of 16 rows of `bytes` (up to 16 of them at rows[0 .. count)): the rows where they
 * lie when there are 16 equally spaced ones (dense caches, a page's rows), else copied into
 * `buffer` with zero rows past count (a block's last keys, a group across pages). */
static inline const char* tile_rows(const char* const* rows, int64_t count, int64_t bytes,
                                    char* buffer, long* stride) {
    if (count == kTileRows) {
        const intptr_t step = (intptr_t)rows[1] - (intptr_t)rows[0];
        bool even = true;
        for (int64_t i = 2; i < kTileRows; ++i)
            even &= (intptr_t)rows[i] - (intptr_t)rows[i - 1] == step;
        if (even) {
            *stride = (long)step;
            return rows[0];
        }
    }
    for (int64_t i = 0; i < kTileRows; ++i) {
        if (i < count)
            memcpy(buffer + i * bytes, rows[i], (size_t)bytes);
        else
            memset(buffer + i * bytes, 0, (size_t)bytes);
    }
    *stride = (long)bytes;
    return buffer;
}

/* s[j * W + r] = q_r . key_j for keys j < `keys` (at most 4 x 16), bf16 rows of depth elements
 * (a multiple of 32), s written to the end of the last 16-key group. The groups' C tiles share
 * each step's B tile of queries; `gathered` holds 4 x 16 rows of depth elements. */
static void amx_scores(const float* qt, const char* const* key, int64_t keys, int64_t depth,
                       char* gathered, float* s, row_prefetch* ahead) {
    const int64_t groups = (keys + kTileRows - 1) / kTileRows, steps = depth / (2 * kTileSteps);
    const int64_t bytes = 2 * depth;
    const char* a[4];
    long stride[4];
    for (int64_t g = 0; g < groups; ++g)
        a[g] = tile_rows(key + g * kTileRows, min64(keys - g * kTileRows, kTileRows), bytes,
                         gathered + g * kTileRows * bytes, stride + g);
    const int64_t lines = ahead->lines_per(groups * steps + 1);
    if (groups > 0) _tile_zero(0);
    if (groups > 1) _tile_zero(1);
    if (groups > 2) _tile_zero(2);
    if (groups > 3) _tile_zero(3);
    for (int64_t x = 0; x < steps; ++x) {
        _tile_loadd(6, qt + x * kTileSteps * W, 4 * W);
#define MFA_CPU_GROUP(g, tile)                                                                     \
    if (g < groups) {                                                                              \
        ahead->spread(lines);                                                                      \
        _tile_loadd(tile, a[g] + x * 64, stride[g]);                                               \
        _tile_dpbf16ps(g, tile, 6);                                                                \
    }
        MFA_CPU_GROUP(0, 4)
        MFA_CPU_GROUP(1, 5)
        MFA_CPU_GROUP(2, 4)
        MFA_CPU_GROUP(3, 5)
#undef MFA_CPU_GROUP
    }
    if (groups > 0) _tile_stored(0, s, 4 * W);
    if (groups > 1) _tile_stored(1, s + kTileRows * W, 4 * W);
    if (groups > 2) _tile_stored(2, s + 2 * kTileRows * W, 4 * W);
    if (groups > 3) _tile_stored(3, s + 3 * kTileRows * W, 4 * W);
    ahead->step(ahead->count);
}

/* O += P V for W rows of O (ldo floats apart, width a multiple of 16) over `steps` steps of 32
 * keys: p as round_pairs_to_rows leaves it (ldp units a row), v as interleave_value_pairs leaves
 * it (ldv units a pair of rows). Four C tiles (64 columns of O) at a time share each A tile. */
static void amx_values(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t steps,
                       int64_t width, float* o, int64_t ldo, row_prefetch* ahead) {
    const long o_stride = (long)(4 * ldo), v_stride = (long)(4 * ldv);
    const int64_t lines = ahead->lines_per(steps * (width / kTileCols) + 1);
    for (int64_t x0 = 0; x0 < width; x0 += 4 * kTileCols) {
        const int64_t tiles = min64((width - x0) / kTileCols, 4);
        float* c = o + x0;
        if (tiles > 0) _tile_loadd(0, c, o_stride);
        if (tiles > 1) _tile_loadd(1, c + kTileCols, o_stride);
        if (tiles > 2) _tile_loadd(2, c + 2 * kTileCols, o_stride);
        if (tiles > 3) _tile_loadd(3, c + 3 * kTileCols, o_stride);
        for (int64_t k = 0; k < steps; ++k) {
            _tile_loadd(4, p + k * kTileSteps, (long)(4 * ldp));
            const float* b = v + k * kTileSteps * ldv + x0;
#define MFA_CPU_COLUMNS(g, tile)                                                                   \
    if (g < tiles) {                                                                               \
        ahead->spread(lines);                                                                      \
        _tile_loadd(tile, b + g * kTileCols, v_stride);                                            \
        _tile_dpbf16ps(g, 4, tile);                                                                \
    }
            MFA_CPU_COLUMNS(0, 6)
            MFA_CPU_COLUMNS(1, 7)
            MFA_CPU_COLUMNS(2, 6)
            MFA_CPU_COLUMNS(3, 7)
#undef MFA_CPU_COLUMNS
        }
        if (tiles > 0) _tile_stored(0, c, o_stride);
        if (tiles > 1) _tile_stored(1, c + kTileCols, o_stride);
        if (tiles > 2) _tile_stored(2, c + 2 * kTileCols, o_stride);
        if (tiles > 3) _tile_stored(3, c + 3 * kTileCols, o_stride);
    }
    ahead->step(ahead->count);
}
#endif

/* rows x width floats `ld` apart into lanes (dst[x * W + r], zero past `rows`), and back. */
static void rows_to_lanes(const float* src, int64_t rows, int64_t ld, int64_t width, float* dst) {
    for (int64_t x = 0; x < width; ++x)
        for (int64_t r = 0; r < W; ++r) dst[x * W + r] = r < rows ? src[r * ld + x] : 0.0f;
}

static void lanes_to_rows(const float* src, int64_t rows, int64_t width, float* dst, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < width; ++x) dst[r * ld + x] = src[x * W + r];
}

/* `count` rows at the given addresses converted to f32 rows of ld floats (zero past width) at
 * dst; the addresses then point at the converted rows. */
template <class Storage>
static void convert_rows(const char** address, int64_t count, int64_t elem_step, int64_t width,
                         float* dst, int64_t ld) {
    for (int64_t r = 0; r < count; ++r) {
        load_row<Storage>(address[r], elem_step, width, dst + r * ld, 1);
        for (int64_t x = width; x < ld; ++x) dst[r * ld + x] = 0.0f;
        address[r] = (const char*)(dst + r * ld);
    }
}

/* Rows of a unit's task: r = member * seq_q + i is query row i of query head member of the
 * group. */
struct decode_row {
    int64_t head, query;
};

static inline decode_row decode_row_of(const mfa_cpu_plan* plan, const mfa_cpu_sequence& s,
                                       int64_t kv_head, int64_t r) {
    decode_row row = {kv_head * plan->problem->group + r / s.seq_q, r % s.seq_q};
    return row;
}

/* Keys [begin, end) of a unit's key range `split`. */
static inline void decode_split_keys(const mfa_cpu_plan* plan, const mfa_cpu_sequence& s,
                                     int64_t split, int64_t* begin, int64_t* end) {
    const int64_t first = mfa_cpu_decode_first_key(&s) + split * plan->key_split_size;
    const int64_t lo = mfa_cpu_key_begin(&s, 0), hi = mfa_cpu_decode_end_key(&s);
    *begin = first > lo ? first : lo;
    *end = min64(first + plan->key_split_size, hi);
}

/* The key ranges of unit u, tasks first_task .. (their partials), merged into its rows' out and
 * lse; slot has room for the weights of its ranges and one merged row. */
template <class Storage>
static void decode_merge_unit(const mfa_cpu_plan* plan, const unit_task& u, int64_t first_task,
                              float* slot) {
    const mfa_problem* p = plan->problem;
    const mfa_cpu_sequence& seq = u.seq;
    const int64_t rows = p->group * seq.seq_q, splits = mfa_cpu_decode_tasks(plan, &seq);
    const int64_t dv = p->head_dim_v;
    const int64_t row_floats = mfa_cpu_decode_partial_row_floats(plan);
    const int64_t stride = mfa_cpu_decode_rows(plan) * row_floats;
    float* weights = slot;
    float* merged = slot + mfa_cpu_round_up(splits, 16);
    for (int64_t r = 0; r < rows; ++r) {
        const float* part =
            plan->partials + (first_task * mfa_cpu_decode_rows(plan) + r) * row_floats;
        const float lse = mfa_cpu_merge_weights(part + dv, stride, splits, weights);
        mfa_cpu_merge_rows(part, stride, splits, weights, dv, merged);
        const decode_row row = decode_row_of(plan, seq, u.kv.head, r);
        store_rows<Storage>(query_rows(p->out, plan->elem_size, seq, row.head, row.query), 1, dv,
                            merged, dv, 1.0f);
        if (p->lse.data)
            f32_storage::store(query_rows(p->lse, sizeof(float), seq, row.head, row.query).row(0),
                               lse);
    }
}

template <class Storage>
static void decode_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    typedef typename vector_rows<Storage>::read_as Direct;
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const unit_task u = unit_of_task(plan, task);
    const mfa_cpu_sequence& seq = u.seq;
    const int64_t b = seq.batch;
    const int64_t rows = p->group * seq.seq_q;
    const int64_t splits = mfa_cpu_decode_tasks(plan, &seq);
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t ld = mfa_cpu_round_up(d, 16), ldv = mfa_cpu_round_up(dv, 16);
    const int64_t bk = mfa_cpu_decode_block;
    int64_t first, last;
    decode_split_keys(plan, seq, u.local, &first, &last);

    mfa_cpu_decode_tiles t;
    mfa_cpu_decode_tiles_carve(plan, slot, &t);
    const strided_rows keys = key_rows(plan, p->k, seq, u.kv.head, 0);
    const strided_rows values = key_rows(plan, p->v, seq, u.kv.head, 0);
    const bool in_place = vector_rows<Storage>::in_place && keys.elem_step == es &&
                          values.elem_step == es && d % W == 0 && dv % W == 0;
    /* bf16 read in place on a dot-product build: the products multiply bf16 pairs, the queries
     * as pairs in qt (ld / 2 floats a row, or transposed with the rows in the lanes). */
    const bool pairs = MFA_CPU_BF16_DOT && in_place && Storage::size == 2 &&
                       vector_rows<Storage>::in_place && d % (2 * W) == 0;
    /* On AMX, bf16 pairs of a unit of more than W / 4 rows (at most W): both products on tiles
     * (amx_scores, amx_values), the rows in the lanes for the softmax, O as W rows in t.o. A
     * block's tile work is the same for 1 row as for W; measured on Emerald Rapids, the vector
     * dot products are faster for 1 and 2 rows, even at 4, and slower from 8 on (16: half). */
#if MFA_CPU_AMX
    const bool amx = pairs && 4 * rows > W && rows <= W;
#else
    const bool amx = false;
#endif
    /* Otherwise more than W / 2 rows: the rows in the lanes for the whole block (dot_lanes,
     * lanes_scores, lanes_softmax, accumulate_lanes), O transposed in t.o; its rows start and end
     * in t.v. Not on AVX2: with 8 lanes, one broadcast load per FMA leaves the FMAs waiting on
     * the loads, and its passes of 4 rows (then 2) ran 6 and 8 rows 1.06-1.26x (f32) and
     * 1.32-1.86x (bf16) as fast on 2 cores of an AMD EPYC (Zen 3), 4k and 32k keys, D 64 and 128.
     * (Two vectors of rows, 16 rows in the lanes of AVX2 and each broadcast feeding two FMAs, ran
     * 16 f32 rows 1.02-1.21x as fast as the passes, 12 rows and bf16 rows slower: not kept.) */
    const bool lanes = amx || (MFA_CPU_VECTOR_BYTES != 32 && 2 * rows > W && rows <= W);
    float* const o_rows = lanes && !amx ? t.v : t.o;
    score_modifiers mods[mfa_cpu_decode_max_rows];
    for (int64_t r = 0; r < rows; ++r) {
        const decode_row row = decode_row_of(plan, seq, u.kv.head, r);
        const strided_rows q = query_rows(p->q, es, seq, row.head, row.query);
        load_row<Storage>(q.row(0), q.elem_step, d, t.q + r * ld, 1);
        for (int64_t x = d; x < ld; ++x) t.q[r * ld + x] = 0.0f;
        mods[r] = modifiers_of(plan, seq, row.head);
        if (u.local == 0) {
            start_row<Storage>(plan, seq, row.head, row.query, sink_of(plan, row.head),
                               o_rows + r * ldv, ldv, t.row_max + r, t.row_sum + r);
        } else {
            for (int64_t x = 0; x < ldv; ++x) o_rows[r * ldv + x] = 0.0f;
            t.row_max[r] = -__builtin_inff();
            t.row_sum[r] = 0.0f;
        }
    }
#if MFA_CPU_AMX
    if (amx) use_tiles(0);
#endif
    if (amx)
        for (int64_t x = rows * ldv; x < W * ldv; ++x) t.o[x] = 0.0f;
    else if (lanes)
        rows_to_lanes(o_rows, rows, ldv, ldv, t.o);

    /* In the lanes, qt holds the queries transposed; rows that are neither f32 nor bf16 pairs
     * read in place are converted. */
    const bool lanes_in_place = pairs || (in_place && Storage::size == 4);
    if (pairs || lanes)
        for (int64_t r = 0; r < (lanes ? W : rows); ++r)
            for (int64_t x = 0; x < ld; ++x) {
                uint32_t bits = 0;
                if (r < rows) memcpy(&bits, t.q + r * ld + x, sizeof bits);
                if (!pairs)
                    memcpy(t.qt + x * W + r, &bits, sizeof bits);
                else if (lanes)
                    ((uint16_t*)(t.qt + x / 2 * W + r))[x % 2] = (uint16_t)(bits >> 16);
                else
                    ((uint16_t*)(t.qt + r * ld / 2))[x] = (uint16_t)(bits >> 16);
            }
    /* With the rows in the lanes, the lanes past `rows` are rows of zeros that see every key
     * (finite scores 0, never stored); the mask's bias is key-major, W floats per key. */
    score_vectors lane_mods = vectors_of(mods[0]);
    if (lanes) {
        for (int64_t r = 0; r < W; ++r)
            lane_mods.neg_slope[r] = r < rows ? mods[r].neg_slope : 0.0f;
        for (int64_t r = rows; r < W; ++r) {
            t.row_max[r] = -__builtin_inff();
            t.row_sum[r] = 0.0f;
        }
        if (t.bias)
            for (int64_t x = 0; x < W * bk; ++x) t.bias[x] = 0.0f;
    }
    mask_tile_kind mask[mfa_cpu_decode_max_rows];
    const int64_t key_bytes = (d - 1) * keys.elem_step + es;
    const int64_t value_bytes = (dv - 1) * values.elem_step + es;
    const char** key_rows = t.key_rows;
    const char** next_key_rows = t.next_key_rows;
    /* Blocks start at multiples of bk, so that each lies in one column of a mask summary. */
    const int64_t first_block = first / bk * bk;
    keys.addresses(first, min64(first_block + bk, last) - first, key_rows);
    for (int64_t block = first_block; block < last; block += bk) {
        const int64_t j0 = block > first ? block : first;
        const int64_t n = min64(block + bk, last) - j0;
        const int64_t n_pad = mfa_cpu_round_up(n, W);
        const int64_t next_n = block + bk < last ? min64(block + 2 * bk, last) - (block + bk) : 0;
        if (next_n > 0) keys.addresses(block + bk, next_n, next_key_rows);
        bool any_visible = false, any_bias = false;
        for (int64_t r = 0; r < rows; ++r) {
            const decode_row row = decode_row_of(plan, seq, u.kv.head, r);
            if (lanes)
                mask[r] = mask_tile(plan, b, row.head, row.query, 1, j0, n, true,
                                    t.bias ? t.bias + r : t.bias, W, 1);
            else
                mask[r] = mask_tile(plan, b, row.head, row.query, 1, j0, n, false,
                                    t.bias ? t.bias + r * bk : t.bias, bk, n_pad);
            any_visible |= mask[r] != kTileHidden;
            any_bias |= mask[r] == kTileBias;
        }
        if (any_visible && lanes) {
            values.addresses(j0, n, t.value_rows);
            row_prefetch values_ahead = {t.value_rows, n, value_bytes, 0, 0};
            if (!lanes_in_place) convert_rows<Storage>(key_rows, n, keys.elem_step, d, t.k, ld);
            enum { kLaneKeys = kDecodeAccumulators };
#if MFA_CPU_AMX
            /* Whole steps of 32 keys on tiles, P and V zero past the block's last key. */
            const int64_t value_steps = (n + 2 * kTileSteps - 1) / (2 * kTileSteps);
            if (amx) {
                amx_scores(t.qt, key_rows, n, d, (char*)t.k, t.s, &values_ahead);
                interleave_value_pairs(t.value_rows, n, value_steps * kTileSteps, dv, t.v, ldv);
            } else
#endif
#if MFA_CPU_BF16_DOT
                if (pairs)
                dot_lanes<kLaneKeys, bf16_pair_lanes>(t.qt, key_rows, n, d, t.s, &values_ahead);
            else
#endif
                dot_lanes<kLaneKeys, f32_lanes>(t.qt, key_rows, n, lanes_in_place ? d : ld, t.s,
                                                &values_ahead);
            vi begin = vi{}, end = vi{} + (int32_t)n;
            vf distance = vf{};
            bool full = true;
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = decode_row_of(plan, seq, u.kv.head, r).query;
                const visible_range range =
                    mask[r] == kTileHidden ? visible_range{0, 0} : keys_of_query(seq, i, j0, n);
                distance[r] = (float)(i + seq.diag - j0);
                begin[r] = (int32_t)range.begin;
                end[r] = (int32_t)range.end;
                full &= range.begin == 0 && range.end == n;
                if (any_bias && mask[r] == kTilePlain)
                    for (int64_t c = 0; c < n; ++c) t.bias[c * W + r] = 0.0f;
            }
            const vf block_max = lanes_scores_for(mods[0].kinds | (any_bias ? kBias : 0))(
                t.s, n, lane_mods, distance, t.bias, begin, end, full);
            lanes_softmax(t.s, n, block_max, t.row_max, t.row_sum, t.o, ldv, amx ? ldv : 0);
            row_prefetch keys_ahead = {next_key_rows, next_n, key_bytes, 0, 0};
#if MFA_CPU_AMX
            if (amx) {
                round_pairs_to_rows(t.s, n, t.p_pairs, bk / 2);
                amx_values(t.p_pairs, bk / 2, t.v, ldv, value_steps, dv, t.o, ldv, &keys_ahead);
            } else
#endif
#if MFA_CPU_BF16_DOT
                if (pairs) {
                round_pairs_across_rows(t.s, n, W, t.p_pairs);
                const int64_t pair_rows = (n + 1) / 2;
                interleave_value_pairs(t.value_rows, n, pair_rows, dv, t.v, ldv);
                for (int64_t k = 0; k < pair_rows; ++k)
                    t.value_rows[k] = (const char*)(t.v + k * ldv);
                accumulate_lanes<bf16_pair_lanes>(t.p_pairs, t.value_rows, pair_rows, dv, t.o,
                                                  &keys_ahead);
            } else
#endif
            {
                if (!lanes_in_place)
                    convert_rows<Storage>(t.value_rows, n, values.elem_step, dv, t.v, ldv);
                accumulate_lanes<f32_lanes>(t.s, t.value_rows, n, dv, t.o, &keys_ahead);
            }
        } else if (any_visible) {
            values.addresses(j0, n, t.value_rows);
            row_prefetch values_ahead = {t.value_rows, n, value_bytes, 0, 0};
            if (pairs) {
#if MFA_CPU_BF16_DOT
                decode_products<bf16_pair_rows>(t.qt, rows, ld / 2, key_rows, d, n, t.s, bk,
                                                &values_ahead);
#endif
            } else if (in_place) {
                decode_products<Direct>(t.q, rows, ld, key_rows, d, n, t.s, bk, &values_ahead);
            } else {
                convert_rows<Storage>(key_rows, n, keys.elem_step, d, t.k, ld);
                decode_products<f32_storage>(t.q, rows, ld, key_rows, ld, n, t.s, bk,
                                             &values_ahead);
            }
            for (int64_t r = 0; r < rows; ++r) {
                float* s = t.s + r * bk;
                if (mask[r] == kTileHidden) {
                    for (int64_t c = 0; c < n_pad; ++c) s[c] = 0.0f;
                    continue;
                }
                const int64_t i = decode_row_of(plan, seq, u.kv.head, r).query;
                const visible_range range = keys_of_query(seq, i, j0, n);
                const float block_max = scores_row_for(mods[r], mask[r] == kTileBias)(
                    s, n_pad, mods[r], i + seq.diag - j0, t.bias ? t.bias + r * bk : t.bias, range);
                online_softmax_row(s, n_pad, block_max, t.row_max + r, t.row_sum + r, t.o + r * ldv,
                                   ldv);
            }
            row_prefetch keys_ahead = {next_key_rows, next_n, key_bytes, 0, 0};
            if (in_place) {
                decode_accumulate<Direct>(t.s, rows, bk, t.value_rows, dv, n, t.o, ldv,
                                          &keys_ahead);
            } else {
                convert_rows<Storage>(t.value_rows, n, values.elem_step, dv, t.v, ldv);
                decode_accumulate<f32_storage>(t.s, rows, bk, t.value_rows, ldv, n, t.o, ldv,
                                               &keys_ahead);
            }
        }
        const char** done = key_rows;
        key_rows = next_key_rows;
        next_key_rows = done;
    }

    if (lanes && !amx) lanes_to_rows(t.o, rows, ldv, o_rows, ldv);
    for (int64_t r = 0; r < rows; ++r) {
        const float lse = finish_row(o_rows + r * ldv, ldv, t.row_max[r], t.row_sum[r]);
        if (splits > 1) {
            float* part = plan->partials + (task * mfa_cpu_decode_rows(plan) + r) *
                                               mfa_cpu_decode_partial_row_floats(plan);
            for (int64_t x = 0; x < dv; ++x) part[x] = o_rows[r * ldv + x];
            part[dv] = lse;
            continue;
        }
        const decode_row row = decode_row_of(plan, seq, u.kv.head, r);
        store_rows<Storage>(query_rows(p->out, es, seq, row.head, row.query), 1, dv,
                            o_rows + r * ldv, ldv, 1.0f);
        if (p->lse.data)
            f32_storage::store(query_rows(p->lse, sizeof(float), seq, row.head, row.query).row(0),
                               lse);
    }
    /* The unit's last range to finish merges them all (its slot is free again). The count's
     * acquire-release makes every range's partials visible here; the merge reads them in range
     * order, so the result does not depend on which task came last. */
    if (splits > 1 &&
        __atomic_add_fetch(plan->splits_done + u.g_local, 1, __ATOMIC_ACQ_REL) == splits)
        decode_merge_unit<Storage>(plan, u, task - u.local, slot);
}

} // namespace

#endif /* MFA_CPU_DECODE_INL */
