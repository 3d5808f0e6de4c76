/* libFuzzer target over every public entry point that takes caller-made arguments:
 * mfa_attention_forward, mfa_attention_backward, mfa_attention_compute and _encode (the same
 * calls through mfa_attention_args, with its own options and the arrays' byte offsets and
 * buffers), mfa_attention_merge, mfa_mask_summarize, mfa_context_create and
 * mfa_context_capabilities.
 *
 * The input bytes decode into a call (docs/fuzzing.md lists the format): a valid problem of
 * small random shape and layout (larger with --large-problems: sequences up to 512, head
 * dimensions up to 256), then up to eight mutations that break one thing each (a NULL
 * tensor or data pointer, a dtype, a dimension or stride from a table of hostile values, an
 * aliased, misaligned or wild data pointer) and fuzzed attention parameters.
 *
 * The oracle is an independent restatement of the rules in mfa.h (expected_outcome below): it
 * says which statuses a call may return. Buffers are allocated exactly as large as each tensor
 * claims, and only when that is small; a tensor that claims more points into a PROT_NONE guard
 * region, and a call is only made with such a tensor when the rules say it must be rejected.
 * So AddressSanitizer or a fault catches any byte the library touches outside what it was
 * given. After every call:
 *   - the status is one the rules allow;
 *   - on failure the message is non-empty and new, every output byte is unchanged;
 *   - on success every output element matches the float64 reference within the dtype's
 *     tolerance, and no byte between output elements (strided gaps) was written;
 *   - inputs are never modified.
 * A violated expectation prints what happened and aborts, which libFuzzer records as a crash. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mfa.h"
#include "sanitizer.h"
#include "test_reference.h"

#define POISON      0xA5
#define MAX_LISTED  ((int64_t)1 << 20) /* larger tensors' elements are not enumerated */
#define GUARD_BYTES ((size_t)1 << 16)
/* Problem sizes: by default calls stay tiny, so that the fuzzer makes thousands of them a
 * second; with --large-problems (an argument of the fuzzer's or the replay's command line:
 * libFuzzer leaves those that start with "--" to the target) they reach the kernels' multi-block
 * and wide-head paths, N up to 512 and D up to 256, at a few calls a second. Larger tensors are
 * never allocated, and valid calls above the work limit (multiply-adds of one reference pass;
 * lower on the slow simulator) are not run. */
typedef struct problem_limits {
    int64_t seq, head_dim, elements, work, sim_work;
} problem_limits;
static const problem_limits small_problems = {48, 24, (int64_t)1 << 16, (int64_t)1 << 22,
                                              (int64_t)1 << 22};
static const problem_limits large_problems = {512, 256, (int64_t)1 << 22, (int64_t)1 << 27,
                                              (int64_t)1 << 24};
static const problem_limits* limits = &small_problems;

enum role { Q, K, V, OUT, LSE, DOUT, DQ, DK, DV, ROLES };
static const char* const role_names[ROLES] = {"q",    "k",  "v",  "out", "lse",
                                              "dout", "dq", "dk", "dv"};

/* ---- Reading the input -------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t* data;
    size_t size;
} reader;

/* Next byte, 0 once the input is exhausted (so every input decodes to some call). */
static uint8_t next_byte(reader* r) {
    if (r->size == 0) return 0;
    --r->size;
    return *r->data++;
}

/* A size in [1, limit]: one byte, or two (little-endian) for limits above 256. */
static int64_t next_size(reader* r, int64_t limit) {
    int64_t value = next_byte(r);
    if (limit > 256) value |= (int64_t)next_byte(r) << 8;
    return 1 + value % limit;
}

static uint64_t next_u64(reader* r) {
    uint64_t x = 0;
    for (int i = 0; i < 8; ++i) x |= (uint64_t)next_byte(r) << (8 * i);
    return x;
}

static const int64_t hostile_values[] = {
    0,
    1,
    2,
    3,
    -1,
    -2,
    7,
    8,
    64,
    65,
    1024,
    1025,
    ((int64_t)1 << 31) - 1,
    (int64_t)1 << 31,
    (int64_t)1 << 32,
    (int64_t)1 << 40,
    (int64_t)1 << 62,
    INT64_MAX / 2,
    -(INT64_MAX / 4),
    INT64_MAX,
    INT64_MIN,
    INT64_MIN + 1,
    -((int64_t)1 << 31),
    ((int64_t)1 << 33) + 1,
};
#define HOSTILE_COUNT ((int)(sizeof hostile_values / sizeof hostile_values[0]))

/* A value from the hostile table, or (last slot) eight raw bytes. */
static int64_t next_hostile(reader* r) {
    const int pick = next_byte(r) % (HOSTILE_COUNT + 1);
    return pick < HOSTILE_COUNT ? hostile_values[pick] : (int64_t)next_u64(r);
}

/* ---- Checks ------------------------------------------------------------------------------- */

static void fail(const char* what, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char* what, ...) {
    va_list args;
    va_start(args, what);
    fprintf(stderr, "fuzz_attention: ");
    vfprintf(stderr, what, args);
    fprintf(stderr, "\n");
    va_end(args);
    abort();
}

/* ---- Memory ------------------------------------------------------------------------------- */

static char* guard_region; /* PROT_NONE: where tensors too large to allocate point */

/* Each allocation is fenced by CANARY_BYTES of poison on both sides. Under AddressSanitizer
 * the fences are poisoned for it, so any access there is reported at once; elsewhere they are
 * compared after every call, so a write just outside an array is caught in any build. */
#define CANARY_BYTES 64
#ifdef TEST_ASAN
#include <sanitizer/asan_interface.h>
#define FENCES_POISONED 1
#else
#define FENCES_POISONED                            0
#define ASAN_POISON_MEMORY_REGION(address, size)   ((void)(address), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(address, size) ((void)(address), (void)(size))
#endif

typedef struct allocation {
    unsigned char* bytes; /* NULL: none; else CANARY_BYTES into block */
    size_t size;
    unsigned char* block;    /* fence, bytes, fence */
    unsigned char* snapshot; /* contents of bytes before the call */
} allocation;

/* A tensor of the call, as built and as the oracle sees it. */
typedef struct fuzz_tensor {
    mfa_tensor t;
    bool present;   /* false: the call gets a NULL mfa_tensor* */
    int64_t lo, hi; /* element offsets spanned (valid when !overflow) */
    bool overflow;  /* offsets or element count leave int64 */
    allocation own; /* its own exactly-sized buffer, when small */
    int lives_in;   /* role whose allocation holds it, or -1 */
} fuzz_tensor;

static bool shapes_positive(const mfa_tensor* t) {
    for (int d = 0; d < 4; ++d)
        if (t->shape[d] < 1) return false;
    return true;
}

/* The element count and the offsets spanned, flagging any that leaves int64. Computed in 128
 * bits and stopped at the first overflow: every product and sum then starts from values
 * inside int64, so the harness itself never overflows. A dimension below 1 is the shape
 * rule's business, not an overflow. */
static void measure(fuzz_tensor* f) {
    f->overflow = false;
    f->lo = f->hi = 0;
    if (!shapes_positive(&f->t)) return;
    __int128 count = 1, lo = 0, hi = 0;
    for (int d = 0; d < 4; ++d) {
        const __int128 shape = f->t.shape[d];
        const __int128 term = (shape - 1) * (__int128)f->t.strides[d];
        count *= shape;
        if (term < 0)
            lo += term;
        else
            hi += term;
        if (count > INT64_MAX || lo < INT64_MIN || hi > INT64_MAX) {
            f->overflow = true;
            return;
        }
    }
    f->lo = (int64_t)lo;
    f->hi = (int64_t)hi;
}

/* Bytes of an attention operand's element: 0 for what is not f32, f16 or bf16. */
static int64_t element_size(int dtype) {
    return dtype == MFA_DTYPE_F32 ? 4 : (dtype == MFA_DTYPE_F16 || dtype == MFA_DTYPE_BF16) ? 2 : 0;
}

/* Bytes of an element of any mfa_dtype (masks and integers too): 0 for unknown values. */
static int64_t storage_size(int dtype) {
    return dtype == MFA_DTYPE_BOOL ? 1 : dtype == MFA_DTYPE_I32 ? 4 : element_size(dtype);
}

/* Is every byte the tensor spans inside allocation a? */
static bool spans_inside(const fuzz_tensor* f, const allocation* a) {
    const int64_t es = storage_size((int)f->t.dtype);
    if (a->bytes == NULL || f->overflow || es == 0 || !shapes_positive(&f->t)) return false;
    const __int128 first = (__int128)(intptr_t)f->t.data + (__int128)f->lo * es;
    const __int128 end = (__int128)(intptr_t)f->t.data + ((__int128)f->hi + 1) * es;
    return first >= (__int128)(intptr_t)a->bytes && end <= (__int128)(intptr_t)(a->bytes + a->size);
}

/* ---- Decoding a problem ------------------------------------------------------------------- */

/* What a call through mfa_attention_compute (or _encode) changes on top of the tensors. */
typedef struct compute_tweaks {
    int args;              /* 0: sizeof; 1: sizeof + 8; 2: 8; 3: 0; 4: NULL args */
    int direction;         /* the mfa_direction passed */
    bool encode;           /* through mfa_attention_encode, into a command buffer */
    float softcap;         /* args.softcap */
    int32_t initial_state; /* args.initial_state */
    int offset_role;       /* ROLES: none; else this array's byte_offset moves its data back */
    int64_t offset;
    int buffer_role;  /* ROLES: none; else this array gets a (fake) device buffer... */
    bool buffer_only; /* ...instead of its data, or beside it */
} compute_tweaks;

typedef struct call {
    bool backward;
    bool compute; /* through mfa_attention_args, with tweaks */
    compute_tweaks tweaks;
    mfa_context* ctx;
    bool null_params;
    mfa_attention_params params;
    fuzz_tensor tensors[ROLES];
    uint64_t value_seed;
} call;

/* Strides for a dense layout with dimensions ordered by `order` (outermost first), `pad` extra
 * elements after each dimension and a sign per dimension. */
static void layout(mfa_tensor* t, const int order[4], const int pad[4], unsigned negative) {
    int64_t stride = 1;
    for (int i = 3; i >= 0; --i) {
        const int d = order[i];
        t->strides[d] = (negative >> d) & 1 ? -stride : stride;
        stride *= t->shape[d] + pad[d];
    }
}

