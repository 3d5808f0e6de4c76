/* Every argument of mfa_attention_args is validated before anything is written: each bad value
 * gets its status and a message naming the argument, and no byte of any array changes (outputs
 * are filled with a canary, and every array's bytes are compared with a copy taken before the
 * call). Arguments are checked before features, so these cases hold on a backend whatever it
 * implements. A valid call (VALID) whose features the context lacks for its direction gets
 * MFA_ERROR_UNSUPPORTED naming the feature, with nothing written; where the context has them it
 * must succeed (its numbers are the feature's own tests' business). */
#include "test_util.h"

enum { B = 2, HQ = 4, HKV = 2, NQ = 5, NK = 7, D = 8, DV = 6 };
/* Packed: two sequences of 4 and 5 queries, 5 and 7 keys. */
enum { TOTAL_Q = 9, TOTAL_K = 12, MAX_Q = 5, MAX_K = 7 };
/* Paged: 6 blocks of 8 rows, 3 per sequence (capacity 24), 3 queries, 2 new keys. */
enum { BLOCKS = 6, BLOCK_SIZE = 8, MAX_BLOCKS = 3, PAGED_NQ = 3, NEW = 2 };
#define CANARY 0xA5

typedef enum role {
    Q,
    K,
    V,
    OUT,
    LSE,
    DOUT,
    DQ,
    DK,
    GRAD_V,
    MASK,
    BLOCK_MASK,
    ALIBI,
    SINKS,
    DSINKS,
    CU_Q,
    CU_K,
    TABLE,
    LENGTHS,
    K_NEW,
    V_NEW,
    ROLES
} role;

/* An array owning contiguous storage. */
typedef struct owned {
    mfa_array a;
    void* storage;
    size_t bytes;
    int output; /* filled with the canary before the call */
} owned;

typedef struct call {
    owned x[ROLES];
    mfa_attention_args args;
    mfa_attention_params params;
    mfa_direction direction;
} call;

static mfa_context* ctx;

static void make(call* c, role r, mfa_dtype dtype, int64_t b, int64_t h, int64_t s, int64_t d,
                 int output) {
    owned* o = &c->x[r];
    free(o->storage);
    memset(o, 0, sizeof *o);
    o->a.dtype = dtype;
    const int64_t shape[4] = {b, h, s, d};
    memcpy(o->a.shape, shape, sizeof shape);
    o->a.strides[3] = 1;
    o->a.strides[2] = d;
    o->a.strides[1] = s * d;
    o->a.strides[0] = h * s * d;
    o->bytes = (size_t)(b * h * s * d) * mfa_dtype_size(dtype);
    o->storage = malloc(o->bytes);
    o->a.data = o->storage;
    o->output = output;
    if (dtype == MFA_DTYPE_BOOL) {
        memset(o->storage, 1, o->bytes);
    } else if (dtype == MFA_DTYPE_I32) {
        memset(o->storage, 0, o->bytes);
    } else {
        mfa_tensor t = {o->a.data, dtype, {b, h, s, d}, {0, 0, 0, 0}};
        memcpy(t.strides, o->a.strides, sizeof t.strides);
        test_fill_view_random(&t);
    }
}

static void set_i32(call* c, role r, int64_t index, int32_t value) {
    ((int32_t*)c->x[r].storage)[index] = value;
}

/* args points at every array that has storage. */
static void attach(call* c) {
    const mfa_array** slots[ROLES] = {&c->args.q,
                                      &c->args.k,
                                      &c->args.v,
                                      &c->args.out,
                                      &c->args.lse,
                                      &c->args.dout,
                                      &c->args.dq,
                                      &c->args.dk,
                                      &c->args.dv,
                                      &c->args.mask,
                                      &c->args.block_mask,
                                      &c->args.alibi_slopes,
                                      &c->args.sinks,
                                      &c->args.dsinks,
                                      &c->args.cu_seqlens_q,
                                      &c->args.cu_seqlens_k,
                                      &c->args.block_table,
                                      &c->args.cache_seqlens,
                                      &c->args.k_new,
                                      &c->args.v_new};
    for (int r = 0; r < ROLES; ++r) *slots[r] = c->x[r].storage ? &c->x[r].a : NULL;
}

/* r's storage grown to at least `bytes`, its contents kept at the start: a view pointed there
 * can overlap r and nothing else, wherever the heap puts the other arrays. */
static void grow_storage(call* c, role r, size_t bytes) {
    owned* o = &c->x[r];
    if (bytes <= o->bytes) return;
    void* storage = calloc(1, bytes);
    memcpy(storage, o->storage, o->bytes);
    free(o->storage);
    o->storage = o->a.data = storage;
    o->bytes = bytes;
    attach(c);
}

static void call_free(call* c) {
    for (int r = 0; r < ROLES; ++r) free(c->x[r].storage);
}

/* ---- Scenarios: valid calls that the cases break in one place ---------------------------- */

