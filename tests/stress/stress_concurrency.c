/* Concurrency stress: many threads calling libmfa at once, every result checked against the
 * float64 reference.
 *
 *   shared context   THREADS threads share one context of each backend and run a random mix of
 *                    forward and backward calls over problems of different shapes, dtypes, masks
 *                    and layouts, all reading the same input buffers;
 *   many contexts    every thread creates its own contexts (and destroys and re-creates them
 *                    as it goes) while the others compute;
 *   per-thread errors  each thread also makes calls that must fail and checks that the message
 *                    it reads names its own mistake, never a neighbour's.
 *
 * Usage: stress_concurrency [ITERATIONS_PER_THREAD]  (default 24; the ThreadSanitizer run in
 * scripts/hardening uses fewer). The metal-sim backend, when built, gets the small problems. */
#include <pthread.h>
#include <stdatomic.h>

#include "test_reference.h"

enum { THREADS = 8 };

/* Scale 0: the library's default. */
static const test_problem problems[] = {
    {"f32 plain", MFA_DTYPE_F32, 1, 2, 2, 33, 47, 16, 16, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD},
    {"f32 gqa causal bshd", MFA_DTYPE_F32, 2, 4, 2, 70, 70, 32, 24, 1, MFA_ALIGN_BOTTOM_RIGHT, -1,
     -1, TEST_BSHD},
    {"f16 window top-left", MFA_DTYPE_F16, 1, 3, 1, 40, 90, 24, 40, 0, MFA_ALIGN_TOP_LEFT, 7, 3,
     TEST_BHSD},
    {"bf16 masked rows", MFA_DTYPE_BF16, 1, 2, 1, 20, 6, 8, 8, 1, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD},
    {"f32 single key", MFA_DTYPE_F32, 3, 1, 1, 9, 1, 5, 3, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BSHD},
    {"f16 long", MFA_DTYPE_F16, 1, 1, 1, 130, 200, 64, 64, 1, MFA_ALIGN_TOP_LEFT, -1, -1,
     TEST_BHSD},
};
#define PROBLEM_COUNT ((int)(sizeof problems / sizeof problems[0]))

/* Cheap enough for the simulator: at most 5,000 scores (the plain, masked-rows and single-key
 * problems; the others have 10,800 and more). */
static int small(const test_problem* p) { return p->b * p->hq * p->nq * p->nk <= 5000; }

/* Inputs shared by every thread (read-only), and what each call must produce. */
typedef struct prepared {
    const test_problem* p;
    ref_problem ref;
    test_tensor q, k, v, out_in, lse_in, dout; /* out_in, lse_in: the backward's given forward */
    ref_result forward, backward;
} prepared;

static prepared prepared_problems[PROBLEM_COUNT];
static atomic_long checked_calls;

static mfa_attention_params params_of(const test_problem* p) {
    return test_params(p->causal, p->alignment, p->left, p->right, p->scale);
}

static void prepare(prepared* x, const test_problem* p) {
    x->p = p;
    x->q = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->d, p->layout);
    x->k = test_tensor_make(p->dtype, p->b, p->hkv, p->nk, p->d, p->layout);
    x->v = test_tensor_make(p->dtype, p->b, p->hkv, p->nk, p->dv, p->layout);
    x->dout = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->dv, p->layout);
    x->out_in = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->dv, p->layout);
    x->lse_in = test_tensor_make(MFA_DTYPE_F32, p->b, p->hq, p->nq, 1, 0);
    test_fill_random(&x->q);
    test_fill_random(&x->k);
    test_fill_random(&x->v);
    test_fill_random(&x->dout);
    const mfa_attention_params params = params_of(p);
    x->ref = ref_problem_of(&x->q.t, &x->k.t, &x->v.t, &params);
    x->forward = ref_forward(&x->ref, &x->q.t, &x->k.t, &x->v.t);
    ref_store_forward(&x->forward, &x->out_in.t, &x->lse_in.t);
    x->backward = ref_backward(&x->ref, &x->q.t, &x->k.t, &x->v.t, &x->out_in.t, &x->dout.t,
                               &x->lse_in.t, NULL);
}