static void decode_layout(reader* r, mfa_tensor* t) {
    int order[4] = {0, 1, 2, 3};
    const uint8_t shuffle = next_byte(r);
    for (int i = 3, s = shuffle; i > 0; --i, s /= 4) { /* an arbitrary permutation */
        const int j = s % (i + 1), tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    const uint8_t padding = next_byte(r);
    int pad[4];
    for (int d = 0; d < 4; ++d) pad[d] = (padding >> (2 * d)) & 1;
    layout(t, order, pad, next_byte(r) & 15);
}

static void set_shape(mfa_tensor* t, int64_t b, int64_t h, int64_t s, int64_t d) {
    t->shape[0] = b;
    t->shape[1] = h;
    t->shape[2] = s;
    t->shape[3] = d;
}

static void decode_problem(reader* r, call* c) {
    const int dtype_pick = next_byte(r) % 4;
    const int dtype = dtype_pick < 3 ? dtype_pick : (int)(int8_t)next_byte(r);
    const int64_t batch = 1 + next_byte(r) % 2, heads_kv = 1 + next_byte(r) % 2;
    const int64_t heads_q = heads_kv * (1 + next_byte(r) % 3);
    const int64_t seq_q = next_size(r, limits->seq), seq_k = next_size(r, limits->seq);
    const int64_t head_dim = next_size(r, limits->head_dim);
    const int64_t head_dim_v = next_size(r, limits->head_dim);
    const int64_t shapes[ROLES][4] = {
        {batch, heads_q, seq_q, head_dim},    {batch, heads_kv, seq_k, head_dim},
        {batch, heads_kv, seq_k, head_dim_v}, {batch, heads_q, seq_q, head_dim_v},
        {batch, heads_q, seq_q, 1},           {batch, heads_q, seq_q, head_dim_v},
        {batch, heads_q, seq_q, head_dim},    {batch, heads_kv, seq_k, head_dim},
        {batch, heads_kv, seq_k, head_dim_v},
    };
    for (int i = 0; i < ROLES; ++i) {
        fuzz_tensor* f = &c->tensors[i];
        f->present = true;
        f->lives_in = -1;
        f->t.dtype = (mfa_dtype)(i == LSE ? MFA_DTYPE_F32 : dtype);
        set_shape(&f->t, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
        decode_layout(r, &f->t);
    }
    if (!c->backward)
        c->tensors[DOUT].present = c->tensors[DQ].present = c->tensors[DK].present =
            c->tensors[DV].present = false;
}

static void decode_params(reader* r, call* c) {
    static const float scales[] = {0.0f,  0.125f, 0.5f, 1.0f,     2.0f,     -0.75f,
                                   1e-3f, 1e-30f, NAN,  INFINITY, -INFINITY};
    static const size_t struct_sizes[] = {sizeof(mfa_attention_params),
                                          0,
                                          8,
                                          sizeof(mfa_attention_params) - 8,
                                          sizeof(mfa_attention_params) + 8,
                                          (size_t)1 << 40};
    static const int64_t windows[] = {
        -1, -1, 0, 1, 3, 17, -2, INT64_MIN, INT64_MAX, INT64_MAX - 1, (int64_t)1 << 40};
    const uint8_t flags = next_byte(r);
    c->null_params = (flags & 7) == 0;
    mfa_attention_params_init(&c->params);
    c->params.struct_size = struct_sizes[(flags >> 3) % 6 == 5 ? next_byte(r) % 6 : 0];
    c->params.scale = scales[next_byte(r) % (sizeof scales / sizeof scales[0])];
    const uint8_t causal = next_byte(r);
    c->params.causal = causal < 200 ? causal % 2 : (int32_t)(int8_t)causal;
    const uint8_t alignment = next_byte(r);
    c->params.alignment = (mfa_alignment)(alignment < 200 ? alignment % 2 : (int8_t)alignment);
    c->params.window_left = windows[next_byte(r) % (sizeof windows / sizeof windows[0])];
    c->params.window_right = windows[next_byte(r) % (sizeof windows / sizeof windows[0])];
}

/* Mutations: of what an array claims (applied before buffers are sized: NULL array, dtype,
 * shape, stride), of where its data lives (after: NULL data, misalignment, an alias of another
 * array's memory, a wild pointer); the merges and summaries add becoming exactly another
 * array's view or that view shifted by one element; the calls with the arguments of 0.2 add a
 * hostile value written into an integer array and a hostile max_seqlen. */
enum {
    M_NULL_TENSOR,
    M_NULL_DATA,
    M_DTYPE,
    M_SHAPE,
    M_SHAPE_NUDGE,
    M_STRIDE,
    M_MISALIGN,
    M_ALIAS,
    M_WILD_POINTER,
    M_KINDS, /* of the 0.1 calls */
    M_SAME_VIEW = M_KINDS,
    M_SHIFTED_VIEW,
    M_ARRAY_KINDS, /* of merges and mask summaries */
    M_VALUE = M_ARRAY_KINDS,
    M_MAX_SEQLEN,
    M_FEATURE_KINDS /* of the calls with the arguments of 0.2 */
};

typedef struct mutation {
    int kind, role, other, dim;
    int64_t value;
} mutation;

/* Up to max mutations of `kinds` kinds, each of an array in [first, arrays) (the other array of
 * an alias or view in [0, arrays)). */
static int decode_mutations(reader* r, mutation* m, int max, int kinds, int first, int arrays) {
    const int n = next_byte(r) % (max + 1);
    for (int i = 0; i < n; ++i) {
        m[i].kind = next_byte(r) % kinds;
        m[i].role = first + next_byte(r) % (arrays - first);
        m[i].other = next_byte(r) % arrays;
        m[i].dim = next_byte(r) % 4;
        m[i].value = m[i].kind == M_SHAPE_NUDGE ? (next_byte(r) % 2 ? 1 : -1)
                     : m[i].kind == M_VALUE     ? next_byte(r) | (int64_t)next_byte(r) << 8
                                                : next_hostile(r);
    }
    return n;
}

static void apply_claim(fuzz_tensor* f, const mutation* m) {
    mfa_tensor* t = &f[m->role].t;
    switch (m->kind) {
        case M_NULL_TENSOR: f[m->role].present = false; break;
        case M_DTYPE: t->dtype = (mfa_dtype)(int)m->value; break;
        case M_SHAPE: t->shape[m->dim] = m->value; break;
        case M_SHAPE_NUDGE: /* wraps: INT64_MAX + 1 is one more hostile value, INT64_MIN */
            t->shape[m->dim] = (int64_t)((uint64_t)t->shape[m->dim] + (uint64_t)m->value);
            break;
        case M_STRIDE: t->strides[m->dim] = m->value; break;
        default: break;
    }
}

static const uintptr_t wild_pointers[] = {
    16, 4096, (uintptr_t)1 << 47, UINTPTR_MAX - 15, UINTPTR_MAX / 2 + 1, ((uintptr_t)1 << 63) - 64,
};

/* Mutations of where the data lives; applied after buffers exist. */
static void apply_pointer(fuzz_tensor* f, const mutation* m) {
    fuzz_tensor *x = &f[m->role], *y = &f[m->other];
    switch (m->kind) {
        case M_NULL_DATA:
            x->t.data = NULL;
            x->lives_in = -1;
            break;
        case M_MISALIGN: x->t.data = (void*)((uintptr_t)x->t.data + 1); break;
        case M_ALIAS:
            if (m->other != m->role && y->lives_in >= 0) {
                x->t.data = y->t.data;
                x->lives_in = y->lives_in;
            }
            break;
        case M_WILD_POINTER:
            x->t.data = (void*)wild_pointers[(uint64_t)m->value %
                                             (sizeof wild_pointers / sizeof wild_pointers[0])];
            x->lives_in = -1;
            break;
        case M_SAME_VIEW:
        case M_SHIFTED_VIEW:
            if (m->other != m->role && y->lives_in >= 0 && y->present) {
                x->t = y->t;
                x->lo = y->lo, x->hi = y->hi, x->overflow = y->overflow;
                x->lives_in = y->lives_in;
                if (m->kind == M_SHIFTED_VIEW)
                    x->t.data = (char*)x->t.data + storage_size((int)x->t.dtype);
            }
            break;
        default: break;
    }
}

/* ---- The oracle: mfa.h's rules, restated ------------------------------------------------- */

#define STATUS_BIT(s) (1u << (s))

typedef struct outcome {
    unsigned required;  /* statuses of definite violations: the call must fail with one */
    unsigned permitted; /* statuses of conservative checks the library may also apply */
} outcome;

/* The element offsets of a small tensor, sorted. NULL when it is too large to list. */
static int compare_i64(const void* a, const void* b) {
    const int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
    return (x > y) - (x < y);
}

static int64_t* sorted_offsets(const mfa_tensor* t, int64_t* n) {
    *n = test_element_count(t);
    int64_t* o = (int64_t*)malloc((size_t)*n * sizeof *o);
    int64_t at = 0;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d) o[at++] = test_offset(t, b, h, s, d);
    qsort(o, (size_t)*n, sizeof *o, compare_i64);
    return o;
}

static bool listable(const fuzz_tensor* f) {
    return f->present && !f->overflow && shapes_positive(&f->t) && storage_size((int)f->t.dtype) &&
           test_element_count(&f->t) <= MAX_LISTED;
}

/* The quick test a library may use instead of listing elements (numpy's): ordered by |stride|,
 * each stride exceeds the extent of the smaller ones. It rejects some layouts whose elements
 * are in fact distinct, so failing it only permits an error. */
static bool strides_nested(const mfa_tensor* t) {
    __int128 magnitude[4], extent = 0;
    int order[4] = {0, 1, 2, 3};
    for (int d = 0; d < 4; ++d)
        magnitude[d] = t->strides[d] < 0 ? -(__int128)t->strides[d] : t->strides[d];
    for (int i = 1; i < 4; ++i)
        for (int j = i; j > 0 && magnitude[order[j]] < magnitude[order[j - 1]]; --j) {
            const int swap = order[j];
            order[j] = order[j - 1];
            order[j - 1] = swap;
        }
    for (int i = 0; i < 4; ++i) {
        const int d = order[i];
        if (t->shape[d] == 1) continue;
        if (magnitude[d] <= extent) return false;
        extent += magnitude[d] * (t->shape[d] - 1);
    }
    return true;
}

/* Do two listable tensors share a byte? Merges their sorted byte intervals. */
static bool share_bytes(const fuzz_tensor* a, const fuzz_tensor* b) {
    int64_t na, nb;
    int64_t* oa = sorted_offsets(&a->t, &na);
    int64_t* ob = sorted_offsets(&b->t, &nb);
    const __int128 ea = storage_size((int)a->t.dtype), eb = storage_size((int)b->t.dtype);
    const __int128 ba = (intptr_t)a->t.data, bb = (intptr_t)b->t.data;
    bool shared = false;
    for (int64_t i = 0, j = 0; i < na && j < nb && !shared;) {
        const __int128 a0 = ba + oa[i] * ea, b0 = bb + ob[j] * eb;
        if (a0 < b0 + eb && b0 < a0 + ea)
            shared = true;
        else if (a0 < b0)
            ++i;
        else
            ++j;
    }
    free(oa);
    free(ob);
    return shared;
}

static bool overlaps_itself(const fuzz_tensor* f) {
    int64_t n;
    int64_t* o = sorted_offsets(&f->t, &n);
    bool repeated = false;
    for (int64_t i = 1; i < n && !repeated; ++i) repeated = o[i] == o[i - 1];
    free(o);
    return repeated;
}

/* Whether every element of a tensor has memory of its own, as the forward's results do: the
 * quick nested-strides test, else the list of its elements; one too large to list that the
 * quick test rejects counts as overlapping. */
static bool elements_distinct(const fuzz_tensor* f) {
    return strides_nested(&f->t) || (listable(f) && !overlaps_itself(f));
}

/* The byte range [first, end) the tensor spans; false when it leaves the address space. */
static bool byte_range(const fuzz_tensor* f, __int128* first, __int128* end) {
    const int64_t es = storage_size((int)f->t.dtype);
    *first = (__int128)(uintptr_t)f->t.data + (__int128)f->lo * es;
    *end = (__int128)(uintptr_t)f->t.data + ((__int128)f->hi + 1) * es;
    const __int128 lo_bytes = (__int128)f->lo * es, end_bytes = ((__int128)f->hi + 1) * es;
    return lo_bytes >= INT64_MIN && end_bytes <= INT64_MAX && *first >= 0 &&
           *end <= (__int128)UINTPTR_MAX;
}

static void violation(outcome* o, mfa_status s) { o->required |= STATUS_BIT(s); }

/* A call's status against its outcome: a violated rule requires a failure with one of the
 * required (or permitted) statuses; otherwise the call succeeds or fails with a permitted one. */
static void check_status(const char* what, outcome expected, mfa_status status) {
    const unsigned allowed = expected.required | expected.permitted;
    if (expected.required && (status == MFA_OK || !(STATUS_BIT(status) & allowed)))
        fail("%s returned %d (%s) but the rules require one of mask 0x%x (maybe 0x%x); message: %s",
             what, (int)status, mfa_status_string(status), expected.required, expected.permitted,
             mfa_last_error());
    if (!expected.required && status != MFA_OK && !(STATUS_BIT(status) & expected.permitted))
        fail("%s of valid arguments failed: %s: %s", what, mfa_status_string(status),
             mfa_last_error());
}

static outcome expected_outcome(const call* c, const mfa_capabilities* caps) {
    outcome o = {0, 0};
    const fuzz_tensor* f = c->tensors;
    const int roles_used = c->backward ? ROLES : DOUT;
    const int dtype = (int)f[Q].t.dtype;

    if (!c->null_params) {
        const mfa_attention_params* p = &c->params;
        if (p->struct_size != sizeof *p || !isfinite(p->scale) ||
            (p->causal != 0 && p->causal != 1) ||
            (p->alignment != MFA_ALIGN_BOTTOM_RIGHT && p->alignment != MFA_ALIGN_TOP_LEFT) ||
            p->window_left < -1 || p->window_right < -1)
            violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    }
    if (c->backward && !(caps->features & MFA_FEATURE_BACKWARD))
        violation(&o, MFA_ERROR_UNSUPPORTED);
    if (f[Q].present && element_size(dtype) && !(caps->dtypes & (1u << dtype)))
        violation(&o, MFA_ERROR_UNSUPPORTED);

    /* Sizes every role must match, from q, k and v as the header defines them. */
    const int64_t* qs = f[Q].t.shape;
    const int64_t* ks = f[K].t.shape;
    const int64_t* vs = f[V].t.shape;
    const int64_t expected[ROLES][4] = {
        {-1, -1, -1, -1},
        {qs[0], -1, -1, qs[3]},
        {qs[0], ks[1], ks[2], -1},
        {qs[0], qs[1], qs[2], vs[3]},
        {qs[0], qs[1], qs[2], 1},
        {qs[0], qs[1], qs[2], vs[3]},
        {qs[0], qs[1], qs[2], qs[3]},
        {qs[0], ks[1], ks[2], qs[3]},
        {qs[0], ks[1], ks[2], vs[3]},
    };
    const bool depends_on[ROLES][3] = {{0},       {1, 0, 0}, {1, 1, 0}, {1, 0, 1}, {1, 0, 0},
                                       {1, 0, 1}, {1, 0, 0}, {1, 1, 0}, {1, 1, 1}};
    for (int i = 0; i < roles_used; ++i) {
        const fuzz_tensor* t = &f[i];
        const bool output = c->backward ? i >= DQ : (i == OUT || i == LSE);
        if (!t->present) {
            if (i != LSE || c->backward) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
            continue;
        }
        const int want_dtype = i == LSE ? MFA_DTYPE_F32 : dtype;
        if (t->t.data == NULL || !element_size((int)t->t.dtype) || (int)t->t.dtype != want_dtype ||
            !shapes_positive(&t->t)) {
            violation(&o, MFA_ERROR_INVALID_ARGUMENT);
            continue;
        }
        for (int d = 0; d < 4; ++d) {
            const bool known = (!depends_on[i][0] || f[Q].present) &&
                               (!depends_on[i][1] || f[K].present) &&
                               (!depends_on[i][2] || f[V].present);
            if (known && expected[i][d] != -1 && t->t.shape[d] != expected[i][d])
                violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        }
        __int128 first, end;
        if (t->overflow || !byte_range(t, &first, &end)) {
            violation(&o, MFA_ERROR_SIZE_OVERFLOW);
            continue;
        }
        if ((uintptr_t)t->t.data % (uintptr_t)element_size((int)t->t.dtype))
            violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        if (!output) continue;
        /* Exact self-overlap is an error; a quicker sufficient test may reject more. */
        if (listable(t) && overlaps_itself(t))
            violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        else if (!strides_nested(&t->t))
            o.permitted |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
        for (int j = 0; j < roles_used; ++j) {
            const fuzz_tensor* u = &f[j];
            __int128 u_first, u_end;
            if (j == i || !u->present || u->t.data == NULL || !element_size((int)u->t.dtype) ||
                u->overflow || !shapes_positive(&u->t) || !byte_range(u, &u_first, &u_end))
                continue;
            if (first < u_end && u_first < end) {
                if (listable(t) && listable(u) && share_bytes(t, u))
                    violation(&o, MFA_ERROR_INVALID_ARGUMENT);
                else
                    o.permitted |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
            }
        }
    }
    if (f[Q].present && f[K].present && shapes_positive(&f[Q].t) && shapes_positive(&f[K].t)) {
        if (qs[1] % ks[1] != 0) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        if (qs[3] > caps->max_head_dim) violation(&o, MFA_ERROR_UNSUPPORTED);
    }
    if (f[V].present && shapes_positive(&f[V].t) && vs[3] > caps->max_head_dim)
        violation(&o, MFA_ERROR_UNSUPPORTED);
    return o;
}

/* ---- mfa_attention_compute: the same calls through mfa_attention_args -------------------- */

/* Read after the mutations, so that the bytes before keep the format of the 0.1 calls. */
static void decode_tweaks(reader* r, bool backward, compute_tweaks* t) {
    static const float softcaps[] = {0.0f, 0.0f, 0.0f, 1.5f, 50.0f, -1.0f, NAN, INFINITY, -0.0f};
    static const int bad_directions[] = {2, -1, 7, INT32_MIN};
    const int args = next_byte(r) % 8;
    t->args = args < 4 ? 0 : args - 3;
    const uint8_t direction = next_byte(r);
    t->direction = backward ? MFA_BACKWARD : MFA_FORWARD;
    if (direction >= 240 && direction < 244) t->direction = bad_directions[direction - 240];
    t->encode = direction >= 244;
    t->softcap = softcaps[next_byte(r) % (sizeof softcaps / sizeof softcaps[0])];
    const int state = next_byte(r) % 5;
    t->initial_state = state < 3 ? 0 : state - 2;
    t->offset_role = next_byte(r) % (ROLES + 1);
    t->offset = t->offset_role < ROLES ? next_hostile(r) : 0;
    const int buffer = next_byte(r) % (2 * ROLES + 1);
    t->buffer_role = buffer < 2 * ROLES ? buffer % ROLES : ROLES;
    t->buffer_only = buffer >= ROLES && buffer < 2 * ROLES;
}

/* A fake device buffer is only ever given to a context without device buffers, which must
 * refuse it without looking at it. */
static bool fakes_buffer(const call* c, const mfa_capabilities* caps, int role) {
    return c->tweaks.buffer_role == role && !(caps->features & MFA_FEATURE_DEVICE_BUFFERS);
}

/* The rules of mfa_attention_args and mfa_attention_compute beyond the tensors'. A valid call
 * using a feature the reference does not model is not run (*unrunnable). */
static void compute_outcome(const call* c, const mfa_capabilities* caps, outcome* o,
                            bool* unrunnable) {
    const compute_tweaks* t = &c->tweaks;
    if (t->encode && !(caps->features & MFA_FEATURE_ENCODE)) violation(o, MFA_ERROR_UNSUPPORTED);
    /* Encoding takes device arrays only, and the fuzzed arrays are host memory: rejected before
     * the (fake) command buffer is looked at. */
    if (t->encode && (caps->features & MFA_FEATURE_ENCODE))
        violation(o, MFA_ERROR_INVALID_ARGUMENT);
    if (t->direction != MFA_FORWARD && t->direction != MFA_BACKWARD)
        violation(o, MFA_ERROR_INVALID_ARGUMENT);
    if (t->args != 0) violation(o, MFA_ERROR_INVALID_ARGUMENT);
    const uint32_t have = c->backward ? caps->backward_features : caps->features;
    if (!isfinite(t->softcap) || t->softcap < 0) {
        violation(o, MFA_ERROR_INVALID_ARGUMENT);
    } else if (t->softcap > 0) {
        if (!(have & MFA_FEATURE_SOFTCAP))
            violation(o, MFA_ERROR_UNSUPPORTED);
        else
            *unrunnable = true;
    }
    if (t->initial_state != 0) {
        if (c->backward || t->initial_state != 1 || !c->tensors[LSE].present)
            violation(o, MFA_ERROR_INVALID_ARGUMENT);
        else if (!(have & MFA_FEATURE_INITIAL_STATE))
            violation(o, MFA_ERROR_UNSUPPORTED);
        else
            *unrunnable = true;
    }
    const int roles_used = c->backward ? ROLES : DOUT;
    for (int i = 0; i < roles_used; ++i) {
        const fuzz_tensor* f = &c->tensors[i];
        if (!f->present) continue;
        bool has_data = f->t.data != NULL;
        if (t->offset_role == i && has_data) {
            /* data - offset, then offset added back: the same origin unless the pointer
             * wrapped, which puts the origin outside the address space. */
            const __int128 moved = (__int128)(uintptr_t)f->t.data - t->offset;
            if (moved < 0 || moved > (__int128)UINTPTR_MAX)
                violation(o, MFA_ERROR_SIZE_OVERFLOW);
            else if (moved == 0)
                has_data = false;
            if (moved == 0 && !fakes_buffer(c, caps, i)) violation(o, MFA_ERROR_INVALID_ARGUMENT);
        }
        if (fakes_buffer(c, caps, i))
            violation(o, t->buffer_only || !has_data ? MFA_ERROR_UNSUPPORTED
                                                     : MFA_ERROR_INVALID_ARGUMENT);
    }
}

/* The call's tensors as arrays, tweaked, through mfa_attention_compute or _encode. */
static mfa_status call_compute(const call* c, const mfa_capabilities* caps,
                               const mfa_tensor* const* tensors,
                               const mfa_attention_params* params) {
    const compute_tweaks* t = &c->tweaks;
    mfa_array arrays[ROLES];
    const mfa_array* use[ROLES];
    for (int i = 0; i < ROLES; ++i) {
        use[i] = NULL;
        if (!tensors[i]) continue;
        mfa_array* a = &arrays[i];
        memset(a, 0, sizeof *a);
        a->data = tensors[i]->data;
        a->dtype = tensors[i]->dtype;
        memcpy(a->shape, tensors[i]->shape, sizeof a->shape);
        memcpy(a->strides, tensors[i]->strides, sizeof a->strides);
        if (t->offset_role == i && a->data != NULL) {
            a->data = (void*)((uintptr_t)a->data - (uintptr_t)t->offset);
            a->byte_offset = t->offset;
        }
        if (fakes_buffer(c, caps, i)) {
            a->buffer = (void*)(uintptr_t)4096;
            if (t->buffer_only) a->data = NULL;
        }
        use[i] = a;
    }
    static const size_t sizes[4] = {sizeof(mfa_attention_args), sizeof(mfa_attention_args) + 8, 8,
                                    0};
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.struct_size = sizes[t->args < 4 ? t->args : 0];
    args.softcap = t->softcap;
    args.initial_state = t->initial_state;
    args.q = use[Q], args.k = use[K], args.v = use[V], args.out = use[OUT], args.lse = use[LSE];
    args.dout = use[DOUT], args.dq = use[DQ], args.dk = use[DK], args.dv = use[DV];
    const mfa_attention_args* given = t->args == 4 ? NULL : &args;
    if (t->encode)
        return mfa_attention_encode(c->ctx, (void*)(uintptr_t)4096, (mfa_direction)t->direction,
                                    params, given);
    return mfa_attention_compute(c->ctx, (mfa_direction)t->direction, params, given);
}

/* ---- Running an attention call ------------------------------------------------------------ */

/* What the run exercised, printed at exit: a run that never reaches the reference check or
 * never gets past validation would look green while testing little. */
static struct {
    long long checked[2], rejected[2], skipped[2], contexts_created, contexts_rejected;
    long long through_compute, merges[3], summaries[3], features[3]; /* checked, rejected,
                                                                        not run */
} stats;

static void print_stats(void) {
    fprintf(stderr,
            "fuzz_attention: forward %lld checked against the reference, %lld rejected, %lld valid "
            "but too large to run; backward %lld / %lld / %lld (%lld of these calls through "
            "mfa_attention_compute); contexts %lld created, %lld rejected; merges %lld / %lld / "
            "%lld; mask summaries %lld / %lld / %lld; 0.2 arguments %lld / %lld / %lld\n",
            stats.checked[0], stats.rejected[0], stats.skipped[0], stats.checked[1],
            stats.rejected[1], stats.skipped[1], stats.through_compute, stats.contexts_created,
            stats.contexts_rejected, stats.merges[0], stats.merges[1], stats.merges[2],
            stats.summaries[0], stats.summaries[1], stats.summaries[2], stats.features[0],
            stats.features[1], stats.features[2]);
}

static mfa_context* contexts[4]; /* cpu with 1 and 2 threads, then metal-sim ones if built */
static int context_count;
static int64_t max_work[4]; /* per context */
/* No fuzzed call passes a NULL context, so this message can only be left over. */
static const char stale_message_marker[] = "ctx is NULL";

/* Leave a known message behind, so a failing call is seen to set its own. */
static void plant_stale_message(void) { mfa_context_capabilities(NULL, NULL); }

static bool is_output(const call* c, int role) {
    return c->backward ? role >= DQ : (role == OUT || role == LSE);
}

static const uint32_t float_dtypes =
    1u << MFA_DTYPE_F32 | 1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16;

/* Whether test_set can store into the view. An array whose dtype a mutation made an integer one
 * keeps its poison: the call must reject it before reading it. */
static bool holds_floats(const mfa_tensor* t) {
    return (unsigned)t->dtype < 32 && (float_dtypes >> t->dtype & 1u);
}

static void fill_inputs(call* c) {
    test_rng_state = c->value_seed | 1;
    for (int i = Q; i <= (c->backward ? DOUT : V); ++i) {
        const fuzz_tensor* f = &c->tensors[i];
        if (f->lives_in == i && !(c->backward && (i == OUT || i == LSE)) && holds_floats(&f->t))
            test_fill_view_random(&f->t);
    }
}

static ref_problem problem_of(const call* c) {
    return ref_problem_of(&c->tensors[Q].t, &c->tensors[K].t, &c->tensors[V].t,
                          c->null_params ? NULL : &c->params);
}

/* Backward needs out and lse from a forward pass: the reference's, stored in their dtypes. */
static void fill_forward_results(call* c, const ref_problem* p) {
    fuzz_tensor *out = &c->tensors[OUT], *lse = &c->tensors[LSE];
    if (out->lives_in != OUT || lse->lives_in != LSE) return;
    ref_result r = ref_forward(p, &c->tensors[Q].t, &c->tensors[K].t, &c->tensors[V].t);
    int64_t at = 0;
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->heads_q; ++h)
            for (int64_t s = 0; s < p->seq_q; ++s, ++at) {
                test_set(&lse->t, b, h, s, 0, (float)r.lse[at]);
                for (int64_t y = 0; y < p->head_dim_v; ++y)
                    test_set(&out->t, b, h, s, y, (float)r.out[at * p->head_dim_v + y]);
            }
    ref_free(&r);
}

