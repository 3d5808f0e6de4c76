/* The input structs' ABI promise of mfa.h, from the side of a program built against another
 * release's header: any struct_size from the first release's size up to the library's own is
 * accepted and read, fields beyond it taking their defaults; larger and smaller sizes are
 * rejected with a message naming the struct, before anything is written; and what
 * mfa_attention_args_init writes for each size.
 *
 * The caller's structs are declared here with their first release's layout (0.1.0 for the params
 * and options, 0.2.0 for mfa_attention_args), as that release's mfa.h laid them out, not taken
 * from today's mfa.h nor from the library's own frozen copies (core/validate.h): they are what
 * this test holds the library to. Once mfa.h appends a field, this is exactly an older program
 * calling a newer library. They live in exactly-sized heap blocks, so that a library that read
 * past struct_size is caught by the AddressSanitizer build. A newer program is simulated by the
 * same layout with a field appended. */
#include "test_reference.h"
#include "test_util.h"

/* mfa_attention_params and mfa_context_options of libmfa 0.1.0. */
typedef struct params_0_1_0 {
    size_t struct_size;
    float scale;
    int32_t causal;
    mfa_alignment alignment;
    int64_t window_left;
    int64_t window_right;
} params_0_1_0;

typedef struct options_0_1_0 {
    size_t struct_size;
    int32_t num_threads;
    mfa_gpu_family gpu_family;
    uint64_t sim_schedule_seed;
} options_0_1_0;

/* A later release's layouts: the same fields and one appended. */
typedef struct params_next {
    params_0_1_0 first;
    int64_t appended;
} params_next;

typedef struct options_next {
    options_0_1_0 first;
    int64_t appended;
} options_next;

enum { B = 1, HQ = 2, HKV = 1, NQ = 5, NK = 9, D = 4, DV = 3 };

/* The options an older program sets by hand: every field, none from today's init. */
static params_0_1_0* old_params(void) {
    params_0_1_0* p = (params_0_1_0*)malloc(sizeof *p);
    p->struct_size = sizeof *p;
    p->scale = 0.7f;
    p->causal = 1;
    p->alignment = MFA_ALIGN_TOP_LEFT;
    p->window_left = 2;
    p->window_right = -1;
    return p;
}

/* The same options through today's struct, for the reference. */
static mfa_attention_params current_params(const params_0_1_0* old) {
    return test_params(old->causal, old->alignment, old->window_left, old->window_right,
                       old->scale);
}

static int out_untouched(const test_tensor* out) {
    const unsigned char* bytes = (const unsigned char*)out->storage;
    for (size_t i = 0; i < out->bytes; ++i)
        if (bytes[i] != 0xff) return 0;
    return 1;
}

/* A refused call: MFA_ERROR_INVALID_ARGUMENT, a message containing each of the NULL-terminated
 * texts, and out not written. */
static void expect_refused(const char* label, mfa_status status, const test_attention* a,
                           const char* const* texts) {
    CHECK(status == MFA_ERROR_INVALID_ARGUMENT, "%s accepted", label);
    for (; *texts; ++texts)
        CHECK(strstr(mfa_last_error(), *texts), "%s: message: %s", label, mfa_last_error());
    CHECK(out_untouched(&a->out), "%s: out written by a refused call", label);
}

/* out of the forward just made against the reference with params (NULL: the defaults). */
static void check_out(const test_attention* a, const mfa_attention_params* params,
                      const char* with) {
    const ref_problem problem = ref_problem_of(&a->q.t, &a->k.t, &a->v.t, params);
    ref_result want = ref_forward(&problem, &a->q.t, &a->k.t, &a->v.t);
    char why[256];
    CHECK(ref_compare(&a->out.t, MFA_DTYPE_F32, want.out, want.out_mag, NK, want.max_score, why,
                      sizeof why),
          "out with %s: %s", with, why);
    ref_free(&want);
}

