/* Every validation path of the C API: each bad argument gets its status and a message naming
 * the problem, and no output byte is written. */
#include <pthread.h>

#include "test_util.h"

enum { B = 2, HQ = 4, HKV = 2, NQ = 5, NK = 7, D = 8, DV = 6 };
#define SENTINEL 0xA5

/* A valid forward + backward problem; cases break one thing at a time. */
typedef struct fixture {
    test_attention a;
    mfa_attention_params params;
} fixture;

static fixture fixture_make(void) {
    fixture f;
    f.a = test_attention_make(MFA_DTYPE_F32, B, HQ, HKV, NQ, NK, D, DV, 0);
    mfa_attention_params_init(&f.params);
    return f;
}

static void fixture_free(fixture* f) { test_attention_free(&f->a); }

static void poison(test_tensor* x) { memset(x->storage, SENTINEL, x->bytes); }

static int untouched(const test_tensor* x) {
    const unsigned char* p = (const unsigned char*)x->storage;
    for (size_t i = 0; i < x->bytes; ++i)
        if (p[i] != SENTINEL) return 0;
    return 1;
}

static void expect_error(const char* label, mfa_status got, mfa_status expected,
                         const char* substring) {
    const char* message = mfa_last_error();
    CHECK(got == expected, "%s: status %d (%s), expected %d (%s); message: %s", label, (int)got,
          mfa_status_string(got), (int)expected, mfa_status_string(expected), message);
    CHECK(message[0] != '\0', "%s: empty error message", label);
    CHECK(strstr(message, substring) != NULL, "%s: message \"%s\" does not mention \"%s\"", label,
          message, substring);
}

static mfa_context* ctx;

static void run_forward(const char* label, fixture* f, mfa_status expected, const char* substring,
                        const mfa_tensor* q, const mfa_tensor* k, const mfa_tensor* v,
                        const mfa_tensor* out, const mfa_tensor* lse) {
    poison(&f->a.out);
    poison(&f->a.lse);
    mfa_status s = mfa_attention_forward(ctx, &f->params, q, k, v, out, lse);
    expect_error(label, s, expected, substring);
    CHECK(untouched(&f->a.out) && untouched(&f->a.lse), "%s: an output was written", label);
}

static void run_backward(const char* label, fixture* f, mfa_status expected,
                         const char* substring) {
    poison(&f->a.dq);
    poison(&f->a.dk);
    poison(&f->a.dv);
    mfa_status s =
        mfa_attention_backward(ctx, &f->params, &f->a.q.t, &f->a.k.t, &f->a.v.t, &f->a.out.t,
                               &f->a.dout.t, &f->a.lse.t, &f->a.dq.t, &f->a.dk.t, &f->a.dv.t);
    expect_error(label, s, expected, substring);
    CHECK(untouched(&f->a.dq) && untouched(&f->a.dk) && untouched(&f->a.dv),
          "%s: a gradient was written", label);
}

/* FORWARD_CASE(label, status, substring, statements breaking the fixture `f`) */
#define FORWARD_CASE(label, expected, substring, ...)                                              \
    do {                                                                                           \
        fixture f = fixture_make();                                                                \
        __VA_ARGS__;                                                                               \
        run_forward(label, &f, expected, substring, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t,      \
                    &f.a.lse.t);                                                                   \
        fixture_free(&f);                                                                          \
    } while (0)

#define BACKWARD_CASE(label, expected, substring, ...)                                             \
    do {                                                                                           \
        fixture f = fixture_make();                                                                \
        __VA_ARGS__;                                                                               \
        run_backward(label, &f, expected, substring);                                              \
        fixture_free(&f);                                                                          \
    } while (0)

static void test_valid_calls_succeed(void) {
    fixture f = fixture_make();
    mfa_status s =
        mfa_attention_forward(ctx, &f.params, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t, &f.a.lse.t);
    CHECK(s == MFA_OK, "valid forward failed: %s", mfa_last_error());
    s = mfa_attention_backward(ctx, &f.params, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t,
                               &f.a.dout.t, &f.a.lse.t, &f.a.dq.t, &f.a.dk.t, &f.a.dv.t);
    CHECK(s == MFA_OK, "valid backward failed: %s", mfa_last_error());
    s = mfa_attention_forward(ctx, NULL, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t, NULL);
    CHECK(s == MFA_OK, "forward with default params and no lse failed: %s", mfa_last_error());
    fixture_free(&f);
}