static void check_results(const call* c, const ref_problem* p, mfa_dtype dtype) {
    char why[256];
    const fuzz_tensor* f = c->tensors;
    if (!c->backward) {
        ref_result r = ref_forward(p, &f[Q].t, &f[K].t, &f[V].t);
        if (!ref_compare(&f[OUT].t, dtype, r.out, r.out_mag, p->seq_k + p->head_dim, r.max_score,
                         why, sizeof why))
            fail("forward out: %s", why);
        if (f[LSE].present && !ref_compare(&f[LSE].t, MFA_DTYPE_F32, r.lse, r.lse_mag,
                                           p->seq_k + p->head_dim, r.max_score, why, sizeof why))
            fail("forward lse: %s", why);
        ref_free(&r);
        return;
    }
    ref_result r =
        ref_backward(p, &f[Q].t, &f[K].t, &f[V].t, &f[OUT].t, &f[DOUT].t, &f[LSE].t, NULL);
    const int64_t n =
        p->head_dim + p->head_dim_v + p->seq_k + p->seq_q * (p->heads_q / p->heads_kv);
    if (!ref_compare(&f[DQ].t, dtype, r.dq, r.dq_mag, n, r.max_score, why, sizeof why))
        fail("dq: %s", why);
    if (!ref_compare(&f[DK].t, dtype, r.dk, r.dk_mag, n, r.max_score, why, sizeof why))
        fail("dk: %s", why);
    if (!ref_compare(&f[DV].t, dtype, r.dv, r.dv_mag, n, r.max_score, why, sizeof why))
        fail("dv: %s", why);
    ref_free(&r);
}

/* Exactly sized, fenced buffers for small arrays, the guard region for the others, filled
 * with poison. Small means both few bytes spanned and few elements: a zero stride makes a
 * huge array out of a few bytes, and filling it element by element would take hours. A call
 * is only made with an array in the guard region when the rules say that it must be rejected
 * before that array is read. */
static void allocate(fuzz_tensor* f, int count) {
    for (int i = 0; i < count; ++i) {
        measure(&f[i]);
        const int64_t es = storage_size((int)f[i].t.dtype);
        const __int128 elements = (__int128)f[i].hi - f[i].lo + 1;
        f[i].lives_in = -1;
        if (f[i].present && !f[i].overflow && es && shapes_positive(&f[i].t) &&
            elements <= limits->elements && test_element_count(&f[i].t) <= limits->elements) {
            allocation* a = &f[i].own;
            a->size = (size_t)elements * (size_t)es;
            a->block = (unsigned char*)malloc(a->size + 2 * CANARY_BYTES);
            memset(a->block, POISON, a->size + 2 * CANARY_BYTES);
            a->bytes = a->block + CANARY_BYTES;
            ASAN_POISON_MEMORY_REGION(a->block, CANARY_BYTES);
            ASAN_POISON_MEMORY_REGION(a->bytes + a->size, CANARY_BYTES);
            f[i].t.data = a->bytes - f[i].lo * es;
            f[i].lives_in = i;
        } else {
            f[i].t.data = guard_region + 4096;
        }
    }
}

static void snapshot(fuzz_tensor* f, int count) {
    for (int i = 0; i < count; ++i) {
        if (!f[i].own.bytes) continue;
        f[i].own.snapshot = (unsigned char*)malloc(f[i].own.size);
        memcpy(f[i].own.snapshot, f[i].own.bytes, f[i].own.size);
    }
}

/* Every fence still holds the poison (under AddressSanitizer a touch was already reported). */
static void check_fences(const char* what, const fuzz_tensor* f, int count) {
    for (int i = 0; i < count && !FENCES_POISONED; ++i) {
        const allocation* a = &f[i].own;
        if (!a->bytes) continue;
        for (size_t x = 0; x < CANARY_BYTES; ++x)
            if (a->block[x] != POISON || a->bytes[a->size + x] != POISON)
                fail("%s: a byte %s array %d was written", what,
                     a->block[x] != POISON ? "before" : "after", i);
    }
}

static bool backed_by_itself_or(const fuzz_tensor* f, const fuzz_tensor* all) {
    return f->lives_in >= 0 && spans_inside(f, &all[f->lives_in].own) &&
           all[f->lives_in].t.dtype == f->t.dtype;
}

/* Bytes of an array's own allocation that hold no element are as they were. */
static void check_gaps(const char* what, const fuzz_tensor* x) {
    if (!x->own.bytes || !spans_inside(x, &x->own)) return;
    const int64_t es = storage_size((int)x->t.dtype);
    unsigned char* element = (unsigned char*)calloc(x->own.size, 1);
    const int64_t origin = (char*)x->t.data - (char*)x->own.bytes;
    for (int64_t b = 0; b < x->t.shape[0]; ++b)
        for (int64_t h = 0; h < x->t.shape[1]; ++h)
            for (int64_t s = 0; s < x->t.shape[2]; ++s)
                for (int64_t d = 0; d < x->t.shape[3]; ++d)
                    memset(element + origin + test_offset(&x->t, b, h, s, d) * es, 1, (size_t)es);
    for (size_t i = 0; i < x->own.size; ++i)
        if (!element[i] && x->own.bytes[i] != x->own.snapshot[i])
            fail("%s: byte %zu between elements was written", what, i);
    free(element);
}

/* After a call: on failure a new, non-empty message and no byte changed; on success only the
 * allocations in `written` (bits) may have; no fence touched. names (or NULL: numbers) name the
 * arrays in messages. */
static void check_memory(const char* what, const fuzz_tensor* f, int count,
                         const char* const* names, mfa_status status, unsigned written) {
    const char* message = mfa_last_error();
    if (status != MFA_OK && (message[0] == '\0' || strncmp(message, stale_message_marker,
                                                           sizeof stale_message_marker - 1) == 0))
        fail("%s: status %s with an empty or stale message", what, mfa_status_string(status));
    for (int i = 0; i < count; ++i) {
        if (!f[i].own.bytes) continue;
        if ((status != MFA_OK || !((written >> i) & 1)) &&
            memcmp(f[i].own.bytes, f[i].own.snapshot, f[i].own.size) != 0) {
            char label[32];
            snprintf(label, sizeof label, "array %d", i);
            fail("%s: %s was modified (status %s; message: %s)", what, names ? names[i] : label,
                 mfa_status_string(status), message);
        }
    }
    check_fences(what, f, count);
}

static void release_all(fuzz_tensor* f, int count) {
    for (int i = 0; i < count; ++i) {
        allocation* a = &f[i].own;
        if (a->block) ASAN_UNPOISON_MEMORY_REGION(a->block, a->size + 2 * CANARY_BYTES);
        free(a->block);
        free(a->snapshot);
    }
}

static void run_attention(reader* r, bool backward, bool compute) {
    call c;
    memset(&c, 0, sizeof c);
    c.backward = backward;
    c.compute = compute;
    const int context = next_byte(r) % context_count;
    c.ctx = contexts[context];
    c.value_seed = next_u64(r);
    decode_problem(r, &c);
    decode_params(r, &c);
    mutation m[8];
    const int n = decode_mutations(r, m, 8, M_KINDS, 0, ROLES);
    for (int i = 0; i < n; ++i) apply_claim(c.tensors, &m[i]);
    if (compute) decode_tweaks(r, backward, &c.tweaks);

    allocate(c.tensors, ROLES);
    for (int i = 0; i < n; ++i) apply_pointer(c.tensors, &m[i]);

    mfa_capabilities caps;
    caps.struct_size = sizeof caps;
    if (mfa_context_capabilities(c.ctx, &caps) != MFA_OK)
        fail("capabilities: %s", mfa_last_error());
    outcome expected = expected_outcome(&c, &caps);
    bool unrunnable = false;
    if (compute) compute_outcome(&c, &caps, &expected, &unrunnable);

    /* Runnable: every tensor lies inside memory we own, holding values of its own dtype, and
     * (backward) out and lse are the ones the reference forward pass fills in, in memory of
     * their own that no other tensor lives in: that pass writes them after the inputs are
     * filled, and would change an input aliased onto them under the library's feet. Nor may
     * they overlap themselves (a zero batch stride): two rows' results would share elements,
     * the last written would stand for both, and the backward would get an out and lse that no
     * forward pass returns, which mfa.h leaves undefined. */
    bool backed = true;
    for (int i = 0; i < (backward ? ROLES : DOUT); ++i) {
        const fuzz_tensor* f = &c.tensors[i];
        if (!f->present) continue;
        const bool forward_result = i == OUT || i == LSE;
        if (f->lives_in < 0 || !spans_inside(f, &c.tensors[f->lives_in].own) ||
            c.tensors[f->lives_in].t.dtype != f->t.dtype ||
            (backward && forward_result && (f->lives_in != i || !elements_distinct(f))) ||
            (backward && !forward_result && (f->lives_in == OUT || f->lives_in == LSE)))
            backed = false;
    }
    const mfa_tensor* q = &c.tensors[Q].t;
    int64_t work = 0;
    if (!expected.required) {
        const int64_t kv = c.tensors[K].t.shape[2] * (q->shape[3] + c.tensors[V].t.shape[3]);
        if (!backed || unrunnable ||
            __builtin_mul_overflow(test_element_count(q) / q->shape[3], kv, &work) ||
            work > max_work[context]) {
            ++stats.skipped[backward];
            return release_all(c.tensors, ROLES);
        }
        ref_problem p = problem_of(&c);
        fill_inputs(&c);
        if (backward) fill_forward_results(&c, &p);
    }
    snapshot(c.tensors, ROLES);

    const mfa_tensor* arg[ROLES];
    for (int i = 0; i < ROLES; ++i) arg[i] = c.tensors[i].present ? &c.tensors[i].t : NULL;
    const mfa_attention_params* params = c.null_params ? NULL : &c.params;
    plant_stale_message();
    const mfa_status status =
        compute ? call_compute(&c, &caps, arg, params)
        : backward
            ? mfa_attention_backward(c.ctx, params, arg[Q], arg[K], arg[V], arg[OUT], arg[DOUT],
                                     arg[LSE], arg[DQ], arg[DK], arg[DV])
            : mfa_attention_forward(c.ctx, params, arg[Q], arg[K], arg[V], arg[OUT], arg[LSE]);
    if (compute) ++stats.through_compute;
    const char* what = backward ? "backward" : "forward";
    check_status(what, expected, status);
    /* Inputs never change; outputs (their own buffers) change only on success. */
    unsigned written = 0;
    for (int i = 0; i < ROLES; ++i)
        if (is_output(&c, i) && c.tensors[i].present) written |= 1u << i;
    check_memory(what, c.tensors, ROLES, role_names, status, written);
    ++(status == MFA_OK ? stats.checked : stats.rejected)[backward];
    if (status == MFA_OK) {
        for (int i = 0; i < ROLES; ++i)
            if ((written >> i) & 1) check_gaps(role_names[i], &c.tensors[i]);
        ref_problem p = problem_of(&c);
        check_results(&c, &p, q->dtype);
    }
    release_all(c.tensors, ROLES);
}

/* ---- The rules of any one array, for the calls below -------------------------------------- */