static void test_params_sizes(mfa_context* ctx) {
    test_attention a = test_attention_make(MFA_DTYPE_F32, B, HQ, HKV, NQ, NK, D, DV, TEST_BHSD);

    /* An older program's params are read: every non-default field shows in the result, which
     * must match the float64 reference run with the same options. */
    params_0_1_0* old = old_params();
    test_fill_nan(&a.out);
    CHECK(mfa_attention_forward(ctx, (const mfa_attention_params*)(const void*)old, &a.q.t, &a.k.t,
                                &a.v.t, &a.out.t, NULL) == MFA_OK,
          "0.1.0 params rejected: %s", mfa_last_error());
    const mfa_attention_params same = current_params(old);
    check_out(&a, &same, "0.1.0 params");

    /* A newer program's params (one field appended) are refused, naming the struct. */
    params_next* newer = (params_next*)malloc(sizeof *newer);
    newer->first = *old;
    newer->first.struct_size = sizeof *newer;
    newer->appended = 12345;
    test_fill_nan(&a.out);
    expect_refused(
        "params larger than the library's",
        mfa_attention_forward(ctx, (const mfa_attention_params*)(const void*)newer, &a.q.t, &a.k.t,
                              &a.v.t, &a.out.t, NULL),
        &a,
        (const char* const[]){"params.struct_size", "mfa_attention_params", "newer mfa.h", NULL});

    /* Smaller than the first release's struct: not a struct any release had. */
    old->struct_size = sizeof *old - sizeof old->window_right;
    expect_refused(
        "params smaller than 0.1.0's",
        mfa_attention_forward(ctx, (const mfa_attention_params*)(const void*)old, &a.q.t, &a.k.t,
                              &a.v.t, &a.out.t, NULL),
        &a, (const char* const[]){"params.struct_size", "mfa_attention_params_init()", NULL});

    free(newer);
    free(old);
    test_attention_free(&a);
}

static void test_options_sizes(void) {
    /* An older program's options are read: the thread count shows in the capabilities. */
    options_0_1_0* old = (options_0_1_0*)malloc(sizeof *old);
    old->struct_size = sizeof *old;
    old->num_threads = 3;
    old->gpu_family = MFA_GPU_FAMILY_NONE;
    old->sim_schedule_seed = 0;
    mfa_context* ctx = NULL;
    CHECK(mfa_context_create(MFA_BACKEND_CPU, (const mfa_context_options*)(const void*)old, &ctx) ==
              MFA_OK,
          "0.1.0 options rejected: %s", mfa_last_error());
    if (ctx) {
        mfa_capabilities caps;
        caps.struct_size = sizeof caps;
        CHECK(mfa_context_capabilities(ctx, &caps) == MFA_OK && caps.num_threads == 3,
              "num_threads of 0.1.0 options not read: %d", (int)caps.num_threads);
        mfa_context_destroy(ctx);
    }

    options_next* newer = (options_next*)malloc(sizeof *newer);
    newer->first = *old;
    newer->first.struct_size = sizeof *newer;
    newer->appended = -1;
    ctx = (mfa_context*)newer; /* must be reset to NULL on failure */
    CHECK(mfa_context_create(MFA_BACKEND_CPU, (const mfa_context_options*)(const void*)newer,
                             &ctx) == MFA_ERROR_INVALID_ARGUMENT,
          "options larger than the library's accepted");
    CHECK(ctx == NULL, "out not reset on failure");
    CHECK(strstr(mfa_last_error(), "options.struct_size") &&
              strstr(mfa_last_error(), "mfa_context_options") &&
              strstr(mfa_last_error(), "newer mfa.h"),
          "message: %s", mfa_last_error());

    old->struct_size = sizeof old->struct_size;
    CHECK(mfa_context_create(MFA_BACKEND_CPU, (const mfa_context_options*)(const void*)old, &ctx) ==
              MFA_ERROR_INVALID_ARGUMENT,
          "options smaller than 0.1.0's accepted");
    CHECK(strstr(mfa_last_error(), "options.struct_size") &&
              strstr(mfa_last_error(), "mfa_context_options_init()"),
          "message: %s", mfa_last_error());

    free(newer);
    free(old);
}

/* mfa_attention_args of libmfa 0.2.0, its first release, and a later release's layout. */
typedef struct args_0_2_0 {
    size_t struct_size;
    float softcap;
    int32_t initial_state;
    int64_t max_seqlen_q;
    int64_t max_seqlen_k;
    const mfa_array *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    const mfa_array *mask, *block_mask, *alibi_slopes, *sinks, *dsinks;
    const mfa_array *cu_seqlens_q, *cu_seqlens_k;
    const mfa_array *block_table, *cache_seqlens, *k_new, *v_new;
} args_0_2_0;

typedef struct args_next {
    args_0_2_0 first;
    int64_t appended;
} args_next;

static int all_bytes(const void* p, size_t from, size_t to, unsigned char byte) {
    for (size_t i = from; i < to; ++i)
        if (((const unsigned char*)p)[i] != byte) return 0;
    return 1;
}