static void dense(call* c, mfa_direction direction) {
    memset(c, 0, sizeof *c);
    mfa_attention_args_init(&c->args, sizeof c->args);
    mfa_attention_params_init(&c->params);
    c->direction = direction;
    const int backward = direction == MFA_BACKWARD;
    make(c, Q, MFA_DTYPE_F32, B, HQ, NQ, D, 0);
    make(c, K, MFA_DTYPE_F32, B, HKV, NK, D, 0);
    make(c, V, MFA_DTYPE_F32, B, HKV, NK, DV, 0);
    make(c, OUT, MFA_DTYPE_F32, B, HQ, NQ, DV, !backward);
    make(c, LSE, MFA_DTYPE_F32, B, HQ, NQ, 1, !backward);
    if (backward) {
        make(c, DOUT, MFA_DTYPE_F32, B, HQ, NQ, DV, 0);
        make(c, DQ, MFA_DTYPE_F32, B, HQ, NQ, D, 1);
        make(c, DK, MFA_DTYPE_F32, B, HKV, NK, D, 1);
        make(c, GRAD_V, MFA_DTYPE_F32, B, HKV, NK, DV, 1);
    }
    attach(c);
}

static void forward(call* c) { dense(c, MFA_FORWARD); }
static void backward(call* c) { dense(c, MFA_BACKWARD); }

static void masked(call* c) {
    forward(c);
    make(c, MASK, MFA_DTYPE_BOOL, B, HQ, NQ, NK, 0);
    attach(c);
}

static void block_masked(call* c) {
    masked(c);
    make(c, BLOCK_MASK, MFA_DTYPE_BOOL, B, HQ, 1, 1, 0);
    attach(c);
}

static void with_sinks(call* c, mfa_direction direction) {
    dense(c, direction);
    make(c, SINKS, MFA_DTYPE_F32, 1, HQ, 1, 1, 0);
    if (direction == MFA_BACKWARD) make(c, DSINKS, MFA_DTYPE_F32, 1, HQ, 1, 1, 1);
    attach(c);
}
static void sinks_forward(call* c) { with_sinks(c, MFA_FORWARD); }
static void sinks_backward(call* c) { with_sinks(c, MFA_BACKWARD); }

static void alibi(call* c) {
    forward(c);
    make(c, ALIBI, MFA_DTYPE_F32, B, HQ, 1, 1, 0);
    attach(c);
}

static void packed(call* c, mfa_direction direction) {
    memset(c, 0, sizeof *c);
    mfa_attention_args_init(&c->args, sizeof c->args);
    mfa_attention_params_init(&c->params);
    c->direction = direction;
    const int backward = direction == MFA_BACKWARD;
    make(c, Q, MFA_DTYPE_F32, 1, HQ, TOTAL_Q, D, 0);
    make(c, K, MFA_DTYPE_F32, 1, HKV, TOTAL_K, D, 0);
    make(c, V, MFA_DTYPE_F32, 1, HKV, TOTAL_K, DV, 0);
    make(c, OUT, MFA_DTYPE_F32, 1, HQ, TOTAL_Q, DV, !backward);
    make(c, LSE, MFA_DTYPE_F32, 1, HQ, TOTAL_Q, 1, !backward);
    if (backward) {
        make(c, DOUT, MFA_DTYPE_F32, 1, HQ, TOTAL_Q, DV, 0);
        make(c, DQ, MFA_DTYPE_F32, 1, HQ, TOTAL_Q, D, 1);
        make(c, DK, MFA_DTYPE_F32, 1, HKV, TOTAL_K, D, 1);
        make(c, GRAD_V, MFA_DTYPE_F32, 1, HKV, TOTAL_K, DV, 1);
    }
    make(c, CU_Q, MFA_DTYPE_I32, 1, 1, 1, 3, 0);
    make(c, CU_K, MFA_DTYPE_I32, 1, 1, 1, 3, 0);
    set_i32(c, CU_Q, 1, 4);
    set_i32(c, CU_Q, 2, TOTAL_Q);
    set_i32(c, CU_K, 1, 5);
    set_i32(c, CU_K, 2, TOTAL_K);
    c->args.max_seqlen_q = MAX_Q;
    c->args.max_seqlen_k = MAX_K;
    attach(c);
}
static void varlen(call* c) { packed(c, MFA_FORWARD); }
static void varlen_backward(call* c) { packed(c, MFA_BACKWARD); }

/* Sequence 0 holds 10 keys in blocks 0, 1 (2 unused), sequence 1 holds 5 in block 3; the new
 * keys land in block 1 rows 2-3 and block 3 rows 5-6. */