/* Violations of one array that must hold one of `dtypes` and the expected sizes (-1: free;
 * or_one: 1 is accepted too). Returns whether it is sound enough for the overlap checks. */
static bool array_outcome(const fuzz_tensor* f, uint32_t dtypes, const int64_t expected[4],
                          const bool or_one[4], bool output, outcome* o) {
    const int dtype = (int)f->t.dtype;
    if (!f->present || f->t.data == NULL || dtype < MFA_DTYPE_F32 || dtype > MFA_DTYPE_I32 ||
        !((dtypes >> dtype) & 1) || !shapes_positive(&f->t)) {
        violation(o, MFA_ERROR_INVALID_ARGUMENT);
        return false;
    }
    for (int d = 0; d < 4; ++d)
        if (expected[d] != -1 && f->t.shape[d] != expected[d] && !(or_one[d] && f->t.shape[d] == 1))
            violation(o, MFA_ERROR_INVALID_ARGUMENT);
    __int128 first, end;
    if (f->overflow || !byte_range(f, &first, &end)) {
        violation(o, MFA_ERROR_SIZE_OVERFLOW);
        return false;
    }
    if ((uintptr_t)f->t.data % (uintptr_t)storage_size(dtype))
        violation(o, MFA_ERROR_INVALID_ARGUMENT);
    if (output) {
        if (listable(f) && overlaps_itself(f))
            violation(o, MFA_ERROR_INVALID_ARGUMENT);
        else if (!strides_nested(&f->t))
            o->permitted |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
    }
    return true;
}

/* The same view: memory, dtype, shape, and the strides of every dimension that is stepped. */
static bool same_view(const fuzz_tensor* a, const fuzz_tensor* b) {
    if (a->t.data != b->t.data || a->t.dtype != b->t.dtype) return false;
    for (int d = 0; d < 4; ++d)
        if (a->t.shape[d] != b->t.shape[d] ||
            (a->t.shape[d] > 1 && a->t.strides[d] != b->t.strides[d]))
            return false;
    return true;
}

/* An output against another sound array: sharing a byte is an error, intersecting extents may
 * be rejected too; `exact_ok` exempts the very same view (merging in place). */
static void overlap_outcome(const fuzz_tensor* output, const fuzz_tensor* other, bool exact_ok,
                            outcome* o) {
    if (exact_ok && same_view(output, other)) return;
    __int128 a0, a1, b0, b1;
    if (!byte_range(output, &a0, &a1) || !byte_range(other, &b0, &b1)) return;
    if (a0 < b1 && b0 < a1) {
        if (listable(output) && listable(other) && share_bytes(output, other))
            violation(o, MFA_ERROR_INVALID_ARGUMENT);
        else
            o->permitted |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
    }
}

/* ---- mfa_attention_merge ------------------------------------------------------------------ */

enum { MERGE_PARTS = 4 };
/* The arrays of a merge: the parts' outs, the parts' lses, out, lse. */
enum {
    MERGE_OUTS = 0,
    MERGE_LSES = MERGE_PARTS,
    MERGE_OUT = 2 * MERGE_PARTS,
    MERGE_LSE,
    MERGE_ARRAYS
};

static outcome merge_outcome(int32_t count, const fuzz_tensor* f, bool want_lse) {
    outcome o = {0, 0};
    if (count < 1) {
        violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        return o;
    }
    const int64_t* first = f[MERGE_OUTS].t.shape;
    const int64_t out_shape[4] = {first[0], first[1], first[2], first[3]};
    const int64_t lse_shape[4] = {first[0], first[1], first[2], 1};
    const int64_t free_shape[4] = {-1, -1, -1, -1};
    const bool none[4] = {false, false, false, false};
    const bool first_sound = f[MERGE_OUTS].present;
    bool sound[MERGE_ARRAYS] = {false};
    for (int i = 0; i < count; ++i) {
        sound[MERGE_OUTS + i] =
            array_outcome(&f[MERGE_OUTS + i], float_dtypes,
                          i == 0 || !first_sound ? free_shape : out_shape, none, false, &o);
        sound[MERGE_LSES + i] =
            array_outcome(&f[MERGE_LSES + i], 1u << MFA_DTYPE_F32,
                          first_sound ? lse_shape : free_shape, none, false, &o);
    }
    sound[MERGE_OUT] = array_outcome(&f[MERGE_OUT], float_dtypes,
                                     first_sound ? out_shape : free_shape, none, true, &o);
    if (want_lse)
        sound[MERGE_LSE] = array_outcome(&f[MERGE_LSE], 1u << MFA_DTYPE_F32,
                                         first_sound ? lse_shape : free_shape, none, true, &o);
    for (int x = MERGE_OUT; x <= (want_lse ? MERGE_LSE : MERGE_OUT); ++x) {
        if (!sound[x]) continue;
        for (int i = 0; i < count; ++i) {
            if (sound[MERGE_OUTS + i])
                overlap_outcome(&f[x], &f[MERGE_OUTS + i], x == MERGE_OUT, &o);
            if (sound[MERGE_LSES + i])
                overlap_outcome(&f[x], &f[MERGE_LSES + i], x == MERGE_LSE, &o);
        }
    }
    if (want_lse && sound[MERGE_OUT] && sound[MERGE_LSE])
        overlap_outcome(&f[MERGE_OUT], &f[MERGE_LSE], false, &o);
    return o;
}

/* Up to max (at most 8) mutations of the array kinds, of arrays [0, count), then the arrays:
 * what a mutation claims of a shape, dtype or stride before they are allocated, where their
 * data lives after. */
static void mutate_and_allocate(reader* r, fuzz_tensor* f, int count, int max) {
    mutation m[8];
    const int n = decode_mutations(r, m, max, M_ARRAY_KINDS, 0, count);
    for (int i = 0; i < n; ++i) apply_claim(f, &m[i]);
    allocate(f, count);
    for (int i = 0; i < n; ++i) apply_pointer(f, &m[i]);
}

static void run_merge(reader* r) {
    mfa_context* ctx = contexts[next_byte(r) % context_count];
    test_rng_state = next_u64(r) | 1;
    const int pick = next_byte(r) % 8;
    const int32_t count = pick < 6 ? 1 + pick % MERGE_PARTS : pick == 6 ? 0 : -1;
    const int parts = count > 0 ? count : 1;
    const int64_t b = 1 + next_byte(r) % 2, h = 1 + next_byte(r) % 2, n = 1 + next_byte(r) % 6;
    const int64_t dv = 1 + next_byte(r) % 8;
    const bool lse_wanted = next_byte(r) % 4 != 0;
    fuzz_tensor f[MERGE_ARRAYS];
    memset(f, 0, sizeof f);
    for (int i = 0; i < MERGE_ARRAYS; ++i) {
        const bool lse = (i >= MERGE_LSES && i < MERGE_OUT) || i == MERGE_LSE;
        f[i].present = i >= MERGE_OUT ? (i == MERGE_OUT || lse_wanted) : i % MERGE_PARTS < parts;
        f[i].t.dtype = lse ? MFA_DTYPE_F32 : (mfa_dtype)(next_byte(r) % 3);
        set_shape(&f[i].t, b, h, n, lse ? 1 : dv);
        decode_layout(r, &f[i].t);
    }
    mutate_and_allocate(r, f, MERGE_ARRAYS, 6);
    const bool want_lse = f[MERGE_LSE].present; /* NULL: not wanted, which is valid */

    const outcome expected = merge_outcome(count, f, want_lse);
    bool backed = true;
    for (int i = 0; i < MERGE_ARRAYS; ++i)
        if (f[i].present && (i >= MERGE_OUT || i % MERGE_PARTS < parts))
            backed = backed && backed_by_itself_or(&f[i], f);
    if (!expected.required && !backed) {
        ++stats.merges[2];
        return release_all(f, MERGE_ARRAYS);
    }
    /* Parts' values: outs in [-1, 1), lses in [-3, 3] with empty (-inf) parts and some NaN and
     * +inf, which poison their rows. */
    for (int i = 0; i < parts && !expected.required; ++i) {
        if (f[MERGE_OUTS + i].lives_in == MERGE_OUTS + i && holds_floats(&f[MERGE_OUTS + i].t))
            test_fill_view_random(&f[MERGE_OUTS + i].t);
        const fuzz_tensor* l = &f[MERGE_LSES + i];
        if (l->lives_in != MERGE_LSES + i || !holds_floats(&l->t)) continue;
        for (int64_t x = 0; x < b; ++x)
            for (int64_t y = 0; y < h; ++y)
                for (int64_t z = 0; z < n; ++z) {
                    const double u = test_uniform();
                    const float v = u < -0.6   ? -INFINITY
                                    : u > 0.97 ? NAN
                                    : u > 0.95 ? INFINITY
                                               : (float)(3 * test_uniform());
                    test_set(&l->t, x, y, z, 0, v);
                }
    }
    /* The reference, from the parts as stored, before an in-place merge overwrites them. */
    double* want_out = NULL;
    double* ref_lse = NULL;
    if (!expected.required) {
        want_out = (double*)calloc((size_t)(b * h * n * dv), sizeof *want_out);
        ref_lse = (double*)calloc((size_t)(b * h * n), sizeof *ref_lse);
        const mfa_tensor* part_outs[MERGE_PARTS];
        const mfa_tensor* part_lses[MERGE_PARTS];
        for (int i = 0; i < count; ++i)
            part_outs[i] = &f[MERGE_OUTS + i].t, part_lses[i] = &f[MERGE_LSES + i].t;
        ref_merge(count, part_outs, part_lses, want_out, ref_lse);
    }
    snapshot(f, MERGE_ARRAYS);
    mfa_array arrays[MERGE_ARRAYS];
    const mfa_array* outs[MERGE_PARTS];
    const mfa_array* lses[MERGE_PARTS];
    for (int i = 0; i < MERGE_ARRAYS; ++i) arrays[i] = test_array_of(&f[i].t);
    for (int i = 0; i < MERGE_PARTS; ++i) {
        outs[i] = f[MERGE_OUTS + i].present ? &arrays[MERGE_OUTS + i] : NULL;
        lses[i] = f[MERGE_LSES + i].present ? &arrays[MERGE_LSES + i] : NULL;
    }
    plant_stale_message();
    const mfa_status status = mfa_attention_merge(ctx, count, outs, lses,
                                                  f[MERGE_OUT].present ? &arrays[MERGE_OUT] : NULL,
                                                  want_lse ? &arrays[MERGE_LSE] : NULL);
    check_status("merge", expected, status);
    unsigned written = 0;
    if (f[MERGE_OUT].lives_in >= 0) written |= 1u << f[MERGE_OUT].lives_in;
    if (want_lse && f[MERGE_LSE].lives_in >= 0) written |= 1u << f[MERGE_LSE].lives_in;
    check_memory("merge", f, MERGE_ARRAYS, NULL, status, written);
    ++stats.merges[status == MFA_OK ? 0 : 1];
    char why[200];
    if (status == MFA_OK && !ref_compare_merge(&f[MERGE_OUT].t, want_lse ? &f[MERGE_LSE].t : NULL,
                                               want_out, ref_lse, why, sizeof why))
        fail("merge %s", why);
    free(want_out);
    free(ref_lse);
    release_all(f, MERGE_ARRAYS);
}

/* ---- mfa_mask_summarize ------------------------------------------------------------------- */

enum { SUMMARY_MASK, SUMMARY_OUT, SUMMARY_ARRAYS };

static int64_t mask_blocks(int64_t n) { return n / MFA_MASK_BLOCK + (n % MFA_MASK_BLOCK != 0); }

/* The code of mfa.h for one block, from the mask as stored (broadcast through size 1). */
static int summary_code(const mfa_tensor* mask, int64_t b, int64_t h, int64_t r, int64_t c,
                        int64_t seq_q, int64_t seq_k) {
    bool hidden = false, plain = false, other = false;
    for (int64_t i = r * MFA_MASK_BLOCK; i < seq_q && i < (r + 1) * MFA_MASK_BLOCK; ++i)
        for (int64_t j = c * MFA_MASK_BLOCK; j < seq_k && j < (c + 1) * MFA_MASK_BLOCK; ++j) {
            const int64_t o =
                test_offset(mask, mask->shape[0] == 1 ? 0 : b, mask->shape[1] == 1 ? 0 : h,
                            mask->shape[2] == 1 ? 0 : i, mask->shape[3] == 1 ? 0 : j);
            if (mask->dtype == MFA_DTYPE_BOOL) {
                if (((const unsigned char*)mask->data)[o])
                    plain = true;
                else
                    hidden = true;
                continue;
            }
            const mfa_tensor element = {(char*)mask->data + o * storage_size((int)mask->dtype),
                                        mask->dtype,
                                        {1, 1, 1, 1},
                                        {0, 0, 0, 0}};
            const double value = test_get(&element, 0, 0, 0, 0);
            if (value == -INFINITY)
                hidden = true;
            else if (value == 0)
                plain = true;
            else
                other = true;
        }
    return other || (hidden && plain) ? 1 : hidden ? 0 : 2;
}