static void test_forward_arguments(void) {
    const mfa_status INVALID = MFA_ERROR_INVALID_ARGUMENT;
    {
        fixture f = fixture_make();
        poison(&f.a.out);
        mfa_status s =
            mfa_attention_forward(NULL, NULL, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t, NULL);
        expect_error("null context", s, INVALID, "ctx");
        CHECK(untouched(&f.a.out), "null context: out written");
        fixture_free(&f);
    }
    {
        fixture f = fixture_make();
        run_forward("null q", &f, INVALID, "q is NULL", NULL, &f.a.k.t, &f.a.v.t, &f.a.out.t, NULL);
        run_forward("null k", &f, INVALID, "k is NULL", &f.a.q.t, NULL, &f.a.v.t, &f.a.out.t, NULL);
        run_forward("null v", &f, INVALID, "v is NULL", &f.a.q.t, &f.a.k.t, NULL, &f.a.out.t, NULL);
        run_forward("null out", &f, INVALID, "out is NULL", &f.a.q.t, &f.a.k.t, &f.a.v.t, NULL,
                    &f.a.lse.t);
        fixture_free(&f);
    }
    FORWARD_CASE("null data", INVALID, "q.data is NULL", f.a.q.t.data = NULL);
    FORWARD_CASE("unknown dtype", INVALID, "not an mfa_dtype", f.a.q.t.dtype = (mfa_dtype)7);
    FORWARD_CASE("k dtype differs", INVALID, "k.dtype must be f32", f.a.k.t.dtype = MFA_DTYPE_F16);
    FORWARD_CASE("v dtype differs", INVALID, "v.dtype must be f32", f.a.v.t.dtype = MFA_DTYPE_BF16);
    FORWARD_CASE("out dtype differs", INVALID, "out.dtype must be f32",
                 f.a.out.t.dtype = MFA_DTYPE_F16);
    FORWARD_CASE("lse not f32", INVALID, "lse.dtype must be f32", f.a.lse.t.dtype = MFA_DTYPE_F16);
    FORWARD_CASE("empty sequence", INVALID, "q.shape[2] (seq) must be >= 1, got 0",
                 f.a.q.t.shape[2] = 0);
    FORWARD_CASE("negative dim", INVALID, "k.shape[3] (head dim) must be >= 1, got -3",
                 f.a.k.t.shape[3] = -3);
    FORWARD_CASE("batch mismatch", INVALID, "k.shape[0] (batch) must equal q.shape[0] = 2, got 1",
                 f.a.k.t.shape[0] = 1);
    FORWARD_CASE("head dim mismatch", INVALID, "k.shape[3] (head dim) must equal q.shape[3] = 8",
                 f.a.k.t.shape[3] = 4);
    FORWARD_CASE("v heads mismatch", INVALID, "v.shape[1] (heads) must equal k.shape[1] = 2",
                 f.a.v.t.shape[1] = 1);
    FORWARD_CASE("v seq mismatch", INVALID, "v.shape[2] (seq) must equal k.shape[2] = 7",
                 f.a.v.t.shape[2] = 6);
    FORWARD_CASE("heads not divisible", INVALID, "must be a multiple of k.shape[1]",
                 f.a.q.t.shape[1] = 3;
                 f.a.out.t.shape[1] = 3; f.a.lse.t.shape[1] = 3);
    FORWARD_CASE("out value dim", INVALID, "out.shape[3] (head dim) must equal v.shape[3] = 6",
                 f.a.out.t.shape[3] = 8);
    FORWARD_CASE("out seq", INVALID, "out.shape[2] (seq) must equal q.shape[2] = 5",
                 f.a.out.t.shape[2] = 7);
    FORWARD_CASE("lse last dim", INVALID, "lse.shape[3] must be 1, got 2", f.a.lse.t.shape[3] = 2);
    FORWARD_CASE("lse heads", INVALID, "lse.shape[1] (heads) must equal q.shape[1] = 4",
                 f.a.lse.t.shape[1] = 2);
    FORWARD_CASE("infinite scale", INVALID, "params.scale must be finite",
                 f.params.scale = INFINITY);
    FORWARD_CASE("nan scale", INVALID, "params.scale must be finite", f.params.scale = NAN);
    FORWARD_CASE("params struct_size", INVALID, "params.struct_size",
                 f.params.struct_size = sizeof f.params + 8);
    FORWARD_CASE("causal flag", INVALID, "params.causal must be 0 or 1", f.params.causal = 2);
    FORWARD_CASE("alignment", INVALID, "not an mfa_alignment",
                 f.params.alignment = (mfa_alignment)5);
    FORWARD_CASE("window left", INVALID, "window_left and window_right", f.params.window_left = -2);
    FORWARD_CASE("window right", INVALID, "window_left and window_right",
                 f.params.window_right = -7);
    FORWARD_CASE("output broadcast stride", INVALID, "makes elements overlap",
                 f.a.out.t.strides[2] = 0);
    FORWARD_CASE("output self-overlap", INVALID, "makes elements overlap",
                 f.a.out.t.strides[1] = 3);
    FORWARD_CASE("out aliases q", INVALID, "out overlaps q", f.a.out.t.data = f.a.q.t.data);
    FORWARD_CASE("lse aliases out", INVALID, "overlaps",
                 f.a.lse.t.data = (char*)f.a.out.t.data + 4);
    FORWARD_CASE("element count overflow", MFA_ERROR_SIZE_OVERFLOW, "overflow 64 bits",
                 f.a.q.t.shape[0] = (int64_t)1 << 40;
                 f.a.q.t.strides[0] = (int64_t)1 << 40);
    FORWARD_CASE("byte count overflow", MFA_ERROR_SIZE_OVERFLOW, "address space",
                 f.a.k.t.strides[0] = INT64_MAX / 2);
    FORWARD_CASE("negative address", MFA_ERROR_SIZE_OVERFLOW, "address space",
                 f.a.k.t.strides[0] = -(INT64_MAX / 4));
    FORWARD_CASE("misaligned data", INVALID, "not aligned", f.a.v.t.data = (char*)f.a.v.t.data + 1);
    FORWARD_CASE("head dim too large", MFA_ERROR_UNSUPPORTED, "exceeds the cpu backend's maximum",
                 f.a.q.t.shape[3] = 1 << 20;
                 f.a.k.t.shape[3] = 1 << 20; f.a.q.t.strides[3] = 0; f.a.k.t.strides[3] = 0);
}