static void paged(call* c) {
    memset(c, 0, sizeof *c);
    mfa_attention_args_init(&c->args, sizeof c->args);
    mfa_attention_params_init(&c->params);
    c->direction = MFA_FORWARD;
    make(c, Q, MFA_DTYPE_F32, B, HQ, PAGED_NQ, D, 0);
    make(c, K, MFA_DTYPE_F32, BLOCKS, HKV, BLOCK_SIZE, D, 1);
    make(c, V, MFA_DTYPE_F32, BLOCKS, HKV, BLOCK_SIZE, DV, 1);
    make(c, OUT, MFA_DTYPE_F32, B, HQ, PAGED_NQ, DV, 1);
    make(c, LSE, MFA_DTYPE_F32, B, HQ, PAGED_NQ, 1, 1);
    make(c, TABLE, MFA_DTYPE_I32, B, 1, 1, MAX_BLOCKS, 0);
    const int32_t table[B][MAX_BLOCKS] = {{0, 1, 2}, {3, 4, 5}};
    memcpy(c->x[TABLE].storage, table, sizeof table);
    make(c, LENGTHS, MFA_DTYPE_I32, B, 1, 1, 1, 0);
    set_i32(c, LENGTHS, 0, 10);
    set_i32(c, LENGTHS, 1, 5);
    make(c, K_NEW, MFA_DTYPE_F32, B, HKV, NEW, D, 0);
    make(c, V_NEW, MFA_DTYPE_F32, B, HKV, NEW, DV, 0);
    attach(c);
}

/* Without appended keys the caches are inputs. */
static void paged_read_only(call* c) {
    paged(c);
    free(c->x[K_NEW].storage);
    free(c->x[V_NEW].storage);
    c->x[K_NEW].storage = c->x[V_NEW].storage = NULL;
    c->x[K].output = c->x[V].output = 0;
    attach(c);
}

/* ---- Running a case ------------------------------------------------------------------------ */

static void expect(const char* label, mfa_status got, mfa_status expected, const char* substring) {
    const char* message = mfa_last_error();
    CHECK(got == expected, "%s: status %d (%s), expected %d (%s); message: %s", label, (int)got,
          mfa_status_string(got), (int)expected, mfa_status_string(expected), message);
    CHECK(strstr(message, substring) != NULL, "%s: message \"%s\" does not mention \"%s\"", label,
          message, substring);
}

static void run_case(const char* label, call* c, mfa_status expected, const char* substring) {
    unsigned char* before[ROLES] = {NULL};
    for (int r = 0; r < ROLES; ++r) {
        if (!c->x[r].storage) continue;
        if (c->x[r].output) memset(c->x[r].storage, CANARY, c->x[r].bytes);
        before[r] = (unsigned char*)malloc(c->x[r].bytes);
        memcpy(before[r], c->x[r].storage, c->x[r].bytes);
    }
    const mfa_status status = mfa_attention_compute(ctx, c->direction, &c->params, &c->args);
    expect(label, status, expected, substring);
    for (int r = 0; r < ROLES; ++r) {
        if (!before[r]) continue;
        CHECK(memcmp(before[r], c->x[r].storage, c->x[r].bytes) == 0,
              "%s: array %d was written by a call that failed", label, r);
        free(before[r]);
    }
}

/* CASE(label, scenario, status, substring, statements breaking the call `c`) */
#define CASE(label, scenario, expected, substring, ...)                                            \
    do {                                                                                           \
        call c;                                                                                    \
        scenario(&c);                                                                              \
        __VA_ARGS__;                                                                               \
        run_case(label, &c, expected, substring);                                                  \
        call_free(&c);                                                                             \
    } while (0)

static mfa_capabilities caps;

static void run_valid(const char* label, call* c, uint32_t features, const char* substring) {
    const uint32_t have = c->direction == MFA_BACKWARD ? caps.backward_features : caps.features;
    if ((have & features) != features) {
        run_case(label, c, MFA_ERROR_UNSUPPORTED, substring);
        return;
    }
    const mfa_status status = mfa_attention_compute(ctx, c->direction, &c->params, &c->args);
    CHECK(status == MFA_OK, "%s: a valid call the backend supports failed: %s", label,
          mfa_last_error());
}

/* VALID(label, scenario, features used, substring of the UNSUPPORTED message, statements) */
#define VALID(label, scenario, features, substring, ...)                                           \
    do {                                                                                           \
        call c;                                                                                    \
        scenario(&c);                                                                              \
        __VA_ARGS__;                                                                               \
        run_valid(label, &c, features, substring);                                                 \
        call_free(&c);                                                                             \
    } while (0)

static const mfa_status INVALID = MFA_ERROR_INVALID_ARGUMENT;
static const mfa_status UNSUPPORTED = MFA_ERROR_UNSUPPORTED;