static void run_summary(reader* r) {
    /* Lengths beyond the decoded range broadcast the mask (dims of 1), so nothing large is
     * allocated; 2^20 still makes a summary too large to allocate. */
    static const int64_t lengths[] = {0, -1, 64, 65, 128, 1, (int64_t)1 << 20, -((int64_t)1 << 40)};
    mfa_context* ctx = contexts[next_byte(r) % context_count];
    test_rng_state = next_u64(r) | 1;
    const int dtype_pick = next_byte(r) % 5;
    const int dtype = dtype_pick == 0  ? MFA_DTYPE_BOOL
                      : dtype_pick < 4 ? dtype_pick - 1
                                       : (int)(int8_t)next_byte(r);
    const uint8_t q_pick = next_byte(r), k_pick = next_byte(r);
    const int64_t seq_q = q_pick < 248 ? 1 + q_pick % 150 : lengths[q_pick - 248];
    const int64_t seq_k = k_pick < 248 ? 1 + k_pick % 150 : lengths[k_pick - 248];
    const uint8_t dims = next_byte(r);
    const bool stride0 = (dims >> 4) & 1; /* the batch through stride 0: summary batch 1 */
    const int64_t mb = 1 + (dims & 1), mh = 1 + ((dims >> 1) & 1);
    const int64_t mq = (dims >> 2) & 1 || q_pick >= 248 ? 1 : seq_q;
    const int64_t mk = (dims >> 3) & 1 || k_pick >= 248 ? 1 : seq_k;
    fuzz_tensor f[SUMMARY_ARRAYS];
    memset(f, 0, sizeof f);
    f[SUMMARY_MASK].present = f[SUMMARY_OUT].present = true;
    f[SUMMARY_MASK].t.dtype = (mfa_dtype)dtype;
    set_shape(&f[SUMMARY_MASK].t, mb, mh, mq, mk);
    decode_layout(r, &f[SUMMARY_MASK].t);
    if (stride0 && mb == 2) f[SUMMARY_MASK].t.strides[0] = 0;
    f[SUMMARY_OUT].t.dtype = MFA_DTYPE_BOOL;
    set_shape(&f[SUMMARY_OUT].t, stride0 ? 1 : mb, mh, seq_q < 1 ? 1 : mask_blocks(seq_q),
              seq_k < 1 ? 1 : mask_blocks(seq_k));
    decode_layout(r, &f[SUMMARY_OUT].t);
    mutate_and_allocate(r, f, SUMMARY_ARRAYS, 4);

    outcome o = {0, 0};
    if (seq_q < 1 || seq_k < 1) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    const mfa_tensor* mask = &f[SUMMARY_MASK].t;
    const int64_t mask_shape[4] = {-1, -1, seq_q, seq_k};
    const bool mask_or_one[4] = {false, false, true, true};
    const bool mask_sound = array_outcome(&f[SUMMARY_MASK],
                                          1u << MFA_DTYPE_BOOL | 1u << MFA_DTYPE_F32 |
                                              1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16,
                                          mask_shape, mask_or_one, false, &o);
    const int64_t summary_shape[4] = {mask->shape[0], mask->shape[1], mask_blocks(seq_q),
                                      mask_blocks(seq_k)};
    const bool summary_or_one[4] = {mask->shape[0] == 1 || mask->strides[0] == 0,
                                    mask->shape[1] == 1 || mask->strides[1] == 0, false, false};
    const bool summary_sound = array_outcome(&f[SUMMARY_OUT], 1u << MFA_DTYPE_BOOL, summary_shape,
                                             summary_or_one, true, &o);
    if (mask_sound && summary_sound) overlap_outcome(&f[SUMMARY_OUT], &f[SUMMARY_MASK], false, &o);

    const bool backed =
        backed_by_itself_or(&f[SUMMARY_MASK], f) && backed_by_itself_or(&f[SUMMARY_OUT], f);
    /* Filling the mask and checking the summary visit every element of the mask and, for every
     * batch and head of the summary, every pair: both bounded (a broadcast dimension of a
     * hostile size costs no memory, but would cost that much time). */
    const int64_t *ms = mask->shape, *ss = f[SUMMARY_OUT].t.shape;
    const bool too_long =
        (double)ms[0] * (double)ms[1] * (double)ms[2] * (double)ms[3] > limits->work ||
        (double)ss[0] * (double)ss[1] * (double)seq_q * (double)seq_k > limits->work;
    if (!o.required && (!backed || too_long)) {
        ++stats.summaries[2];
        return release_all(f, SUMMARY_ARRAYS);
    }
    if (!o.required) {
        /* Blocks of one kind or mixed, so that every code occurs: hidden, plain, other. */
        const int64_t* s = mask->shape;
        for (int64_t x = 0; x < s[0]; ++x)
            for (int64_t y = 0; y < s[1]; ++y)
                for (int64_t i = 0; i < s[2]; ++i)
                    for (int64_t j = 0; j < s[3]; ++j) {
                        const int kind = (int)((i / 64 * 7 + j / 64 * 3 + x + y) % 4);
                        const double u = test_uniform();
                        const int64_t at = test_offset(mask, x, y, i, j);
                        if (mask->dtype == MFA_DTYPE_BOOL) {
                            ((unsigned char*)mask->data)[at] = kind == 0   ? 0
                                                               : kind == 1 ? 3
                                                               : u < 0     ? 1
                                                                           : 0;
                        } else {
                            const float value = kind == 0   ? -INFINITY
                                                : kind == 1 ? (u < 0 ? 0.0f : -0.0f)
                                                : kind == 2 ? (u < 0 ? 0.0f : -INFINITY)
                                                : u < -0.9  ? NAN
                                                            : (float)u;
                            test_set(mask, x, y, i, j, value);
                        }
                    }
    }
    snapshot(f, SUMMARY_ARRAYS);
    const mfa_array mask_array = test_array_of(&f[SUMMARY_MASK].t);
    const mfa_array summary_array = test_array_of(&f[SUMMARY_OUT].t);
    plant_stale_message();
    const mfa_status status =
        mfa_mask_summarize(ctx, f[SUMMARY_MASK].present ? &mask_array : NULL, seq_q, seq_k,
                           f[SUMMARY_OUT].present ? &summary_array : NULL);
    check_status("mask summary", o, status);
    check_memory("mask summary", f, SUMMARY_ARRAYS, NULL, status, 1u << SUMMARY_OUT);
    ++stats.summaries[status == MFA_OK ? 0 : 1];
    if (status == MFA_OK) {
        const mfa_tensor* s = &f[SUMMARY_OUT].t;
        mfa_tensor read = *mask;
        if (read.strides[0] == 0) read.shape[0] = 1;
        for (int64_t x = 0; x < s->shape[0]; ++x)
            for (int64_t y = 0; y < s->shape[1]; ++y)
                for (int64_t i = 0; i < s->shape[2]; ++i)
                    for (int64_t j = 0; j < s->shape[3]; ++j) {
                        const int got = ((const unsigned char*)s->data)[test_offset(s, x, y, i, j)];
                        const int want = summary_code(&read, x, y, i, j, seq_q, seq_k);
                        if (got != want)
                            fail("mask summary[%lld, %lld, %lld, %lld] = %d, reference %d",
                                 (long long)x, (long long)y, (long long)i, (long long)j, got, want);
                    }
    }
    release_all(f, SUMMARY_ARRAYS);
}

/* ---- mfa_attention_compute with the arguments of 0.2 ------------------------------------- */

/* A valid call with score modifiers (mask, block mask, softcap, ALiBi, sinks and dsinks), an
 * initial state, and a dense, packed (cu_seqlens) or paged (block table, cache lengths,
 * appended keys) layout; then up to six mutations of its 0.2 arguments: the array kinds above
 * (a NULL array, NULL data, dtype, shape, stride, misalignment, aliasing, a wild pointer, another
 * array's view), a hostile value written into an integer array or a block mask, a hostile
 * max_seqlen. features_outcome restates mfa.h's rules for these arguments; a call that succeeds
 * is checked against the float64 reference sequence by sequence, and (paged) the caches must
 * hold exactly the appended rows and nothing else new. */

enum {
    F_Q,
    F_K,
    F_V,
    F_OUT,
    F_LSE,
    F_DOUT,
    F_DQ,
    F_DK,
    F_DV,
    F_MASK,
    F_BLOCK_MASK,
    F_ALIBI,
    F_SINKS,
    F_DSINKS,
    F_CU_Q,
    F_CU_K,
    F_TABLE,
    F_LENGTHS,
    F_K_NEW,
    F_V_NEW,
    F_ARRAYS
};

enum { LAYOUT_DENSE, LAYOUT_PACKED, LAYOUT_PAGED };
enum { F_MAX_SEQS = 3, F_MAX_BLOCKS = 3 };

static const int32_t hostile_i32[] = {-1, 0,  1,   2,   3,   5,         7,         8,
                                      9,  64, 255, 256, 257, INT32_MAX, INT32_MIN, INT32_MAX - 1};
#define HOSTILE_I32_COUNT ((int)(sizeof hostile_i32 / sizeof hostile_i32[0]))

typedef struct features_call {
    mfa_context* ctx;
    int context;
    int layout; /* as decoded; mutations may ask for another (features_layout) */
    bool backward;
    mfa_dtype dtype;
    int64_t batch; /* sequences */
    int64_t heads_q, heads_kv, head_dim, head_dim_v;
    mfa_attention_params params;
    float softcap;
    int32_t initial_state;
    int64_t max_seqlen_q, max_seqlen_k;
    int32_t cu_q[F_MAX_SEQS + 1], cu_k[F_MAX_SEQS + 1];          /* packed */
    int32_t table[F_MAX_SEQS][F_MAX_BLOCKS], cached[F_MAX_SEQS]; /* paged */
    fuzz_tensor f[F_ARRAYS];
} features_call;

static bool has(const features_call* c, int i) { return c->f[i].present; }

/* The layout the arguments ask for, as mfa_attention_args defines it; -1: both kinds, which
 * is invalid. */
static int features_layout(const features_call* c) {
    const bool packed =
        has(c, F_CU_Q) || has(c, F_CU_K) || c->max_seqlen_q != 0 || c->max_seqlen_k != 0;
    const bool paged = has(c, F_TABLE) || has(c, F_LENGTHS) || has(c, F_K_NEW) || has(c, F_V_NEW);
    if (packed && paged) return -1;
    return packed ? LAYOUT_PACKED : paged ? LAYOUT_PAGED : LAYOUT_DENSE;
}

static int32_t read_i32_at(const fuzz_tensor* f, int64_t b, int64_t e) {
    return ((const int32_t*)f->t.data)[test_offset(&f->t, b, 0, 0, e)];
}