static void release(prepared* x) {
    test_tensor* all[] = {&x->q, &x->k, &x->v, &x->out_in, &x->lse_in, &x->dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
    ref_free(&x->forward);
    ref_free(&x->backward);
}

static void expect_match(const char* where, const char* what, const test_tensor* got,
                         mfa_dtype dtype, const double* want, const double* magnitude, int64_t n,
                         double max_score) {
    char why[256] = "";
    CHECK(ref_compare(&got->t, dtype, want, magnitude, n, max_score, why, sizeof why), "%s: %s: %s",
          where, what, why);
}

static void run_forward(mfa_context* ctx, const prepared* x, const char* where) {
    const test_problem* p = x->p;
    test_tensor out = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->dv, p->layout);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, p->b, p->hq, p->nq, 1, 0);
    test_fill_nan(&out); /* every element must be written */
    test_fill_nan(&lse);
    const mfa_attention_params params = params_of(p);
    const mfa_status s =
        mfa_attention_forward(ctx, &params, &x->q.t, &x->k.t, &x->v.t, &out.t, &lse.t);
    CHECK(s == MFA_OK, "%s: forward failed: %s", where, mfa_last_error());
    if (s == MFA_OK) {
        const int64_t n = p->nk + p->d;
        expect_match(where, "out", &out, p->dtype, x->forward.out, x->forward.out_mag, n,
                     x->forward.max_score);
        expect_match(where, "lse", &lse, MFA_DTYPE_F32, x->forward.lse, x->forward.lse_mag, n,
                     x->forward.max_score);
        atomic_fetch_add(&checked_calls, 1);
    }
    test_tensor_free(&out);
    test_tensor_free(&lse);
}

static void run_backward(mfa_context* ctx, const prepared* x, const char* where) {
    const test_problem* p = x->p;
    test_gradients g = test_gradients_make(p->dtype, p->b, p->hq, p->hkv, p->nq, p->nk, p->d, p->dv,
                                           p->layout, p->layout);
    const mfa_attention_params params = params_of(p);
    const mfa_status s =
        mfa_attention_backward(ctx, &params, &x->q.t, &x->k.t, &x->v.t, &x->out_in.t, &x->dout.t,
                               &x->lse_in.t, &g.dq.t, &g.dk.t, &g.dv.t);
    CHECK(s == MFA_OK, "%s: backward failed: %s", where, mfa_last_error());
    if (s == MFA_OK) {
        const int64_t n = p->d + p->dv + p->nk + p->nq * (p->hq / p->hkv);
        const ref_result* r = &x->backward;
        expect_match(where, "dq", &g.dq, p->dtype, r->dq, r->dq_mag, n, r->max_score);
        expect_match(where, "dk", &g.dk, p->dtype, r->dk, r->dk_mag, n, r->max_score);
        expect_match(where, "dv", &g.dv, p->dtype, r->dv, r->dv_mag, n, r->max_score);
        atomic_fetch_add(&checked_calls, 1);
    }
    test_gradients_free(&g);
}

/* A call that must fail with a message naming this thread's own mistake: the dimension it
 * broke is its thread number, so a neighbour's message would name a different value. */
static void run_bad_call(mfa_context* ctx, const prepared* x, int thread, const char* where) {
    mfa_tensor k = x->k.t;
    k.shape[0] = 1000 + thread;
    test_tensor out =
        test_tensor_make(x->p->dtype, x->p->b, x->p->hq, x->p->nq, x->p->dv, x->p->layout);
    const mfa_status s = mfa_attention_forward(ctx, NULL, &x->q.t, &k, &x->v.t, &out.t, NULL);
    char expected[64];
    snprintf(expected, sizeof expected, "got %d", 1000 + thread);
    CHECK_ERROR(where, s, MFA_ERROR_INVALID_ARGUMENT, expected);
    test_tensor_free(&out);
}