static void test_struct_and_direction(void) {
    {
        call c;
        forward(&c);
        expect("args NULL", mfa_attention_compute(ctx, MFA_FORWARD, NULL, NULL), INVALID,
               "args is NULL");
        expect("ctx NULL", mfa_attention_compute(NULL, MFA_FORWARD, NULL, &c.args), INVALID,
               "ctx is NULL");
        call_free(&c);
    }
    CASE("args larger", forward, INVALID, "args.struct_size", c.args.struct_size += 8);
    CASE("args smaller", forward, INVALID, "smaller than mfa_attention_args has ever been",
         c.args.struct_size = 16);
    CASE("direction", forward, INVALID, "direction = 7 is not an mfa_direction",
         c.direction = (mfa_direction)7);
    CASE("dq in forward", forward, INVALID, "dq is given to a forward call",
         make(&c, DQ, MFA_DTYPE_F32, B, HQ, NQ, D, 1);
         attach(&c));
    CASE("dsinks in forward", sinks_forward, INVALID, "args.dsinks is given to a forward call",
         make(&c, DSINKS, MFA_DTYPE_F32, 1, HQ, 1, 1, 1);
         attach(&c));
    CASE("initial state in backward", backward, INVALID,
         "args.initial_state = 1 is given to a backward call", c.args.initial_state = 1);
    CASE("block table in backward", backward, INVALID,
         "args.block_table is given to a backward call",
         make(&c, TABLE, MFA_DTYPE_I32, B, 1, 1, 1, 0);
         attach(&c));
    CASE("initial state value", forward, INVALID, "args.initial_state must be 0 or 1, got 2",
         c.args.initial_state = 2);
    CASE("initial state without lse", forward, INVALID,
         "lse is NULL; args.initial_state needs the state's log-sum-exp", c.args.initial_state = 1;
         c.args.lse = NULL);
    if (!(caps.features & MFA_FEATURE_DEVICE_BUFFERS)) {
        CASE("dense operand in a buffer", forward, UNSUPPORTED, "q is in a device buffer: the",
             c.x[Q].a.data = NULL;
             c.x[Q].a.buffer = (void*)(uintptr_t)4096);
        CASE("mask in a buffer", masked, UNSUPPORTED, "args.mask is in a device buffer: the",
             c.x[MASK].a.data = NULL;
             c.x[MASK].a.buffer = (void*)(uintptr_t)4096);
    }
    CASE("data and buffer", forward, INVALID, "k.data and k.buffer are both set",
         c.x[K].a.buffer = (void*)(uintptr_t)4096);
    CASE("no memory", forward, INVALID, "v.data is NULL and so is v.buffer", c.x[V].a.data = NULL);
    CASE("host byte_offset misaligned", forward, INVALID,
         "q.data + byte_offset is not aligned to its element size (4 bytes)",
         c.x[Q].a.byte_offset = 2);
    CASE("q bool", forward, INVALID, "q.dtype must be f32, f16 or bf16",
         c.x[Q].a.dtype = MFA_DTYPE_BOOL);
}

static void test_softcap(void) {
    CASE("softcap negative", forward, INVALID,
         "args.softcap must be finite and >= 0 (0 = none), got -1", c.args.softcap = -1.0f);
    CASE("softcap nan", forward, INVALID, "args.softcap must be finite", c.args.softcap = NAN);
    CASE("softcap inf", forward, INVALID, "got inf", c.args.softcap = INFINITY);
    VALID("softcap valid", forward, MFA_FEATURE_SOFTCAP,
          "backend does not support softcap (args.softcap; MFA_FEATURE_SOFTCAP) in the forward",
          c.args.softcap = 30.0f);
}