static void decode_features(reader* r, features_call* c) {
    static const float softcaps[] = {0.0f,  0.0f,  0.0f,   0.0f,  0.5f, 2.5f,
                                     30.0f, -0.0f, 1e-30f, -1.0f, NAN,  INFINITY};
    static const int64_t windows[] = {-1, -1, -1, 0, 1, 3};
    static const int64_t block_sizes[] = {8, 16, 8, 24, 32, 8, 12, 264};
    memset(c, 0, sizeof *c);
    c->context = next_byte(r) % context_count;
    c->ctx = contexts[c->context];
    test_rng_state = next_u64(r) | 1;
    c->layout = next_byte(r) % 3;
    const uint8_t flags = next_byte(r);
    c->backward = c->layout != LAYOUT_PAGED && (flags & 3) == 0;
    c->dtype = (mfa_dtype)(next_byte(r) % 3);
    c->heads_kv = 1 + next_byte(r) % 2;
    c->heads_q = c->heads_kv * (1 + next_byte(r) % 2);
    c->head_dim = 1 + next_byte(r) % 16;
    c->head_dim_v = 1 + next_byte(r) % 16;
    mfa_attention_params_init(&c->params);
    c->params.causal = (flags >> 2) & 1;
    c->params.alignment = (mfa_alignment)((flags >> 3) & 1);
    c->params.window_left = windows[next_byte(r) % 6];
    c->params.window_right = windows[next_byte(r) % 6];
    c->softcap = softcaps[next_byte(r) % (sizeof softcaps / sizeof softcaps[0])];
    c->initial_state = !c->backward && ((flags >> 4) & 3) == 0;

    int64_t nq, q_rows, kv_batch, kv_rows, mask_q, mask_k, max_blocks = 1, new_keys = 0;
    c->batch = 1 + next_byte(r) % F_MAX_SEQS;
    const int64_t batch = c->batch;
    if (c->layout == LAYOUT_PACKED) {
        for (int64_t b = 0; b < batch; ++b) {
            const int64_t lq = next_byte(r) % 7, lk = next_byte(r) % 7;
            c->cu_q[b + 1] = c->cu_q[b] + (int32_t)lq;
            c->cu_k[b + 1] = c->cu_k[b] + (int32_t)lk;
            if (lq > c->max_seqlen_q) c->max_seqlen_q = lq;
            if (lk > c->max_seqlen_k) c->max_seqlen_k = lk;
        }
        /* A packed tensor holds one row at least: the last sequence gets it. */
        if (c->cu_q[batch] == 0) c->cu_q[batch] = 1, c->max_seqlen_q = 1;
        if (c->cu_k[batch] == 0) c->cu_k[batch] = 1, c->max_seqlen_k = 1;
        const uint8_t slack = next_byte(r);
        c->max_seqlen_q += slack & 3, c->max_seqlen_k += (slack >> 2) & 3;
        nq = q_rows = c->cu_q[batch];
        kv_batch = 1, kv_rows = c->cu_k[batch];
        mask_q = c->max_seqlen_q, mask_k = c->max_seqlen_k;
    } else if (c->layout == LAYOUT_PAGED) {
        nq = q_rows = 1 + next_byte(r) % 4;
        kv_rows = block_sizes[next_byte(r) % 8];
        max_blocks = 1 + next_byte(r) % F_MAX_BLOCKS;
        kv_batch = batch * max_blocks + next_byte(r) % 2;
        new_keys = next_byte(r) % 3;
        /* The table: a shuffle of the blocks, so no block is reached twice. */
        int32_t order[F_MAX_SEQS * F_MAX_BLOCKS + 1];
        for (int32_t i = 0; i < (int32_t)kv_batch; ++i) order[i] = i;
        for (int64_t i = kv_batch - 1; i > 0; --i) {
            const int64_t j = next_byte(r) % (i + 1);
            const int32_t swap = order[i];
            order[i] = order[j];
            order[j] = swap;
        }
        const int64_t capacity = max_blocks * kv_rows;
        for (int64_t b = 0; b < batch; ++b) {
            for (int64_t i = 0; i < max_blocks; ++i) c->table[b][i] = order[b * max_blocks + i];
            const int64_t room = capacity - new_keys + 1;
            c->cached[b] = (int32_t)(room > 0 ? (next_byte(r) | next_byte(r) << 8) % room : 0);
        }
        mask_q = nq, mask_k = capacity;
    } else {
        nq = q_rows = 1 + next_byte(r) % 12;
        kv_batch = batch, kv_rows = 1 + next_byte(r) % 12;
        mask_q = nq, mask_k = kv_rows;
    }
    const int64_t q_batch = c->layout == LAYOUT_PACKED ? 1 : batch;
    const int64_t hq = c->heads_q, hkv = c->heads_kv, d = c->head_dim, dv = c->head_dim_v;
    const int64_t shapes[F_ARRAYS][4] = {
        [F_Q] = {q_batch, hq, q_rows, d},
        [F_K] = {kv_batch, hkv, kv_rows, d},
        [F_V] = {kv_batch, hkv, kv_rows, dv},
        [F_OUT] = {q_batch, hq, q_rows, dv},
        [F_LSE] = {q_batch, hq, q_rows, 1},
        [F_DOUT] = {q_batch, hq, q_rows, dv},
        [F_DQ] = {q_batch, hq, q_rows, d},
        [F_DK] = {kv_batch, hkv, kv_rows, d},
        [F_DV] = {kv_batch, hkv, kv_rows, dv},
        [F_MASK] = {batch, hq, mask_q, mask_k},
        [F_BLOCK_MASK] = {batch, hq, mask_blocks(mask_q), mask_blocks(mask_k)},
        [F_ALIBI] = {batch, hq, 1, 1},
        [F_SINKS] = {1, hq, 1, 1},
        [F_DSINKS] = {1, hq, 1, 1},
        [F_CU_Q] = {1, 1, 1, batch + 1},
        [F_CU_K] = {1, 1, 1, batch + 1},
        [F_TABLE] = {batch, 1, 1, max_blocks},
        [F_LENGTHS] = {batch, 1, 1, 1},
        [F_K_NEW] = {batch, hkv, new_keys ? new_keys : 1, d},
        [F_V_NEW] = {batch, hkv, new_keys ? new_keys : 1, dv},
    };
    (void)nq;
    fuzz_tensor* f = c->f;
    for (int i = 0; i < F_ARRAYS; ++i) {
        f[i].t.dtype = c->dtype;
        set_shape(&f[i].t, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    }
    f[F_LSE].t.dtype = f[F_ALIBI].t.dtype = f[F_SINKS].t.dtype = f[F_DSINKS].t.dtype =
        MFA_DTYPE_F32;
    f[F_BLOCK_MASK].t.dtype = MFA_DTYPE_BOOL;
    f[F_CU_Q].t.dtype = f[F_CU_K].t.dtype = f[F_TABLE].t.dtype = f[F_LENGTHS].t.dtype =
        MFA_DTYPE_I32;
    for (int i = F_Q; i <= F_OUT; ++i) f[i].present = true;
    for (int i = F_DOUT; i <= F_DV; ++i) f[i].present = c->backward;
    f[F_LSE].present = c->backward || c->initial_state || (flags >> 6) != 0;

    /* The modifiers: a mask broadcast over any of its dimensions (size 1, or stride 0 on the
     * batch), with its summary or not; ALiBi per head or per sequence and head; sinks. */
    const uint8_t mask_pick = next_byte(r), dims = next_byte(r);
    if ((mask_pick & 7) >= 2 && (mask_pick & 7) <= 4) {
        const int kind = (mask_pick & 7) - 2;
        f[F_MASK].present = true;
        f[F_MASK].t.dtype = kind == 0 ? MFA_DTYPE_BOOL : kind == 1 ? MFA_DTYPE_F32 : c->dtype;
        int64_t* s = f[F_MASK].t.shape;
        for (int dim = 0; dim < 4; ++dim)
            if ((dims >> dim) & 1) s[dim] = 1;
        f[F_BLOCK_MASK].present = (mask_pick & 0x30) == 0;
        f[F_BLOCK_MASK].t.shape[0] = s[0] == 1 || (dims & 16) ? 1 : s[0];
        f[F_BLOCK_MASK].t.shape[1] = s[1];
    }
    const uint8_t extras = next_byte(r);
    f[F_ALIBI].present = (extras & 3) == 1 || (extras & 3) == 2; /* per head, per sequence */
    if ((extras & 3) == 1) f[F_ALIBI].t.shape[0] = 1;
    f[F_SINKS].present = (extras >> 2) & 1;
    f[F_DSINKS].present = c->backward && f[F_SINKS].present && ((extras >> 3) & 1);
    f[F_CU_Q].present = f[F_CU_K].present = c->layout == LAYOUT_PACKED;
    f[F_TABLE].present = f[F_LENGTHS].present = c->layout == LAYOUT_PAGED;
    f[F_K_NEW].present = f[F_V_NEW].present = c->layout == LAYOUT_PAGED && new_keys > 0;
    for (int i = 0; i < F_ARRAYS; ++i) decode_layout(r, &f[i].t);
    if ((dims & 16) && f[F_MASK].t.shape[0] > 1) f[F_MASK].t.strides[0] = 0;
}

/* Random values for the floating-point inputs, the generated integers, and a correct summary
 * of the mask; then (M_VALUE) the hostile integers. Arrays that live in another's memory are
 * not filled: they read what that one holds. Returns whether the block mask (if any) still
 * summarizes the mask: a hostile byte in either may leave valid codes that do not, and mfa.h
 * trusts the summary, so the results of such a call are not the mask's. */
static bool fillable(const fuzz_tensor* f, int i) {
    const int64_t es = storage_size((int)f[i].t.dtype);
    return f[i].present && f[i].lives_in == i && backed_by_itself_or(&f[i], f) &&
           (uintptr_t)f[i].t.data % (uintptr_t)es == 0;
}

static bool fill_features(features_call* c, const mutation* m, int mutations) {
    fuzz_tensor* f = c->f;
    for (int i = 0; i < F_ARRAYS; ++i) {
        const fuzz_tensor* x = &f[i];
        if (!fillable(f, i)) continue;
        const mfa_tensor* t = &x->t;
        const bool state = c->initial_state && (i == F_OUT || i == F_LSE);
        if (t->dtype != MFA_DTYPE_BOOL && !holds_floats(t)) continue;
        if (i <= F_V || i == F_DOUT || state || i == F_K_NEW || i == F_V_NEW) {
            if (holds_floats(t)) test_fill_view_random(t);
        } else if (i == F_MASK || i == F_ALIBI || i == F_SINKS) {
            for (int64_t b = 0; b < t->shape[0]; ++b)
                for (int64_t h = 0; h < t->shape[1]; ++h)
                    for (int64_t s = 0; s < t->shape[2]; ++s)
                        for (int64_t d = 0; d < t->shape[3]; ++d) {
                            const double u = test_uniform();
                            const int64_t at = test_offset(t, b, h, s, d);
                            if (t->dtype == MFA_DTYPE_BOOL)
                                ((unsigned char*)t->data)[at] = u < -0.6 ? 0 : u < 0.8 ? 1 : 7;
                            else if (i == F_MASK)
                                test_set(t, b, h, s, d, u < -0.7 ? -INFINITY : (float)u);
                            else if (i == F_ALIBI)
                                test_set(t, b, h, s, d, (float)(0.02 + 0.5 * fabs(u)));
                            else
                                test_set(t, b, h, s, d, (float)(2 * u));
                        }
        }
    }
    /* Some rows of an initial state start empty: lse -inf, and an out of NaN, which mfa.h
     * promises is not read. */
    if (c->initial_state && fillable(f, F_LSE) && fillable(f, F_OUT) && holds_floats(&f[F_LSE].t) &&
        holds_floats(&f[F_OUT].t)) {
        const mfa_tensor *t = &f[F_LSE].t, *out = &f[F_OUT].t;
        for (int64_t b = 0; b < t->shape[0]; ++b)
            for (int64_t h = 0; h < t->shape[1]; ++h)
                for (int64_t s = 0; s < t->shape[2]; ++s) {
                    if (test_uniform() >= -0.5) continue;
                    test_set(t, b, h, s, 0, -INFINITY);
                    for (int64_t y = 0; y < out->shape[3]; ++y) test_set(out, b, h, s, y, NAN);
                }
    }
    for (int side = 0; side < 2; ++side) {
        const fuzz_tensor* x = &f[side ? F_CU_K : F_CU_Q];
        if (fillable(f, side ? F_CU_K : F_CU_Q) && x->t.dtype == MFA_DTYPE_I32)
            for (int64_t e = 0; e < x->t.shape[3] && e <= F_MAX_SEQS; ++e)
                ((int32_t*)x->t.data)[test_offset(&x->t, 0, 0, 0, e)] =
                    side ? c->cu_k[e] : c->cu_q[e];
    }
    const fuzz_tensor *table = &f[F_TABLE], *lengths = &f[F_LENGTHS];
    if (fillable(f, F_TABLE) && table->t.dtype == MFA_DTYPE_I32)
        for (int64_t b = 0; b < table->t.shape[0] && b < F_MAX_SEQS; ++b)
            for (int64_t e = 0; e < table->t.shape[3] && e < F_MAX_BLOCKS; ++e)
                ((int32_t*)table->t.data)[test_offset(&table->t, b, 0, 0, e)] = c->table[b][e];
    if (fillable(f, F_LENGTHS) && lengths->t.dtype == MFA_DTYPE_I32)
        for (int64_t b = 0; b < lengths->t.shape[0] && b < F_MAX_SEQS; ++b)
            ((int32_t*)lengths->t.data)[test_offset(&lengths->t, b, 0, 0, 0)] = c->cached[b];
    const fuzz_tensor *mask = &f[F_MASK], *summary = &f[F_BLOCK_MASK];
    if (fillable(f, F_BLOCK_MASK) && mask->present && backed_by_itself_or(mask, f) &&
        storage_size((int)mask->t.dtype) && summary->t.dtype == MFA_DTYPE_BOOL &&
        (uintptr_t)mask->t.data % (uintptr_t)storage_size((int)mask->t.dtype) == 0) {
        mfa_tensor read = mask->t;
        if (read.strides[0] == 0) read.shape[0] = 1;
        const int64_t* s = summary->t.shape;
        const int64_t nq = s[2] * MFA_MASK_BLOCK, nk = s[3] * MFA_MASK_BLOCK;
        for (int64_t b = 0; b < s[0]; ++b)
            for (int64_t h = 0; h < s[1]; ++h)
                for (int64_t i = 0; i < s[2]; ++i)
                    for (int64_t j = 0; j < s[3]; ++j)
                        ((unsigned char*)summary->t.data)[test_offset(&summary->t, b, h, i, j)] =
                            (b < read.shape[0] || read.shape[0] == 1) &&
                                    (h < read.shape[1] || read.shape[1] == 1)
                                ? (unsigned char)summary_code(
                                      &read, b, h, i, j, read.shape[2] == 1 ? nq : read.shape[2],
                                      read.shape[3] == 1 ? nk : read.shape[3])
                                : 1;
    }
    for (int i = 0; i < mutations; ++i) {
        const fuzz_tensor* x = &f[m[i].role];
        if (m[i].kind != M_VALUE || !x->present || !backed_by_itself_or(x, f) ||
            (uintptr_t)x->t.data % (uintptr_t)storage_size((int)x->t.dtype))
            continue;
        const int64_t count = test_element_count(&x->t);
        if (count < 1 || count > MAX_LISTED) continue;
        int64_t at = (m[i].value >> 4) % count, idx[4];
        for (int d = 3; d >= 0; --d) idx[d] = at % x->t.shape[d], at /= x->t.shape[d];
        const int64_t o = test_offset(&x->t, idx[0], idx[1], idx[2], idx[3]);
        const int32_t value = hostile_i32[m[i].value % HOSTILE_I32_COUNT];
        if (x->t.dtype == MFA_DTYPE_I32)
            ((int32_t*)x->t.data)[o] = value;
        else if (x->t.dtype == MFA_DTYPE_BOOL)
            ((unsigned char*)x->t.data)[o] = (unsigned char)value;
    }
    bool summarizes = true;
    for (int i = 0; i < mutations; ++i)
        if (m[i].kind == M_VALUE && (m[i].role == F_MASK || m[i].role == F_BLOCK_MASK))
            summarizes = !has(c, F_BLOCK_MASK);
    return summarizes;
}

/* The rules of mfa.h for the arrays and options of a compute call, restated. *skip: a call
 * that cannot be made safely (an array the library would read lies outside our memory). */
static outcome features_outcome(const features_call* c, const mfa_capabilities* caps, bool* skip) {
    outcome o = {0, 0};
    const fuzz_tensor* f = c->f;
    const int layout = features_layout(c);
    *skip = false;
    /* Arrays of the other direction, then the layout's own arguments, come first. */
    if (!c->backward && has(c, F_DSINKS)) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (c->backward && (has(c, F_TABLE) || has(c, F_LENGTHS) || has(c, F_K_NEW) || has(c, F_V_NEW)))
        violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (layout < 0) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (layout == LAYOUT_PACKED &&
        (!has(c, F_CU_Q) || !has(c, F_CU_K) || c->max_seqlen_q < 1 || c->max_seqlen_k < 1 ||
         c->max_seqlen_q > INT32_MAX || c->max_seqlen_k > INT32_MAX))
        violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (layout == LAYOUT_PAGED &&
        (!has(c, F_TABLE) || !has(c, F_LENGTHS) || has(c, F_K_NEW) != has(c, F_V_NEW)))
        violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (o.required) return o; /* the library stops before reading any array */

    const int64_t* qs = f[F_Q].t.shape;
    const int64_t* ks = f[F_K].t.shape;
    const int64_t* vs = f[F_V].t.shape;
    const int64_t block_size = ks[2];
    if (!(caps->dtypes & (1u << c->dtype))) violation(&o, MFA_ERROR_UNSUPPORTED);
    if (layout == LAYOUT_PACKED && qs[0] != 1) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (layout != LAYOUT_PAGED && ks[0] != qs[0]) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (layout == LAYOUT_PAGED && (block_size % 8 != 0 || block_size > 256))
        violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (qs[3] > caps->max_head_dim || vs[3] > caps->max_head_dim)
        violation(&o, MFA_ERROR_UNSUPPORTED);

    bool sound[F_ARRAYS] = {false};
    const bool none[4] = {false, false, false, false};
    const uint32_t i32 = 1u << MFA_DTYPE_I32, f32 = 1u << MFA_DTYPE_F32;
    for (int i = F_Q; i <= F_DV; ++i) sound[i] = has(c, i);

    /* The layout's arrays, and the sizes the modifiers are checked against. */
    int64_t mask_batch = qs[0], mask_q = qs[2], mask_k = ks[2];
    if (layout == LAYOUT_PACKED) {
        const int64_t entries = f[F_CU_Q].t.shape[3];
        const int64_t rule_q[4] = {1, 1, 1, -1};
        sound[F_CU_Q] = array_outcome(&f[F_CU_Q], i32, rule_q, none, false, &o);
        if (sound[F_CU_Q] && entries < 2) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        const int64_t rule_k[4] = {1, 1, 1, entries};
        sound[F_CU_K] = array_outcome(&f[F_CU_K], i32, rule_k, none, false, &o);
        mask_batch = sound[F_CU_Q] && entries >= 2 ? entries - 1 : -1;
        mask_q = c->max_seqlen_q, mask_k = c->max_seqlen_k;
        const bool readable = sound[F_CU_Q] && sound[F_CU_K] && entries >= 2;
        if (readable &&
            (!backed_by_itself_or(&f[F_CU_Q], f) || !backed_by_itself_or(&f[F_CU_K], f)))
            *skip = true;
        else if (readable && f[F_CU_K].t.shape[3] == entries && entries <= MAX_LISTED) {
            for (int side = 0; side < 2; ++side) {
                const fuzz_tensor* cu = &f[side ? F_CU_K : F_CU_Q];
                const int64_t total = side ? ks[2] : qs[2];
                const int64_t most = side ? c->max_seqlen_k : c->max_seqlen_q;
                bool bad = read_i32_at(cu, 0, 0) != 0 || read_i32_at(cu, 0, entries - 1) != total;
                for (int64_t e = 1; e < entries && !bad; ++e) {
                    const int64_t length =
                        (int64_t)read_i32_at(cu, 0, e) - read_i32_at(cu, 0, e - 1);
                    bad = length < 0 || length > most;
                }
                if (bad) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
            }
        } else if (readable) {
            o.permitted |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT); /* too long to walk here */
        }
    } else if (layout == LAYOUT_PAGED) {
        const int64_t batch = qs[0], num_blocks = ks[0];
        const int64_t rule_table[4] = {batch, 1, 1, -1}, rule_lengths[4] = {batch, 1, 1, 1};
        sound[F_TABLE] = array_outcome(&f[F_TABLE], i32, rule_table, none, false, &o);
        sound[F_LENGTHS] = array_outcome(&f[F_LENGTHS], i32, rule_lengths, none, false, &o);
        const int64_t max_blocks = f[F_TABLE].t.shape[3];
        int64_t capacity = -1, new_keys = 0;
        if (sound[F_TABLE] && __builtin_mul_overflow(max_blocks, block_size, &capacity)) {
            violation(&o, MFA_ERROR_SIZE_OVERFLOW);
            capacity = -1;
        }
        bool readable = sound[F_TABLE] && sound[F_LENGTHS] && capacity >= 0;
        if (has(c, F_K_NEW)) {
            const int64_t rule_k_new[4] = {batch, ks[1], -1, qs[3]};
            sound[F_K_NEW] =
                array_outcome(&f[F_K_NEW], 1u << c->dtype, rule_k_new, none, false, &o);
            new_keys = f[F_K_NEW].t.shape[2];
            const int64_t rule_v_new[4] = {batch, ks[1], new_keys, vs[3]};
            sound[F_V_NEW] =
                array_outcome(&f[F_V_NEW], 1u << c->dtype, rule_v_new, none, false, &o);
            readable = readable && sound[F_K_NEW] && sound[F_V_NEW];
        }
        mask_k = capacity;
        if (readable &&
            (!backed_by_itself_or(&f[F_TABLE], f) || !backed_by_itself_or(&f[F_LENGTHS], f))) {
            *skip = true;
        } else if (readable && f[F_TABLE].t.shape[0] == batch && f[F_LENGTHS].t.shape[0] == batch &&
                   batch <= F_MAX_SEQS) {
            /* Which (sequence, position) reaches each block, and which write. */
            enum { MOST = 64 };
            int64_t reached_by[MOST][2];
            int reached = 0;
            bool bad = false, writes[MOST] = {false};
            for (int64_t b = 0; b < batch && !bad; ++b) {
                const int64_t cached = read_i32_at(&f[F_LENGTHS], b, 0);
                const int64_t keys = cached + new_keys;
                if (cached < 0 || keys > capacity || keys > INT32_MAX) {
                    bad = true;
                    break;
                }
                for (int64_t i = 0; i * block_size < keys && !bad; ++i) {
                    const int64_t block = read_i32_at(&f[F_TABLE], b, i);
                    if (block < 0 || block >= num_blocks || reached == MOST) {
                        bad = true;
                        break;
                    }
                    writes[reached] = new_keys > 0 && (i + 1) * block_size > cached;
                    reached_by[reached][0] = block;
                    reached_by[reached++][1] = b;
                }
            }
            for (int x = 0; x < reached && !bad; ++x)
                for (int y = 0; y < reached && !bad; ++y)
                    if (x != y && (writes[x] || writes[y]) && reached_by[x][0] == reached_by[y][0])
                        bad = true;
            if (bad) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        } else if (readable) {
            o.permitted |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
        }
    }

    /* The modifiers. */
    if (!isfinite(c->softcap) || c->softcap < 0) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
    if (has(c, F_MASK)) {
        const int64_t rule[4] = {mask_batch, qs[1], mask_q, mask_k};
        const bool or_one[4] = {true, true, true, true};
        sound[F_MASK] = array_outcome(&f[F_MASK], 1u << MFA_DTYPE_BOOL | f32 | 1u << c->dtype, rule,
                                      or_one, false, &o);
    }
    if (has(c, F_BLOCK_MASK)) {
        if (!has(c, F_MASK)) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        const int64_t* ms = f[F_MASK].t.shape;
        const int64_t* mt = f[F_MASK].t.strides;
        const int64_t rule[4] = {has(c, F_MASK) ? ms[0] : -1, has(c, F_MASK) ? ms[1] : -1,
                                 mask_q >= 0 ? mask_blocks(mask_q) : -1,
                                 mask_k >= 0 ? mask_blocks(mask_k) : -1};
        const bool or_one[4] = {has(c, F_MASK) && (ms[0] == 1 || mt[0] == 0),
                                has(c, F_MASK) && (ms[1] == 1 || mt[1] == 0), false, false};
        sound[F_BLOCK_MASK] =
            array_outcome(&f[F_BLOCK_MASK], 1u << MFA_DTYPE_BOOL, rule, or_one, false, &o);
        const fuzz_tensor* s = &f[F_BLOCK_MASK];
        if (sound[F_BLOCK_MASK] && !backed_by_itself_or(s, f)) {
            *skip = true;
        } else if (sound[F_BLOCK_MASK] && listable(s)) {
            bool bad = false;
            for (int64_t b = 0; b < s->t.shape[0]; ++b)
                for (int64_t h = 0; h < s->t.shape[1]; ++h)
                    for (int64_t i = 0; i < s->t.shape[2]; ++i)
                        for (int64_t j = 0; j < s->t.shape[3]; ++j)
                            bad =
                                bad ||
                                ((const unsigned char*)s->t.data)[test_offset(&s->t, b, h, i, j)] >
                                    2;
            if (bad) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        } else if (sound[F_BLOCK_MASK]) {
            o.permitted |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
        }
    }
    if (has(c, F_ALIBI)) {
        const int64_t rule[4] = {mask_batch, qs[1], 1, 1};
        const bool or_one[4] = {true, false, false, false};
        sound[F_ALIBI] = array_outcome(&f[F_ALIBI], f32, rule, or_one, false, &o);
    }
    const int64_t head_rule[4] = {1, qs[1], 1, 1};
    if (has(c, F_SINKS))
        sound[F_SINKS] = array_outcome(&f[F_SINKS], f32, head_rule, none, false, &o);
    if (c->backward && has(c, F_DSINKS)) {
        if (!has(c, F_SINKS)) violation(&o, MFA_ERROR_INVALID_ARGUMENT);
        sound[F_DSINKS] = array_outcome(&f[F_DSINKS], f32, head_rule, none, true, &o);
    }

    /* No output shares a byte with another array. */
    bool output[F_ARRAYS] = {false};
    if (c->backward)
        output[F_DQ] = output[F_DK] = output[F_DV] = output[F_DSINKS] = true;
    else
        output[F_OUT] = output[F_LSE] = true;
    if (layout == LAYOUT_PAGED && has(c, F_K_NEW)) output[F_K] = output[F_V] = true;
    for (int x = 0; x < F_ARRAYS; ++x) {
        if (!output[x] || !sound[x] || !has(c, x)) continue;
        for (int y = 0; y < F_ARRAYS; ++y)
            if (y != x && sound[y] && has(c, y)) overlap_outcome(&f[x], &f[y], false, &o);
    }

    /* Whether the context runs what the call asks for. */
    uint32_t features = 0;
    if (has(c, F_MASK)) features |= MFA_FEATURE_MASK;
    if (has(c, F_BLOCK_MASK)) features |= MFA_FEATURE_BLOCK_MASK;
    if (c->softcap > 0) features |= MFA_FEATURE_SOFTCAP;
    if (has(c, F_ALIBI)) features |= MFA_FEATURE_ALIBI;
    if (has(c, F_SINKS)) features |= MFA_FEATURE_SINKS;
    if (layout == LAYOUT_PACKED) features |= MFA_FEATURE_VARLEN;
    if (layout == LAYOUT_PAGED) features |= MFA_FEATURE_PAGED_KV;
    if (c->initial_state) features |= MFA_FEATURE_INITIAL_STATE;
    const uint32_t have = c->backward ? caps->backward_features : caps->features;
    if (features & ~have) violation(&o, MFA_ERROR_UNSUPPORTED);
    /* The metal planner (a context with a GPU family) plans sequences of at most 2^30 rows,
     * the bound max_seqlen of packed sequences included. */
    const int64_t planned = (int64_t)1 << 30;
    if (caps->gpu_family != MFA_GPU_FAMILY_NONE && layout == LAYOUT_PACKED &&
        (c->max_seqlen_q > planned || c->max_seqlen_k > planned))
        violation(&o, MFA_ERROR_UNSUPPORTED);
    return o;
}