static void test_args_sizes(mfa_context* ctx) {
    test_attention a = test_attention_make(MFA_DTYPE_F32, B, HQ, HKV, NQ, NK, D, DV, TEST_BHSD);
    const mfa_array q = test_array_of(&a.q.t), k = test_array_of(&a.k.t), v = test_array_of(&a.v.t),
                    out = test_array_of(&a.out.t), lse = test_array_of(&a.lse.t);

    /* A 0.2.0 program's struct, set by hand and exactly sized (AddressSanitizer builds catch a
     * read past it), is read: the result matches the reference. */
    args_0_2_0* old = (args_0_2_0*)calloc(1, sizeof *old);
    old->struct_size = sizeof *old;
    old->q = &q, old->k = &k, old->v = &v, old->out = &out, old->lse = &lse;
    test_fill_nan(&a.out);
    CHECK(mfa_attention_compute(ctx, MFA_FORWARD, NULL,
                                (const mfa_attention_args*)(const void*)old) == MFA_OK,
          "0.2.0 args rejected: %s", mfa_last_error());
    check_out(&a, NULL, "0.2.0 args");

    /* A newer program's struct (a field appended) is refused, naming the struct. */
    args_next* newer = (args_next*)calloc(1, sizeof *newer);
    newer->first = *old;
    newer->first.struct_size = sizeof *newer;
    test_fill_nan(&a.out);
    expect_refused(
        "args larger than the library's",
        mfa_attention_compute(ctx, MFA_FORWARD, NULL,
                              (const mfa_attention_args*)(const void*)newer),
        &a, (const char* const[]){"args.struct_size", "mfa_attention_args", "newer mfa.h", NULL});

    /* Smaller than the first release's: no release had it. */
    old->struct_size = sizeof *old - sizeof(void*);
    expect_refused(
        "args smaller than 0.2.0's",
        mfa_attention_compute(ctx, MFA_FORWARD, NULL, (const mfa_attention_args*)(const void*)old),
        &a, (const char* const[]){"libmfa 0.2.0", "mfa_attention_args_init()", NULL});
    CHECK(sizeof(args_0_2_0) == sizeof(mfa_attention_args),
          "mfa.h grew mfa_attention_args: this test's newer-program case now needs the layout "
          "of the release that adds the field");

    /* The sized init: zeros and struct_size in exactly the caller's bytes. */
    const size_t big = sizeof(mfa_attention_args) + 16;
    unsigned char* bytes = (unsigned char*)malloc(big + 8);
    memset(bytes, 0xEE, big + 8);
    mfa_attention_args_init((mfa_attention_args*)(void*)bytes, big);
    size_t size;
    memcpy(&size, bytes, sizeof size);
    CHECK(size == big && all_bytes(bytes, sizeof size, big, 0) &&
              all_bytes(bytes, big, big + 8, 0xEE),
          "init of a larger struct: struct_size %zu, or bytes wrong", size);
    CHECK(mfa_attention_compute(ctx, MFA_FORWARD, NULL, (const mfa_attention_args*)(void*)bytes) ==
              MFA_ERROR_INVALID_ARGUMENT,
          "a larger struct, even zero-filled, must be refused");
    const size_t small = 40;
    memset(bytes, 0xEE, big + 8);
    mfa_attention_args_init((mfa_attention_args*)(void*)bytes, small);
    memcpy(&size, bytes, sizeof size);
    CHECK(size == small && all_bytes(bytes, sizeof size, small, 0) &&
              all_bytes(bytes, small, big + 8, 0xEE),
          "init of a smaller struct wrote past it (struct_size %zu)", size);
    memset(bytes, 0xEE, big + 8);
    mfa_attention_args_init((mfa_attention_args*)(void*)bytes, sizeof(size_t) - 1);
    CHECK(all_bytes(bytes, 0, big + 8, 0xEE), "init of a struct too small for struct_size wrote");
    mfa_attention_args_init(NULL, sizeof(mfa_attention_args));

    free(bytes);
    free(newer);
    free(old);
    test_attention_free(&a);
}

int main(void) {
    mfa_context* ctx = test_context(MFA_BACKEND_CPU, NULL, "cpu");
    if (ctx) {
        test_params_sizes(ctx);
        test_args_sizes(ctx);
        mfa_context_destroy(ctx);
    }
    test_options_sizes();
    return test_finish("test_abi_sizes");
}