static void test_backward_arguments(void) {
    const mfa_status INVALID = MFA_ERROR_INVALID_ARGUMENT;
    {
        fixture f = fixture_make();
        poison(&f.a.dq);
        mfa_status s = mfa_attention_backward(ctx, NULL, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t,
                                              &f.a.dout.t, NULL, &f.a.dq.t, &f.a.dk.t, &f.a.dv.t);
        expect_error("backward without lse", s, INVALID, "lse is NULL");
        CHECK(untouched(&f.a.dq), "backward without lse: dq written");
        fixture_free(&f);
    }
    BACKWARD_CASE("dout shape", INVALID, "dout.shape[3] (head dim) must equal v.shape[3] = 6",
                  f.a.dout.t.shape[3] = 5);
    BACKWARD_CASE("dq shape", INVALID, "dq.shape[2] (seq) must equal q.shape[2] = 5",
                  f.a.dq.t.shape[2] = 4);
    BACKWARD_CASE("dk dtype", INVALID, "dk.dtype must be f32", f.a.dk.t.dtype = MFA_DTYPE_F16);
    BACKWARD_CASE("dv heads", INVALID, "dv.shape[1] (heads) must equal v.shape[1] = 2",
                  f.a.dv.t.shape[1] = 4);
    BACKWARD_CASE("dv aliases dk", INVALID, "overlaps", f.a.dv.t.data = f.a.dk.t.data);
    BACKWARD_CASE("dq aliases dout", INVALID, "dq overlaps dout", f.a.dq.t.data = f.a.dout.t.data);
    BACKWARD_CASE("null dk", INVALID, "dk.data is NULL", f.a.dk.t.data = NULL);
    BACKWARD_CASE("dk broadcast", INVALID, "makes elements overlap", f.a.dk.t.strides[0] = 0);
}