static void test_masks(void) {
    CASE("mask dtype", masked, INVALID,
         "args.mask.dtype must be f32 or bool (boolean, or "
         "additive in f32 or q's dtype), got i32",
         c.x[MASK].a.dtype = MFA_DTYPE_I32);
    CASE("mask f16 for f32 q", masked, INVALID, "got f16", c.x[MASK].a.dtype = MFA_DTYPE_F16);
    CASE("mask query dim", masked, INVALID,
         "args.mask.shape[2] (query) must equal q.shape[2] = 5 or be 1, got 4",
         c.x[MASK].a.shape[2] = 4);
    CASE("mask batch dim", masked, INVALID,
         "args.mask.shape[0] (batch) must equal q.shape[0] = 2 or be 1, got 3",
         c.x[MASK].a.shape[0] = 3);
    CASE("mask key dim", masked, INVALID,
         "args.mask.shape[3] (key) must equal k.shape[2] = 7 or be 1, got 6",
         c.x[MASK].a.shape[3] = 6);
    CASE("mask heads dim", masked, INVALID,
         "args.mask.shape[1] (heads) must equal q.shape[1] = 4 or be 1, got 2",
         c.x[MASK].a.shape[1] = 2);
    VALID("mask broadcast by size 1", masked, MFA_FEATURE_MASK,
          "does not support masks (args.mask; MFA_FEATURE_MASK) in the forward",
          c.x[MASK].a.shape[0] = 1;
          c.x[MASK].a.shape[1] = 1; c.x[MASK].a.shape[2] = 1);
    VALID("mask broadcast by stride 0", masked, MFA_FEATURE_MASK, "MFA_FEATURE_MASK",
          c.x[MASK].a.strides[0] = 0;
          c.x[MASK].a.strides[2] = 0);
    VALID("additive mask f32", masked, MFA_FEATURE_MASK, "MFA_FEATURE_MASK",
          make(&c, MASK, MFA_DTYPE_F32, B, HQ, NQ, NK, 0);
          attach(&c));
    CASE("mask aliases out", masked, INVALID, "out overlaps args.mask",
         c.x[MASK].a.data = c.x[OUT].storage);
    CASE("mask null data", masked, INVALID, "args.mask.data is NULL", c.x[MASK].a.data = NULL);
    CASE("mask offset overflow", masked, MFA_ERROR_SIZE_OVERFLOW, "args.mask: element offsets",
         c.x[MASK].a.strides[2] = INT64_MAX);
    VALID("mask in backward", backward, MFA_FEATURE_MASK, "MFA_FEATURE_MASK) in the backward",
          make(&c, MASK, MFA_DTYPE_BOOL, 1, 1, NQ, NK, 0);
          attach(&c));

    CASE("block mask without mask", forward, INVALID, "args.block_mask is given without args.mask",
         make(&c, BLOCK_MASK, MFA_DTYPE_BOOL, B, HQ, 1, 1, 0);
         attach(&c));
    CASE("block mask rows", block_masked, INVALID,
         "args.block_mask.shape[2] (query) must equal ceil(Nq / MFA_MASK_BLOCK) = 1, got 2",
         c.x[BLOCK_MASK].a.shape[2] = 2);
    CASE("block mask dtype", block_masked, INVALID, "args.block_mask.dtype must be bool",
         c.x[BLOCK_MASK].a.dtype = MFA_DTYPE_F32);
    CASE("block mask code", block_masked, INVALID,
         "args.block_mask[1, 2, 0, 0] = 3 is not a summary code",
         ((unsigned char*)c.x[BLOCK_MASK].storage)[HQ + 2] = 3);
    CASE("block mask batch of a full mask", block_masked, INVALID,
         "args.block_mask.shape[0] (batch) must equal args.mask.shape[0] = 2, got 1",
         c.x[BLOCK_MASK].a.shape[0] = 1);
    VALID("block mask batch of a broadcast mask", block_masked,
          MFA_FEATURE_MASK | MFA_FEATURE_BLOCK_MASK, "MFA_FEATURE_MASK", c.x[MASK].a.strides[0] = 0;
          c.x[BLOCK_MASK].a.shape[0] = 1);
    VALID("block mask valid", block_masked, MFA_FEATURE_MASK | MFA_FEATURE_BLOCK_MASK,
          "masks (args.mask");
}

static void test_alibi_and_sinks(void) {
    CASE("alibi dtype", alibi, INVALID,
         "args.alibi_slopes.dtype must be f32 (ALiBi slopes are f32), got f16",
         c.x[ALIBI].a.dtype = MFA_DTYPE_F16);
    CASE("alibi heads", alibi, INVALID,
         "args.alibi_slopes.shape[1] (heads) must equal q.shape[1] = 4, got 2",
         c.x[ALIBI].a.shape[1] = 2);
    CASE("alibi trailing", alibi, INVALID, "args.alibi_slopes.shape[2] must be 1, got 5",
         c.x[ALIBI].a.shape[2] = 5);
    CASE("alibi batch", alibi, INVALID,
         "args.alibi_slopes.shape[0] (batch) must equal q.shape[0] = 2 or be 1, got 4",
         c.x[ALIBI].a.shape[0] = 4);
    VALID("alibi valid per head", alibi, MFA_FEATURE_ALIBI,
          "ALiBi (args.alibi_slopes; MFA_FEATURE_ALIBI)", c.x[ALIBI].a.shape[0] = 1);

    CASE("sinks batch", sinks_forward, INVALID, "args.sinks.shape[0] must be 1, got 2",
         c.x[SINKS].a.shape[0] = 2);
    CASE("sinks dtype", sinks_forward, INVALID,
         "args.sinks.dtype must be f32 (sinks are f32), got bf16",
         c.x[SINKS].a.dtype = MFA_DTYPE_BF16);
    VALID("sinks valid", sinks_forward, MFA_FEATURE_SINKS,
          "attention sinks (args.sinks; MFA_FEATURE_SINKS) in the forward");
    CASE("dsinks without sinks", sinks_backward, INVALID, "args.dsinks is given without args.sinks",
         c.args.sinks = NULL);
    CASE("dsinks aliases sinks", sinks_backward, INVALID, "args.dsinks overlaps args.sinks",
         c.x[DSINKS].a.data = c.x[SINKS].storage);
    CASE("dsinks broadcast", sinks_backward, INVALID,
         "args.dsinks: stride 0 of dim 1 (heads) makes elements overlap",
         c.x[DSINKS].a.strides[1] = 0);
    CASE("dsinks aliases dq", sinks_backward, INVALID, "dq overlaps args.dsinks",
         c.x[DSINKS].a.data = c.x[DQ].storage);
    CASE("dsinks shape", sinks_backward, INVALID,
         "args.dsinks.shape[1] (heads) must equal q.shape[1] = 4, got 1",
         c.x[DSINKS].a.shape[1] = 1);
    VALID("sinks valid backward", sinks_backward, MFA_FEATURE_SINKS,
          "MFA_FEATURE_SINKS) in the backward");
}