static void apply_feature_mutation(features_call* c, const mutation* m, bool pointers) {
    if (m->kind == M_MAX_SEQLEN) {
        if (!pointers) *(m->dim % 2 ? &c->max_seqlen_k : &c->max_seqlen_q) = m->value;
    } else if (m->kind < M_ARRAY_KINDS) {
        if (pointers)
            apply_pointer(c->f, m);
        else
            apply_claim(c->f, m);
    }
}

/* A valid packed call's sequences as the library reads them: mutations may have changed the
 * offsets (hostile values that are still valid) or their count. False where there are more
 * sequences than the reference's tables hold. */
static bool read_packed(features_call* c) {
    const int64_t entries = c->f[F_CU_Q].t.shape[3];
    if (entries - 1 > F_MAX_SEQS) return false;
    c->batch = entries - 1;
    for (int64_t e = 0; e < entries; ++e) {
        c->cu_q[e] = read_i32_at(&c->f[F_CU_Q], 0, e);
        c->cu_k[e] = read_i32_at(&c->f[F_CU_K], 0, e);
    }
    return true;
}

/* Rows [start, start + length) of dimension dim of a view. */
static mfa_tensor slice(const mfa_tensor* t, int dim, int64_t start, int64_t length) {
    mfa_tensor s = *t;
    s.data = (char*)t->data + start * t->strides[dim] * storage_size((int)t->dtype);
    s.shape[dim] = length;
    return s;
}

/* Where sequence b's query row i and key row j live in the q-side and k-side arrays. */
static int64_t q_base(const features_call* c, int64_t b) {
    return c->layout == LAYOUT_PACKED ? c->cu_q[b] : 0;
}
static int64_t flat_q(const features_call* c, int64_t b, int64_t h, int64_t i, int64_t width) {
    const int64_t rows = c->f[F_Q].t.shape[2];
    const int64_t batch = c->layout == LAYOUT_PACKED ? 0 : b;
    return ((batch * c->heads_q + h) * rows + q_base(c, b) + i) * width;
}
static int64_t flat_k(const features_call* c, int64_t b, int64_t h, int64_t j, int64_t width) {
    const int64_t rows = c->f[F_K].t.shape[2];
    return c->layout == LAYOUT_PACKED ? ((h * rows) + c->cu_k[b] + j) * width
                                      : ((b * c->heads_kv + h) * rows + j) * width;
}

/* One sequence of the call as dense views for the reference: q, k, v (paged: the keys gathered
 * from the caches and the appended rows, into f32 copies), the mask cut to its rows and keys,
 * the slopes and sinks as doubles. */
typedef struct sequence {
    mfa_tensor q, k, v, out, dout, lse, mask;
    test_tensor gathered_k, gathered_v;
    double alibi[4], sinks[4];
    ref_problem p;
} sequence;

static int64_t sequence_queries(const features_call* c, int64_t b) {
    return c->layout == LAYOUT_PACKED ? c->cu_q[b + 1] - c->cu_q[b] : c->f[F_Q].t.shape[2];
}

static void sequence_make(const features_call* c, int64_t b, sequence* s) {
    const fuzz_tensor* f = c->f;
    memset(s, 0, sizeof *s);
    const int64_t nq = sequence_queries(c, b);
    int64_t nk = 0;
    if (c->layout == LAYOUT_PACKED) {
        nk = c->cu_k[b + 1] - c->cu_k[b];
        s->q = slice(&f[F_Q].t, 2, c->cu_q[b], nq);
        s->k = slice(&f[F_K].t, 2, c->cu_k[b], nk);
        s->v = slice(&f[F_V].t, 2, c->cu_k[b], nk);
        s->out = slice(&f[F_OUT].t, 2, c->cu_q[b], nq);
        s->dout = slice(&f[F_DOUT].t, 2, c->cu_q[b], nq);
        s->lse = slice(&f[F_LSE].t, 2, c->cu_q[b], nq);
    } else {
        s->q = slice(&f[F_Q].t, 0, b, 1);
        s->out = slice(&f[F_OUT].t, 0, b, 1);
        s->dout = slice(&f[F_DOUT].t, 0, b, 1);
        s->lse = slice(&f[F_LSE].t, 0, b, 1);
        if (c->layout == LAYOUT_DENSE) {
            s->k = slice(&f[F_K].t, 0, b, 1);
            s->v = slice(&f[F_V].t, 0, b, 1);
            nk = s->k.shape[2];
        }
    }
    if (c->layout == LAYOUT_PAGED) {
        const int64_t cached = read_i32_at(&f[F_LENGTHS], b, 0), bs = f[F_K].t.shape[2];
        const int64_t new_keys = has(c, F_K_NEW) ? f[F_K_NEW].t.shape[2] : 0;
        nk = cached + new_keys;
        s->gathered_k = test_tensor_make(MFA_DTYPE_F32, 1, c->heads_kv, nk, c->head_dim, TEST_BHSD);
        s->gathered_v =
            test_tensor_make(MFA_DTYPE_F32, 1, c->heads_kv, nk, c->head_dim_v, TEST_BHSD);
        for (int side = 0; side < 2; ++side) {
            const mfa_tensor* cache = &f[side ? F_V : F_K].t;
            const mfa_tensor* appended = &f[side ? F_V_NEW : F_K_NEW].t;
            const mfa_tensor* into = side ? &s->gathered_v.t : &s->gathered_k.t;
            for (int64_t h = 0; h < c->heads_kv; ++h)
                for (int64_t j = 0; j < nk; ++j)
                    for (int64_t x = 0; x < into->shape[3]; ++x) {
                        const double value =
                            j >= cached ? test_get(appended, b, h, j - cached, x)
                                        : test_get(cache, read_i32_at(&f[F_TABLE], b, j / bs), h,
                                                   j % bs, x);
                        test_set(into, 0, h, j, x, (float)value);
                    }
        }
        s->k = s->gathered_k.t;
        s->v = s->gathered_v.t;
    }
    s->p = ref_problem_of(&s->q, &s->k, &s->v, &c->params);
    s->p.softcap = c->softcap > 0 ? c->softcap : 0;
    if (has(c, F_MASK)) {
        s->mask = f[F_MASK].t;
        if (s->mask.shape[0] != 1) s->mask = slice(&s->mask, 0, b, 1);
        if (c->layout != LAYOUT_DENSE) {
            if (s->mask.shape[2] != 1) s->mask.shape[2] = nq;
            if (s->mask.shape[3] != 1) s->mask.shape[3] = nk;
        }
        s->p.mask = &s->mask;
    }
    for (int64_t h = 0; h < c->heads_q; ++h) {
        if (has(c, F_ALIBI)) {
            const mfa_tensor* slopes = &f[F_ALIBI].t;
            s->alibi[h] = test_get(slopes, slopes->shape[0] == 1 ? 0 : b, h, 0, 0);
        }
        if (has(c, F_SINKS)) s->sinks[h] = test_get(&f[F_SINKS].t, 0, h, 0, 0);
    }
    if (has(c, F_ALIBI)) s->p.alibi = s->alibi;
    if (has(c, F_SINKS)) s->p.sinks = s->sinks;
}

static void sequence_free(sequence* s) {
    test_tensor_free(&s->gathered_k);
    test_tensor_free(&s->gathered_v);
}

/* The whole call's reference, in the outputs' [b][h][s][d] order. */
typedef struct features_ref {
    double *out, *out_mag, *lse, *lse_mag, *dq, *dq_mag, *dk, *dk_mag, *dv, *dv_mag, *dsinks,
        *dsinks_mag;
    double max_score;
} features_ref;

static void accumulate(double* into, const double* from, int64_t n) {
    for (int64_t i = 0; i < n; ++i) into[i] += from[i];
}

/* Forward (and, backward, the forward's results stored into out and lse, then the gradients
 * of those stored values), sequence by sequence. */
static features_ref features_reference(const features_call* c) {
    const fuzz_tensor* f = c->f;
    features_ref w;
    memset(&w, 0, sizeof w);
    const int64_t q_count = test_element_count(&f[F_Q].t) / c->head_dim;
    const int64_t k_count = test_element_count(&f[F_K].t) / c->head_dim;
    w.out = ref_zeros(q_count * c->head_dim_v), w.out_mag = ref_zeros(q_count * c->head_dim_v);
    w.lse = ref_zeros(q_count), w.lse_mag = ref_zeros(q_count);
    for (int64_t i = 0; i < q_count; ++i) w.lse[i] = -INFINITY; /* rows of no sequence */
    if (c->backward) {
        w.dq = ref_zeros(q_count * c->head_dim), w.dq_mag = ref_zeros(q_count * c->head_dim);
        w.dk = ref_zeros(k_count * c->head_dim), w.dk_mag = ref_zeros(k_count * c->head_dim);
        w.dv = ref_zeros(k_count * c->head_dim_v), w.dv_mag = ref_zeros(k_count * c->head_dim_v);
        w.dsinks = ref_zeros(c->heads_q), w.dsinks_mag = ref_zeros(c->heads_q);
    }
    for (int64_t b = 0; b < c->batch; ++b) {
        const int64_t nq = sequence_queries(c, b);
        if (nq == 0) continue;
        sequence s;
        sequence_make(c, b, &s);
        const int64_t nk = s.k.shape[2];
        ref_result r = ref_forward(&s.p, &s.q, &s.k, &s.v);
        if (r.max_score > w.max_score) w.max_score = r.max_score;
        for (int64_t h = 0; h < c->heads_q; ++h)
            for (int64_t i = 0; i < nq; ++i) {
                const int64_t row = h * nq + i, at = flat_q(c, b, h, i, 1);
                w.lse[at] = r.lse[row], w.lse_mag[at] = r.lse_mag[row];
                for (int64_t y = 0; y < c->head_dim_v; ++y) {
                    w.out[at * c->head_dim_v + y] = r.out[row * c->head_dim_v + y];
                    w.out_mag[at * c->head_dim_v + y] = r.out_mag[row * c->head_dim_v + y];
                }
                if (!c->backward) continue;
                test_set(&s.lse, 0, h, i, 0, (float)r.lse[row]);
                for (int64_t y = 0; y < c->head_dim_v; ++y)
                    test_set(&s.out, 0, h, i, y, (float)r.out[row * c->head_dim_v + y]);
            }
        ref_free(&r);
        if (c->backward) {
            ref_result g = ref_backward(&s.p, &s.q, &s.k, &s.v, &s.out, &s.dout, &s.lse, NULL);
            if (g.max_score > w.max_score) w.max_score = g.max_score;
            for (int64_t h = 0; h < c->heads_q; ++h)
                for (int64_t i = 0; i < nq; ++i) {
                    const int64_t at = flat_q(c, b, h, i, c->head_dim);
                    memcpy(&w.dq[at], &g.dq[(h * nq + i) * c->head_dim],
                           c->head_dim * sizeof(double));
                    memcpy(&w.dq_mag[at], &g.dq_mag[(h * nq + i) * c->head_dim],
                           c->head_dim * sizeof(double));
                }
            for (int64_t h = 0; h < c->heads_kv; ++h)
                for (int64_t j = 0; j < nk; ++j) {
                    const int64_t row = h * nk + j;
                    accumulate(&w.dk[flat_k(c, b, h, j, c->head_dim)], &g.dk[row * c->head_dim],
                               c->head_dim);
                    accumulate(&w.dk_mag[flat_k(c, b, h, j, c->head_dim)],
                               &g.dk_mag[row * c->head_dim], c->head_dim);
                    accumulate(&w.dv[flat_k(c, b, h, j, c->head_dim_v)], &g.dv[row * c->head_dim_v],
                               c->head_dim_v);
                    accumulate(&w.dv_mag[flat_k(c, b, h, j, c->head_dim_v)],
                               &g.dv_mag[row * c->head_dim_v], c->head_dim_v);
                }
            accumulate(w.dsinks, g.dsinks, c->heads_q);
            accumulate(w.dsinks_mag, g.dsinks_mag, c->heads_q);
            ref_free(&g);
        }
        sequence_free(&s);
    }
    return w;
}

/* With an initial state, the reference is the merge of the state (out and lse as given) with
 * this call's result, per row as mfa_attention_merge defines it. */
static void merge_initial_state(const features_call* c, features_ref* w) {
    const mfa_tensor *out = &c->f[F_OUT].t, *lse = &c->f[F_LSE].t;
    const int64_t dv = c->head_dim_v;
    int64_t row = 0;
    for (int64_t b = 0; b < out->shape[0]; ++b)
        for (int64_t h = 0; h < out->shape[1]; ++h)
            for (int64_t i = 0; i < out->shape[2]; ++i, ++row) {
                const double l0 = test_get(lse, b, h, i, 0), l1 = w->lse[row];
                const double m = l0 > l1 ? l0 : l1;
                if (m == -INFINITY) {
                    for (int64_t y = 0; y < dv; ++y) w->out[row * dv + y] = 0;
                    continue;
                }
                const double w0 = exp(l0 - m), w1 = exp(l1 - m);
                for (int64_t y = 0; y < dv; ++y) {
                    const double o0 = w0 > 0 ? test_get(out, b, h, i, y) : 0;
                    w->out[row * dv + y] = (w0 * o0 + w1 * w->out[row * dv + y]) / (w0 + w1);
                    w->out_mag[row * dv + y] =
                        (w0 * fabs(o0) + w1 * w->out_mag[row * dv + y]) / (w0 + w1) + fabs(o0);
                }
                w->lse[row] = m + log(w0 + w1);
                w->lse_mag[row] = fabs(m) + fabs(log(w0 + w1)) + 1;
            }
}