static void test_context_arguments(void) {
    mfa_context* c = (mfa_context*)0x1;
    expect_error("create without out", mfa_context_create(MFA_BACKEND_CPU, NULL, NULL),
                 MFA_ERROR_INVALID_ARGUMENT, "out is NULL");
    expect_error("unknown backend", mfa_context_create((mfa_backend)42, NULL, &c),
                 MFA_ERROR_INVALID_ARGUMENT, "not an mfa_backend");
    CHECK(c == NULL, "failed create must set *out to NULL");

    mfa_context_options options;
    mfa_context_options_init(&options);
    options.struct_size = 3;
    expect_error("options struct_size", mfa_context_create(MFA_BACKEND_CPU, &options, &c),
                 MFA_ERROR_INVALID_ARGUMENT, "options.struct_size");
    mfa_context_options_init(&options);
    options.num_threads = -1;
    expect_error("negative threads", mfa_context_create(MFA_BACKEND_CPU, &options, &c),
                 MFA_ERROR_INVALID_ARGUMENT, "options.num_threads");
    mfa_context_options_init(&options);
    options.gpu_family = (mfa_gpu_family)5;
    expect_error("unknown family", mfa_context_create(MFA_BACKEND_METAL_SIM, &options, &c),
                 MFA_ERROR_INVALID_ARGUMENT, "not an mfa_gpu_family");
    mfa_context_options_init(&options);
    options.gpu_family = MFA_GPU_FAMILY_APPLE7;
    expect_error("family on cpu", mfa_context_create(MFA_BACKEND_CPU, &options, &c),
                 MFA_ERROR_INVALID_ARGUMENT, "metal-sim backend only");
    mfa_context_options_init(&options);
    options.sim_schedule_seed = 7;
    expect_error("seed on cpu", mfa_context_create(MFA_BACKEND_CPU, &options, &c),
                 MFA_ERROR_INVALID_ARGUMENT, "metal-sim backend only");

    if (!mfa_backend_available(MFA_BACKEND_METAL)) {
        expect_error("metal unavailable", mfa_context_create(MFA_BACKEND_METAL, NULL, &c),
                     MFA_ERROR_BACKEND_UNAVAILABLE, "metal");
        CHECK(c == NULL, "failed create must set *out to NULL");
    }
    expect_error("caps of NULL", mfa_context_capabilities(NULL, NULL), MFA_ERROR_INVALID_ARGUMENT,
                 "ctx is NULL");
    expect_error("NULL caps", mfa_context_capabilities(ctx, NULL), MFA_ERROR_INVALID_ARGUMENT,
                 "caps is NULL");
    double seconds = -1;
    expect_error("gpu time on cpu", mfa_context_last_gpu_time(ctx, &seconds), MFA_ERROR_UNSUPPORTED,
                 "metal backend only");
    CHECK(seconds == -1, "gpu time written on failure");
    expect_error("gpu time of NULL", mfa_context_last_gpu_time(NULL, &seconds),
                 MFA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    mfa_capabilities caps;
    caps.struct_size = 0;
    expect_error("caps struct_size", mfa_context_capabilities(ctx, &caps),
                 MFA_ERROR_INVALID_ARGUMENT, "struct_size");
}

/* Errors are per thread: a failure on one thread leaves another thread's message alone. */
static void* fail_on_other_thread(void* arg) {
    (void)arg;
    mfa_context_create((mfa_backend)99, NULL, NULL);
    return (void*)(strstr(mfa_last_error(), "out is NULL") != NULL ? (void*)1 : NULL);
}

static void test_errors_are_per_thread(void) {
    mfa_context* c;
    mfa_context_create((mfa_backend)42, NULL, &c);
    pthread_t thread;
    void* other_ok = NULL;
    pthread_create(&thread, NULL, fail_on_other_thread, NULL);
    pthread_join(thread, &other_ok);
    CHECK(other_ok != NULL, "the other thread did not see its own error");
    CHECK(strstr(mfa_last_error(), "not an mfa_backend") != NULL,
          "this thread's message was replaced: %s", mfa_last_error());
}

int main(void) {
    mfa_status s = mfa_context_create(MFA_BACKEND_CPU, NULL, &ctx);
    if (s != MFA_OK) {
        fprintf(stderr, "cannot create a cpu context: %s\n", mfa_last_error());
        return 1;
    }
    test_valid_calls_succeed();
    test_forward_arguments();
    test_backward_arguments();
    test_context_arguments();
    test_errors_are_per_thread();
    mfa_context_destroy(ctx);
    mfa_context_destroy(NULL);
    return test_finish("test_validation");
}