static void test_varlen(void) {
    CASE("cu_k missing", varlen, INVALID,
         "args.cu_seqlens_k is NULL; packed sequences need args.cu_seqlens_q",
         c.args.cu_seqlens_k = NULL);
    CASE("max_seqlen_q zero", varlen, INVALID, "args.max_seqlen_q must be in [1, 2^31 - 1]",
         c.args.max_seqlen_q = 0);
    CASE("max_seqlen_k too large", varlen, INVALID, "args.max_seqlen_k must be in [1, 2^31 - 1]",
         c.args.max_seqlen_k = (int64_t)1 << 40);
    CASE("max_seqlen without offsets", forward, INVALID, "args.cu_seqlens_q is NULL",
         c.args.max_seqlen_k = 4);
    CASE("offsets dtype", varlen, INVALID,
         "args.cu_seqlens_q.dtype must be i32 (sequence offsets are int32), got f32",
         c.x[CU_Q].a.dtype = MFA_DTYPE_F32);
    CASE("offsets too few", varlen, INVALID, "args.cu_seqlens_q.shape[3] (offsets) must be >= 2",
         c.x[CU_Q].a.shape[3] = 1);
    CASE("offsets counts differ", varlen, INVALID,
         "args.cu_seqlens_k.shape[3] (offsets) must equal args.cu_seqlens_q.shape[3] = 3, got 2",
         c.x[CU_K].a.shape[3] = 2);
    CASE("offsets shape", varlen, INVALID, "args.cu_seqlens_q.shape[1] must be 1, got 2",
         c.x[CU_Q].a.shape[1] = 2);
    CASE("offsets start", varlen, INVALID, "args.cu_seqlens_q[0] must be 0, got 1",
         set_i32(&c, CU_Q, 0, 1));
    CASE("offsets decrease", varlen, INVALID, "args.cu_seqlens_q decreases at entry 1: -1 after 0",
         set_i32(&c, CU_Q, 1, -1));
    CASE("sequence too long", varlen, INVALID,
         "args.cu_seqlens_q: sequence 1 has 5 queries, more than args.max_seqlen_q = 4",
         c.args.max_seqlen_q = 4);
    CASE("keys too long", varlen, INVALID,
         "args.cu_seqlens_k: sequence 0 has 5 keys, more than args.max_seqlen_k = 4",
         c.args.max_seqlen_k = 4);
    CASE("offsets end", varlen, INVALID,
         "args.cu_seqlens_k[2] = 11 must equal the packed length k.shape[2] = 12",
         set_i32(&c, CU_K, 2, 11));
    CASE("broadcast offsets", varlen, INVALID, "must equal the packed length q.shape[2] = 9",
         c.x[CU_Q].a.strides[3] = 0);
    CASE("packed batch", varlen, INVALID, "q.shape[0] (batch) must be 1 with packed sequences",
         c.x[Q].a.shape[0] = 2;
         c.x[Q].a.strides[0] = 0);
    CASE("packed with paged", varlen, INVALID, "given together",
         make(&c, TABLE, MFA_DTYPE_I32, 1, 1, 1, 1, 0);
         attach(&c));
    CASE("mask of packed sequences", varlen, INVALID,
         "args.mask.shape[2] (query) must equal args.max_seqlen_q = 5 or be 1, got 9",
         make(&c, MASK, MFA_DTYPE_BOOL, 1, 1, TOTAL_Q, MAX_K, 0);
         attach(&c));
    CASE("mask batch of packed sequences", varlen, INVALID,
         "args.mask.shape[0] (batch) must equal B (args.cu_seqlens_q.shape[3] - 1) = 2 or be 1",
         make(&c, MASK, MFA_DTYPE_BOOL, 3, 1, MAX_Q, MAX_K, 0);
         attach(&c));
    CASE("out aliases offsets", varlen, INVALID, "out overlaps args.cu_seqlens_q",
         grow_storage(&c, CU_Q, c.x[OUT].bytes);
         c.x[OUT].a.data = c.x[CU_Q].storage);
    CASE("dk aliases offsets", varlen_backward, INVALID, "dk overlaps args.cu_seqlens_k",
         grow_storage(&c, CU_K, c.x[DK].bytes);
         c.x[DK].a.data = c.x[CU_K].storage);
    VALID("empty sequences", varlen, MFA_FEATURE_VARLEN, "packed sequences (args.cu_seqlens_q, _k",
          set_i32(&c, CU_K, 1, 0);
          c.args.max_seqlen_k = TOTAL_K);
    VALID("varlen valid backward", varlen_backward, MFA_FEATURE_VARLEN,
          "MFA_FEATURE_VARLEN) in the backward");
}