typedef struct worker {
    int thread;
    int iterations;
    mfa_backend backend;
    mfa_context* shared; /* NULL: the worker makes its own contexts */
    pthread_t handle;
} worker;

static uint64_t next_random(uint64_t* state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static mfa_context* own_context(mfa_backend backend, int threads) {
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = threads;
    mfa_context* ctx = NULL;
    CHECK(mfa_context_create(backend, &options, &ctx) == MFA_OK, "creating a %s context: %s",
          mfa_backend_name(backend), mfa_last_error());
    return ctx;
}

static void* work(void* arg) {
    worker* w = (worker*)arg;
    uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)(w->thread + 1);
    mfa_context* ctx = w->shared ? w->shared : own_context(w->backend, 1 + w->thread % 2);
    char where[96];
    for (int i = 0; i < w->iterations && ctx; ++i) {
        int pick;
        do pick = (int)(next_random(&state) % PROBLEM_COUNT);
        while (w->backend == MFA_BACKEND_METAL_SIM && !small(&problems[pick]));
        const prepared* x = &prepared_problems[pick];
        snprintf(where, sizeof where, "%s %s context, thread %d, call %d, %s",
                 mfa_backend_name(w->backend), w->shared ? "shared" : "own", w->thread, i,
                 x->p->name);
        switch (next_random(&state) % 5) {
            case 0: run_bad_call(ctx, x, w->thread, where); break;
            case 1:
            case 2: run_forward(ctx, x, where); break;
            default: run_backward(ctx, x, where); break;
        }
        /* Contexts come and go while other threads compute on theirs. */
        if (!w->shared && next_random(&state) % 4 == 0) {
            mfa_context_destroy(ctx);
            ctx = own_context(w->backend, 1 + (int)(next_random(&state) % 3));
        }
    }
    if (!w->shared) mfa_context_destroy(ctx);
    return NULL;
}

static void run_phase(mfa_backend backend, int iterations, int shared) {
    mfa_context* ctx = shared ? own_context(backend, 2) : NULL;
    if (shared && !ctx) return;
    worker workers[THREADS];
    for (int t = 0; t < THREADS; ++t) {
        workers[t] = (worker){t, iterations, backend, ctx, 0};
        CHECK(pthread_create(&workers[t].handle, NULL, work, &workers[t]) == 0,
              "cannot start thread %d", t);
    }
    for (int t = 0; t < THREADS; ++t) pthread_join(workers[t].handle, NULL);
    mfa_context_destroy(ctx);
}

int main(int argc, char** argv) {
    const int iterations = argc > 1 ? atoi(argv[1]) : 24;
    for (int i = 0; i < PROBLEM_COUNT; ++i) prepare(&prepared_problems[i], &problems[i]);
    const mfa_backend backends[] = {MFA_BACKEND_CPU, MFA_BACKEND_METAL_SIM, MFA_BACKEND_METAL};
    int ran = 0;
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; ++b) {
        if (!mfa_backend_available(backends[b])) {
            printf("stress_concurrency: %s not available here, skipped\n",
                   mfa_backend_name(backends[b]));
            continue;
        }
        const int n = backends[b] == MFA_BACKEND_METAL_SIM ? (iterations + 3) / 4 : iterations;
        run_phase(backends[b], n, 1);
        run_phase(backends[b], n, 0);
        ++ran;
    }
    for (int i = 0; i < PROBLEM_COUNT; ++i) release(&prepared_problems[i]);
    printf("stress_concurrency: %d backend(s), %d threads, %ld calls checked against the "
           "reference\n",
           ran, THREADS, (long)atomic_load(&checked_calls));
    CHECK(ran > 0, "no backend ran");
    return test_finish("stress_concurrency");
}