static void features_ref_free(features_ref* w) {
    double* all[] = {w->out, w->out_mag, w->lse, w->lse_mag, w->dq,     w->dq_mag,
                     w->dk,  w->dk_mag,  w->dv,  w->dv_mag,  w->dsinks, w->dsinks_mag};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

/* After a paged call with appended keys: every cache element is its old value, or the new row
 * the call was to write there. */
static void check_caches(const features_call* c) {
    const fuzz_tensor* f = c->f;
    const int64_t bs = f[F_K].t.shape[2], new_keys = f[F_K_NEW].t.shape[2];
    for (int side = 0; side < 2; ++side) {
        const fuzz_tensor* cache = &f[side ? F_V : F_K];
        const mfa_tensor* appended = &f[side ? F_V_NEW : F_K_NEW].t;
        const int64_t es = storage_size((int)cache->t.dtype);
        mfa_tensor before = cache->t;
        before.data = cache->own.snapshot + ((char*)cache->t.data - (char*)cache->own.bytes);
        const int64_t* s = cache->t.shape;
        for (int64_t blk = 0; blk < s[0]; ++blk)
            for (int64_t row = 0; row < s[2]; ++row) {
                int64_t writer = -1, key = 0;
                for (int64_t b = 0; b < c->batch && writer < 0; ++b) {
                    const int64_t cached = read_i32_at(&f[F_LENGTHS], b, 0);
                    for (int64_t j = cached; j < cached + new_keys; ++j)
                        if (read_i32_at(&f[F_TABLE], b, j / bs) == blk && j % bs == row)
                            writer = b, key = j - cached;
                }
                for (int64_t h = 0; h < s[1]; ++h)
                    for (int64_t x = 0; x < s[3]; ++x) {
                        const int64_t o = test_offset(&cache->t, blk, h, row, x) * es;
                        const bool same = writer < 0
                                              ? memcmp((char*)cache->t.data + o,
                                                       (char*)before.data + o, (size_t)es) == 0
                                              : test_get(&cache->t, blk, h, row, x) ==
                                                    test_get(appended, writer, h, key, x);
                        if (!same)
                            fail("paged: %s cache[%lld, %lld, %lld, %lld] is wrong (%s)",
                                 side ? "v" : "k", (long long)blk, (long long)h, (long long)row,
                                 (long long)x, writer < 0 ? "changed" : "not the appended row");
                    }
            }
        check_gaps(side ? "v cache" : "k cache", cache);
    }
}

static void run_features(reader* r) {
    features_call call;
    features_call* c = &call;
    decode_features(r, c);
    mutation m[6];
    /* The dense operands keep their valid layouts (a mutated array may alias them). */
    const int mutations = decode_mutations(r, m, 6, M_FEATURE_KINDS, F_MASK, F_ARRAYS);
    for (int i = 0; i < mutations; ++i) apply_feature_mutation(c, &m[i], false);
    fuzz_tensor* f = c->f;
    allocate(f, F_ARRAYS);
    for (int i = 0; i < mutations; ++i) apply_feature_mutation(c, &m[i], true);
    const bool summarizes = fill_features(c, m, mutations);

    mfa_capabilities caps;
    caps.struct_size = sizeof caps;
    if (mfa_context_capabilities(c->ctx, &caps) != MFA_OK)
        fail("capabilities: %s", mfa_last_error());
    bool skip;
    const outcome expected = features_outcome(c, &caps, &skip);
    /* A valid call is checked against the reference when it runs on our memory alone, each
     * array in its own allocation (so no value is two arrays' at once). */
    bool own = !skip;
    for (int i = 0; i < F_ARRAYS; ++i)
        if (has(c, i)) own = own && f[i].lives_in == i && backed_by_itself_or(&f[i], f);
    if (skip || (!expected.required && !own)) {
        ++stats.features[2];
        return release_all(f, F_ARRAYS);
    }
    features_ref want;
    memset(&want, 0, sizeof want);
    const bool verify = !expected.required && summarizes && features_layout(c) == c->layout &&
                        (c->layout != LAYOUT_PACKED || read_packed(c));
    if (verify) {
        want = features_reference(c);
        if (c->initial_state) merge_initial_state(c, &want);
    }
    snapshot(f, F_ARRAYS);

    mfa_array arrays[F_ARRAYS];
    const mfa_array* use[F_ARRAYS];
    for (int i = 0; i < F_ARRAYS; ++i) {
        arrays[i] = test_array_of(&f[i].t);
        use[i] = has(c, i) ? &arrays[i] : NULL;
    }
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.softcap = c->softcap;
    args.initial_state = c->initial_state;
    args.max_seqlen_q = c->max_seqlen_q;
    args.max_seqlen_k = c->max_seqlen_k;
    args.q = use[F_Q], args.k = use[F_K], args.v = use[F_V], args.out = use[F_OUT];
    args.lse = use[F_LSE], args.dout = use[F_DOUT], args.dq = use[F_DQ], args.dk = use[F_DK];
    args.dv = use[F_DV], args.mask = use[F_MASK], args.block_mask = use[F_BLOCK_MASK];
    args.alibi_slopes = use[F_ALIBI], args.sinks = use[F_SINKS], args.dsinks = use[F_DSINKS];
    args.cu_seqlens_q = use[F_CU_Q], args.cu_seqlens_k = use[F_CU_K];
    args.block_table = use[F_TABLE], args.cache_seqlens = use[F_LENGTHS];
    args.k_new = use[F_K_NEW], args.v_new = use[F_V_NEW];
    plant_stale_message();
    const mfa_status status =
        mfa_attention_compute(c->ctx, c->backward ? MFA_BACKWARD : MFA_FORWARD, &c->params, &args);
    static const char* const calls[2][3] = {
        {"compute forward (dense)", "compute forward (packed)", "compute forward (paged)"},
        {"compute backward (dense)", "compute backward (packed)", "compute backward (paged)"}};
    check_status(calls[c->backward][c->layout], expected, status);
    unsigned written = 0;
    const int layout = features_layout(c);
    const int outputs[] = {F_OUT, F_LSE, F_DQ, F_DK, F_DV, F_DSINKS, F_K, F_V};
    for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; ++i) {
        const int x = outputs[i];
        const bool is_output = c->backward ? (x >= F_DQ && x <= F_DSINKS)
                               : x <= F_V  ? layout == LAYOUT_PAGED && has(c, F_K_NEW)
                                           : x == F_OUT || x == F_LSE;
        if (is_output && has(c, x) && f[x].lives_in >= 0) written |= 1u << f[x].lives_in;
    }
    check_memory("compute", f, F_ARRAYS, NULL, status, written);
    ++stats.features[status == MFA_OK ? 0 : 1];
    if (status == MFA_OK && verify) {
        char why[256];
        const int64_t keys = c->layout == LAYOUT_PACKED  ? c->max_seqlen_k
                             : c->layout == LAYOUT_PAGED ? f[F_TABLE].t.shape[3] * f[F_K].t.shape[2]
                                                         : f[F_K].t.shape[2];
        const int64_t queries = c->layout == LAYOUT_PACKED ? c->max_seqlen_q : f[F_Q].t.shape[2];
        for (int i = 0; i < F_ARRAYS; ++i)
            if (has(c, i) && (written >> i) & 1) check_gaps("compute output", &f[i]);
        if (!c->backward) {
            if (!ref_compare(&f[F_OUT].t, c->dtype, want.out, want.out_mag, keys + c->head_dim,
                             want.max_score, why, sizeof why))
                fail("compute (layout %d) out: %s", c->layout, why);
            if (has(c, F_LSE) && !ref_compare(&f[F_LSE].t, MFA_DTYPE_F32, want.lse, want.lse_mag,
                                              keys + c->head_dim, want.max_score, why, sizeof why))
                fail("compute (layout %d) lse: %s", c->layout, why);
            if (c->layout == LAYOUT_PAGED && has(c, F_K_NEW)) check_caches(c);
        } else {
            const int64_t n =
                c->head_dim + c->head_dim_v + keys + queries * (c->heads_q / c->heads_kv);
            if (!ref_compare(&f[F_DQ].t, c->dtype, want.dq, want.dq_mag, n, want.max_score, why,
                             sizeof why))
                fail("compute (layout %d) dq: %s", c->layout, why);
            if (!ref_compare(&f[F_DK].t, c->dtype, want.dk, want.dk_mag, n, want.max_score, why,
                             sizeof why))
                fail("compute (layout %d) dk: %s", c->layout, why);
            if (!ref_compare(&f[F_DV].t, c->dtype, want.dv, want.dv_mag, n, want.max_score, why,
                             sizeof why))
                fail("compute (layout %d) dv: %s", c->layout, why);
            /* dsinks sums over every row of every sequence. */
            if (has(c, F_DSINKS) &&
                !ref_compare(&f[F_DSINKS].t, MFA_DTYPE_F32, want.dsinks, want.dsinks_mag,
                             n + f[F_Q].t.shape[0] * f[F_Q].t.shape[2], want.max_score, why,
                             sizeof why))
                fail("compute (layout %d) dsinks: %s", c->layout, why);
        }
    }
    features_ref_free(&want);
    release_all(f, F_ARRAYS);
}

/* ---- Contexts ----------------------------------------------------------------------------- */

static void run_context(reader* r) {
    static const int backends[] = {
        MFA_BACKEND_AUTO, MFA_BACKEND_CPU, MFA_BACKEND_METAL, MFA_BACKEND_METAL_SIM, 4, -1, 1000};
    static const int families[] = {MFA_GPU_FAMILY_NONE,
                                   MFA_GPU_FAMILY_APPLE7,
                                   MFA_GPU_FAMILY_APPLE8,
                                   MFA_GPU_FAMILY_APPLE9,
                                   5,
                                   -1};
    static const int32_t threads[] = {0, 1, 2, -1, 4097, INT32_MIN};
    static const size_t option_sizes[] = {sizeof(mfa_context_options), 0, 3,
                                          sizeof(mfa_context_options) + 8};
    static const size_t caps_sizes[] = {sizeof(mfa_capabilities),     0, 4, 8, 12, 16, 24,
                                        sizeof(mfa_capabilities) + 16};
    const uint8_t flags = next_byte(r);
    const int backend = backends[next_byte(r) % 7];
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.struct_size = option_sizes[next_byte(r) % 4];
    options.num_threads = threads[next_byte(r) % 6];
    options.gpu_family = (mfa_gpu_family)families[next_byte(r) % 6];
    options.sim_schedule_seed = next_byte(r) % 2 ? next_u64(r) : 0;
    const bool null_options = flags & 1, null_out = (flags & 6) == 6;
    const size_t caps_size = caps_sizes[next_byte(r) % 8];

    /* The rules of mfa_context_create, restated. */
    const mfa_context_options* given = null_options ? NULL : &options;
    const int resolved =
        backend == MFA_BACKEND_AUTO
            ? (mfa_backend_available(MFA_BACKEND_METAL) ? MFA_BACKEND_METAL : MFA_BACKEND_CPU)
            : backend;
    unsigned required = 0;
    const bool known_backend = backend >= MFA_BACKEND_AUTO && backend <= MFA_BACKEND_METAL_SIM;
    if (null_out || !known_backend) required |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
    if (given) {
        if (given->struct_size != sizeof options || given->num_threads < 0 ||
            given->num_threads > 4096 ||
            !(given->gpu_family == 0 || (given->gpu_family >= 7 && given->gpu_family <= 9)) ||
            (resolved != MFA_BACKEND_METAL_SIM && (given->gpu_family || given->sim_schedule_seed)))
            required |= STATUS_BIT(MFA_ERROR_INVALID_ARGUMENT);
    }
    if (known_backend && !mfa_backend_available((mfa_backend)resolved))
        required |= STATUS_BIT(MFA_ERROR_BACKEND_UNAVAILABLE);

    mfa_context* ctx = (mfa_context*)(uintptr_t)0x10; /* must become NULL on failure */
    plant_stale_message();
    const mfa_status status =
        mfa_context_create((mfa_backend)backend, given, null_out ? NULL : &ctx);
    const char* message = mfa_last_error();
    if (required && (status == MFA_OK || !(STATUS_BIT(status) & required)))
        fail("context_create(%d) returned %s, rules require mask 0x%x: %s", backend,
             mfa_status_string(status), required, message);
    if (!required && status != MFA_OK)
        fail("context_create(%d) of valid options failed: %s", backend, message);
    if (status == MFA_OK)
        ++stats.contexts_created;
    else
        ++stats.contexts_rejected;
    if (status != MFA_OK) {
        if (!null_out && ctx != NULL) fail("failed context_create left *out = %p", (void*)ctx);
        if (message[0] == '\0' ||
            strncmp(message, stale_message_marker, sizeof stale_message_marker - 1) == 0)
            fail("context_create: empty or stale message for %s", mfa_status_string(status));
        return;
    }
    /* A caller's capabilities struct of exactly caps_size bytes: nothing beyond is written. */
    mfa_capabilities* caps =
        (mfa_capabilities*)malloc(caps_size < sizeof(size_t) ? sizeof(size_t) : caps_size);
    memset(caps, POISON, caps_size < sizeof(size_t) ? sizeof(size_t) : caps_size);
    caps->struct_size = caps_size;
    const mfa_status caps_status = mfa_context_capabilities(ctx, caps);
    if ((caps_size < sizeof(size_t)) != (caps_status != MFA_OK))
        fail("capabilities with struct_size %zu returned %s", caps_size,
             mfa_status_string(caps_status));
    if (caps_status == MFA_OK && caps->struct_size != caps_size)
        fail("capabilities changed struct_size from %zu to %zu", caps_size, caps->struct_size);
    free(caps);
    if (mfa_context_backend(ctx) != (mfa_backend)resolved) fail("context runs the wrong backend");
    mfa_context_destroy(ctx);
}

/* ---- Entry points ------------------------------------------------------------------------- */

static void initialize(void) {
    atexit(print_stats);
    guard_region = (char*)mmap(NULL, GUARD_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (guard_region == MAP_FAILED) fail("cannot map the guard region");
    /* One worker thread: each call is tiny, and a fuzzer wants executions, not parallelism. */
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = 1;
    for (int i = 0; i < 4; ++i) max_work[i] = i < 2 ? limits->work : limits->sim_work;
    if (mfa_context_create(MFA_BACKEND_CPU, &options, &contexts[context_count++]) != MFA_OK)
        fail("cpu context: %s", mfa_last_error());
    options.num_threads = 2;
    if (mfa_context_create(MFA_BACKEND_CPU, &options, &contexts[context_count++]) != MFA_OK)
        fail("cpu context: %s", mfa_last_error());
    if (mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        /* The default family, and Apple7's block sizes with simulated threads shuffled. */
        options.num_threads = 1;
        if (mfa_context_create(MFA_BACKEND_METAL_SIM, &options, &contexts[context_count++]) !=
            MFA_OK)
            fail("metal-sim context: %s", mfa_last_error());
        options.gpu_family = MFA_GPU_FAMILY_APPLE7;
        options.sim_schedule_seed = 0x5EED;
        if (mfa_context_create(MFA_BACKEND_METAL_SIM, &options, &contexts[context_count++]) !=
            MFA_OK)
            fail("metal-sim context: %s", mfa_last_error());
    }
}

/* The target's own arguments, those that start with "--" (libFuzzer's start with one "-"). */
int LLVMFuzzerInitialize(int* argc, char*** argv) {
    for (int i = 1; i < *argc; ++i) {
        const char* argument = (*argv)[i];
        if (strncmp(argument, "--", 2) != 0) continue;
        if (strcmp(argument, "--large-problems") != 0) {
            fprintf(stderr, "fuzz_attention: unknown argument %s (it takes --large-problems)\n",
                    argument);
            exit(2);
        }
        limits = &large_problems;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (context_count == 0) initialize();
    reader r = {data, size};
    switch (next_byte(&r) % 8) {
        case 0: run_attention(&r, false, false); break;
        case 1: run_attention(&r, true, false); break;
        case 2: run_context(&r); break;
        case 3: run_attention(&r, false, true); break;
        case 4: run_attention(&r, true, true); break;
        case 5: run_merge(&r); break;
        case 6: run_summary(&r); break;
        default: run_features(&r); break;
    }
    return 0;
}