static void test_paged(void) {
    CASE("lengths missing", paged, INVALID,
         "args.cache_seqlens is NULL; a paged KV cache needs args.block_table",
         c.args.cache_seqlens = NULL);
    CASE("v_new missing", paged, INVALID, "args.v_new is NULL while args.k_new is given",
         c.args.v_new = NULL);
    CASE("block size 12", paged_read_only, INVALID,
         "k.shape[2] (block size) must be a multiple of 8 from 8 to 256 with a paged KV cache, "
         "got 12",
         make(&c, K, MFA_DTYPE_F32, BLOCKS, HKV, 12, D, 0);
         make(&c, V, MFA_DTYPE_F32, BLOCKS, HKV, 12, DV, 0); attach(&c));
    CASE("block size 264", paged_read_only, INVALID, "got 264",
         make(&c, K, MFA_DTYPE_F32, BLOCKS, HKV, 264, D, 0);
         make(&c, V, MFA_DTYPE_F32, BLOCKS, HKV, 264, DV, 0); attach(&c));
    CASE("cache heads", paged, INVALID, "v.shape[1] (heads) must equal k.shape[1] = 2, got 1",
         c.x[V].a.shape[1] = 1);
    CASE("cache blocks", paged, INVALID, "v.shape[0] (blocks) must equal k.shape[0] = 6, got 5",
         c.x[V].a.shape[0] = 5);
    CASE("block id too large", paged, INVALID,
         "args.block_table[1, 0] = 6 is not a block of the cache: k.shape[0] = 6 blocks",
         set_i32(&c, TABLE, MAX_BLOCKS, 6));
    CASE("block id negative", paged, INVALID, "args.block_table[0, 1] = -1 is not a block",
         set_i32(&c, TABLE, 1, -1));
    VALID("unreached entries are not read", paged, MFA_FEATURE_PAGED_KV,
          "paged KV caches (args.block_table; MFA_FEATURE_PAGED_KV)",
          set_i32(&c, TABLE, MAX_BLOCKS + 2, 99);
          set_i32(&c, TABLE, 2, -7));
    CASE("length negative", paged, INVALID, "args.cache_seqlens[0] = -1 must be >= 0",
         set_i32(&c, LENGTHS, 0, -1));
    CASE("length beyond capacity", paged, INVALID,
         "args.cache_seqlens[0] = 23 plus 2 new keys exceeds the capacity of a sequence, "
         "args.block_table.shape[3] * block_size = 3 * 8 = 24",
         set_i32(&c, LENGTHS, 0, 23));
    VALID("full without new keys", paged_read_only, MFA_FEATURE_PAGED_KV, "MFA_FEATURE_PAGED_KV",
          set_i32(&c, LENGTHS, 0, 24));
    CASE("block written twice", paged, INVALID,
         "args.block_table: block 1 receives new keys at [0, 1] and at [1, 0]",
         set_i32(&c, TABLE, MAX_BLOCKS, 1));
    CASE("written block read elsewhere", paged, INVALID,
         "args.block_table[0, 0] = 1 is a block that args.k_new writes at [0, 1]",
         set_i32(&c, TABLE, 0, 1));
    CASE("written block shared by another sequence", paged, INVALID,
         "args.block_table[0, 0] = 3 is a block that args.k_new writes at [1, 1]",
         set_i32(&c, LENGTHS, 1, 14);
         set_i32(&c, TABLE, MAX_BLOCKS, 4); set_i32(&c, TABLE, MAX_BLOCKS + 1, 3);
         set_i32(&c, TABLE, 0, 3));
    VALID("shared read-only blocks", paged_read_only, MFA_FEATURE_PAGED_KV, "MFA_FEATURE_PAGED_KV",
          set_i32(&c, TABLE, MAX_BLOCKS, 0));
    CASE("k_new head dim", paged, INVALID,
         "args.k_new.shape[3] (head dim) must equal q.shape[3] = 8, got 4",
         c.x[K_NEW].a.shape[3] = 4);
    CASE("v_new rows", paged, INVALID,
         "args.v_new.shape[2] (seq) must equal args.k_new.shape[2] = 2, got 1",
         c.x[V_NEW].a.shape[2] = 1);
    CASE("k_new dtype", paged, INVALID, "args.k_new.dtype must be f32",
         c.x[K_NEW].a.dtype = MFA_DTYPE_F16);
    CASE("cache aliases new keys", paged, INVALID, "k overlaps args.k_new",
         c.x[K_NEW].a.data = c.x[K].storage);
    CASE("caches alias while appending", paged, INVALID, "k overlaps v",
         c.x[V].a.data = c.x[K].storage);
    VALID("caches alias read-only", paged_read_only, MFA_FEATURE_PAGED_KV, "MFA_FEATURE_PAGED_KV",
          c.x[V].a.data = c.x[K].storage;
          c.x[V].a.shape[3] = D; c.x[V].a.strides[2] = D; c.x[V].a.strides[1] = BLOCK_SIZE * D;
          c.x[V].a.strides[0] = HKV * BLOCK_SIZE * D;
          make(&c, OUT, MFA_DTYPE_F32, B, HQ, PAGED_NQ, D, 1); attach(&c));
    CASE("cache self-overlap while appending", paged, INVALID, "k: stride 0 of dim 0",
         c.x[K].a.strides[0] = 0);
    CASE("table batch", paged, INVALID,
         "args.block_table.shape[0] (batch) must equal q.shape[0] = 2, got 3",
         c.x[TABLE].a.shape[0] = 3);
    CASE("table dtype", paged, INVALID,
         "args.block_table.dtype must be i32 (block tables are int32)",
         c.x[TABLE].a.dtype = MFA_DTYPE_F32);
    CASE("lengths shape", paged, INVALID, "args.cache_seqlens.shape[3] must be 1, got 2",
         c.x[LENGTHS].a.shape[3] = 2);
    CASE("mask of a paged cache", paged, INVALID,
         "args.mask.shape[3] (key) must equal args.block_table.shape[3] * block_size = 24 or be "
         "1, got 7",
         make(&c, MASK, MFA_DTYPE_BOOL, 1, 1, PAGED_NQ, 7, 0);
         attach(&c));
    CASE("capacity overflow", paged, MFA_ERROR_SIZE_OVERFLOW, "overflows 64 bits",
         c.x[TABLE].a.shape[3] = (int64_t)1 << 61;
         c.x[TABLE].a.strides[3] = 0);
    VALID("paged valid", paged, MFA_FEATURE_PAGED_KV, "MFA_FEATURE_PAGED_KV) in the forward");
}

static void test_initial_state(void) {
    VALID("initial state valid", forward, MFA_FEATURE_INITIAL_STATE,
          "an initial state (args.initial_state; MFA_FEATURE_INITIAL_STATE) in the forward",
          c.args.initial_state = 1);
    VALID("several features", forward, MFA_FEATURE_SOFTCAP | MFA_FEATURE_INITIAL_STATE,
          "MFA_FEATURE_", c.args.initial_state = 1;
          c.args.softcap = 5.0f);
}

/* The device entry points of a context without device buffers or encoding. */
static void test_device_entry_points(void) {
    if (caps.features & (MFA_FEATURE_DEVICE_BUFFERS | MFA_FEATURE_ENCODE)) return;
    void* buffer = (void*)1;
    expect("buffer create", mfa_buffer_create(ctx, 64, &buffer), UNSUPPORTED,
           "mfa_buffer_create: the");
    expect("buffer create names the feature", mfa_buffer_create(ctx, 64, &buffer), UNSUPPORTED,
           "backend has no device buffers (it lacks MFA_FEATURE_DEVICE_BUFFERS)");
    CHECK(buffer == NULL, "*buffer not reset on failure");
    expect("buffer create out NULL", mfa_buffer_create(ctx, 64, NULL), INVALID, "buffer is NULL");
    CHECK(mfa_buffer_contents(ctx, (void*)16) == NULL, "contents without device buffers");
    CHECK(mfa_buffer_length(ctx, (void*)16) == 0, "length without device buffers");
    mfa_buffer_destroy(ctx, (void*)16); /* nothing to release: must not touch it */
    mfa_buffer_destroy(NULL, NULL);
    void* commands = (void*)1;
    expect("command buffer create", mfa_command_buffer_create(ctx, &commands), UNSUPPORTED,
           "backend has no command buffers or encoding (it lacks MFA_FEATURE_ENCODE)");
    CHECK(commands == NULL, "*command_buffer not reset on failure");
    expect("commit", mfa_command_buffer_commit(ctx, (void*)16), UNSUPPORTED, "MFA_FEATURE_ENCODE");
    expect("wait", mfa_command_buffer_wait(ctx, (void*)16), UNSUPPORTED, "MFA_FEATURE_ENCODE");
    expect("commit NULL ctx", mfa_command_buffer_commit(NULL, (void*)16), INVALID, "ctx is NULL");
    mfa_command_buffer_destroy(ctx, (void*)16);
    call c;
    forward(&c);
    expect("encode", mfa_attention_encode(ctx, (void*)16, MFA_FORWARD, NULL, &c.args), UNSUPPORTED,
           "backend has no command buffers or encoding");
    call_free(&c);
}

static void run_backend(mfa_context* backend_ctx, mfa_backend backend) {
    (void)backend;
    ctx = backend_ctx;
    caps.struct_size = sizeof caps;
    mfa_context_capabilities(ctx, &caps);
    test_struct_and_direction();
    test_softcap();
    test_masks();
    test_alibi_and_sinks();
    test_varlen();
    test_paged();
    test_initial_state();
    test_device_entry_points();
}

int main(void) {
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = 1;
    test_each_backend(&options, run_backend);
    return test_finish("test_args_validation");
}
