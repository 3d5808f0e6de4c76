/* cpu and metal-sim side by side under 16 threads for a bounded time, every result compared bit
 * for bit with what the same context computed with one caller at a time.
 *
 * Two shared contexts (cpu with 4 workers, metal-sim with 2) are first run one call at a time
 * over a set of problems (dtypes, GQA, masks, windows, layouts; forward and backward): those
 * baselines are checked against the float64 reference, so that "the same" also means "right".
 * Then THREADS threads call both contexts at random for SECONDS seconds, each call into fresh
 * buffers, and every output byte must equal its baseline: any race, stale scratch or
 * cross-talk between concurrent calls or between the two backends shows up as a difference,
 * however small.
 *
 * Usage: stress_bitwise [SECONDS]  (default 5). */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "test_reference.h"

enum { THREADS = 16, CONTEXTS = 2, DEFAULT_SECONDS = 5 };

/* Scale 0: the library's default. */
static const test_problem problems[] = {
    {"f32 plain", MFA_DTYPE_F32, 1, 2, 2, 17, 23, 16, 16, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD},
    {"f16 gqa causal bshd", MFA_DTYPE_F16, 2, 4, 2, 21, 21, 8, 12, 1, MFA_ALIGN_BOTTOM_RIGHT, -1,
     -1, TEST_BSHD},
    {"bf16 window top-left", MFA_DTYPE_BF16, 1, 3, 1, 19, 33, 24, 8, 0, MFA_ALIGN_TOP_LEFT, 4, 2,
     TEST_BHSD},
    {"f32 masked rows reversed", MFA_DTYPE_F32, 1, 2, 1, 12, 5, 8, 8, 1, MFA_ALIGN_BOTTOM_RIGHT, -1,
     -1, TEST_REVERSED},
    {"f16 decode", MFA_DTYPE_F16, 1, 6, 2, 1, 40, 32, 32, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD},
    /* Keys split over the cpu's tasks (two ranges of 512), merged by the last range to
     * finish: the same bits whichever task that is. */
    {"bf16 decode split keys", MFA_DTYPE_BF16, 1, 4, 1, 1, 1024, 32, 32, 0, MFA_ALIGN_BOTTOM_RIGHT,
     -1, -1, TEST_BHSD},
};
#define PROBLEM_COUNT ((int)(sizeof problems / sizeof problems[0]))

/* Decoding over keys enough to split runs forward only: the split is the forward's alone, and
 * the simulator's backward of one query row over a thousand keys takes seconds a call. */
static int forward_only(const test_problem* p) { return p->nq == 1 && p->nk >= 1024; }

typedef struct outputs {
    test_tensor out, lse, dq, dk, dv;
} outputs;

typedef struct prepared {
    const test_problem* p;
    mfa_attention_params params;
    test_tensor q, k, v, out_in, lse_in, dout; /* inputs; out_in, lse_in: the backward's */
    outputs baseline[CONTEXTS];
} prepared;

static prepared prepared_problems[PROBLEM_COUNT];
static mfa_context* contexts[CONTEXTS];
static const char* context_names[CONTEXTS] = {"cpu", "metal-sim"};
static atomic_long compared_calls;
static struct timespec deadline;

static outputs outputs_make(const test_problem* p) {
    outputs o;
    o.out = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->dv, p->layout);
    o.lse = test_tensor_make(MFA_DTYPE_F32, p->b, p->hq, p->nq, 1, TEST_BHSD);
    o.dq = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->d, p->layout);
    o.dk = test_tensor_make(p->dtype, p->b, p->hkv, p->nk, p->d, p->layout);
    o.dv = test_tensor_make(p->dtype, p->b, p->hkv, p->nk, p->dv, p->layout);
    test_tensor* all[] = {&o.out, &o.lse, &o.dq, &o.dk, &o.dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_fill_nan(all[i]);
    return o;
}

static void outputs_free(outputs* o) {
    test_tensor* all[] = {&o->out, &o->lse, &o->dq, &o->dk, &o->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
}

static mfa_status run_forward(mfa_context* ctx, const prepared* x, outputs* o) {
    return mfa_attention_forward(ctx, &x->params, &x->q.t, &x->k.t, &x->v.t, &o->out.t, &o->lse.t);
}

static mfa_status run_backward(mfa_context* ctx, const prepared* x, outputs* o) {
    return mfa_attention_backward(ctx, &x->params, &x->q.t, &x->k.t, &x->v.t, &x->out_in.t,
                                  &x->dout.t, &x->lse_in.t, &o->dq.t, &o->dk.t, &o->dv.t);
}

/* Inputs, the reference, and each context's baseline from one caller at a time. */
static void prepare(prepared* x, const test_problem* p) {
    x->p = p;
    x->params = test_params(p->causal, p->alignment, p->left, p->right, p->scale);
    x->q = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->d, p->layout);
    x->k = test_tensor_make(p->dtype, p->b, p->hkv, p->nk, p->d, p->layout);
    x->v = test_tensor_make(p->dtype, p->b, p->hkv, p->nk, p->dv, p->layout);
    x->dout = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->dv, p->layout);
    x->out_in = test_tensor_make(p->dtype, p->b, p->hq, p->nq, p->dv, p->layout);
    x->lse_in = test_tensor_make(MFA_DTYPE_F32, p->b, p->hq, p->nq, 1, TEST_BHSD);
    test_fill_random(&x->q);
    test_fill_random(&x->k);
    test_fill_random(&x->v);
    test_fill_random(&x->dout);
    const ref_problem rp = ref_problem_of(&x->q.t, &x->k.t, &x->v.t, &x->params);
    ref_result f = ref_forward(&rp, &x->q.t, &x->k.t, &x->v.t);
    ref_store_forward(&f, &x->out_in.t, &x->lse_in.t);
    ref_result g =
        ref_backward(&rp, &x->q.t, &x->k.t, &x->v.t, &x->out_in.t, &x->dout.t, &x->lse_in.t, NULL);
    const int64_t n_forward = p->nk + p->d, n_backward = p->d + p->dv + p->nk + p->nq * p->hq;
    for (int c = 0; c < CONTEXTS; ++c) {
        outputs* o = &x->baseline[c];
        *o = outputs_make(p);
        if (!contexts[c]) continue;
        CHECK(run_forward(contexts[c], x, o) == MFA_OK, "%s %s forward: %s", context_names[c],
              p->name, mfa_last_error());
        CHECK(forward_only(p) || run_backward(contexts[c], x, o) == MFA_OK, "%s %s backward: %s",
              context_names[c], p->name, mfa_last_error());
        const struct {
            const char* name;
            const test_tensor* got;
            mfa_dtype dtype;
            const double *want, *magnitude;
            int64_t n;
            double max_score;
        } checks[] = {
            {"out", &o->out, p->dtype, f.out, f.out_mag, n_forward, f.max_score},
            {"lse", &o->lse, MFA_DTYPE_F32, f.lse, f.lse_mag, n_forward, f.max_score},
            {"dq", &o->dq, p->dtype, g.dq, g.dq_mag, n_backward, g.max_score},
            {"dk", &o->dk, p->dtype, g.dk, g.dk_mag, n_backward, g.max_score},
            {"dv", &o->dv, p->dtype, g.dv, g.dv_mag, n_backward, g.max_score},
        };
        char why[256];
        const size_t checked = forward_only(p) ? 2 : sizeof checks / sizeof checks[0];
        for (size_t i = 0; i < checked; ++i)
            CHECK(ref_compare(&checks[i].got->t, checks[i].dtype, checks[i].want,
                              checks[i].magnitude, checks[i].n, checks[i].max_score, why,
                              sizeof why),
                  "%s %s baseline %s: %s", context_names[c], p->name, checks[i].name, why);
    }
    ref_free(&f);
    ref_free(&g);
}

static void release(prepared* x) {
    test_tensor* all[] = {&x->q, &x->k, &x->v, &x->out_in, &x->lse_in, &x->dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
    for (int c = 0; c < CONTEXTS; ++c) outputs_free(&x->baseline[c]);
}

static int same_bytes(const test_tensor* a, const test_tensor* b) {
    return a->bytes == b->bytes && memcmp(a->storage, b->storage, a->bytes) == 0;
}

static int before_deadline(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec < deadline.tv_sec ||
           (now.tv_sec == deadline.tv_sec && now.tv_nsec < deadline.tv_nsec);
}

static void* work(void* arg) {
    uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)((intptr_t)arg + 1);
    do {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const int c = (int)(state % CONTEXTS);
        if (!contexts[c]) continue;
        const prepared* x = &prepared_problems[(state >> 8) % PROBLEM_COUNT];
        const int backward = !forward_only(x->p) && (state >> 16) % 2;
        outputs o = outputs_make(x->p);
        const mfa_status s =
            backward ? run_backward(contexts[c], x, &o) : run_forward(contexts[c], x, &o);
        const outputs* want = &x->baseline[c];
        const char* direction = backward ? "backward" : "forward";
        CHECK(s == MFA_OK, "%s %s %s failed: %s", context_names[c], x->p->name, direction,
              mfa_last_error());
        if (s == MFA_OK)
            CHECK(backward ? same_bytes(&o.dq, &want->dq) && same_bytes(&o.dk, &want->dk) &&
                                 same_bytes(&o.dv, &want->dv)
                           : same_bytes(&o.out, &want->out) && same_bytes(&o.lse, &want->lse),
                  "%s %s %s: a result differs from the one-caller run", context_names[c],
                  x->p->name, direction);
        atomic_fetch_add(&compared_calls, 1);
        outputs_free(&o);
    } while (before_deadline());
    return NULL;
}

int main(int argc, char** argv) {
    const int seconds = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : DEFAULT_SECONDS;
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = 4;
    contexts[0] = test_context(MFA_BACKEND_CPU, &options, "cpu");
    if (mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        options.num_threads = 2;
        contexts[1] = test_context(MFA_BACKEND_METAL_SIM, &options, "metal-sim");
    } else {
        printf("stress_bitwise: metal-sim not built, cpu only\n");
    }
    for (int i = 0; i < PROBLEM_COUNT; ++i) prepare(&prepared_problems[i], &problems[i]);

    if (test_failures == 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += seconds;
        pthread_t threads[THREADS];
        for (int t = 0; t < THREADS; ++t)
            CHECK(pthread_create(&threads[t], NULL, work, (void*)(intptr_t)t) == 0,
                  "cannot start thread %d", t);
        for (int t = 0; t < THREADS; ++t) pthread_join(threads[t], NULL);
    }
    printf("stress_bitwise: %d threads for %d s, %ld calls compared bit for bit\n", THREADS,
           seconds, (long)atomic_load(&compared_calls));
    for (int i = 0; i < PROBLEM_COUNT; ++i) release(&prepared_problems[i]);
    for (int c = 0; c < CONTEXTS; ++c) mfa_context_destroy(contexts[c]);
    return test_finish("stress_bitwise");
}
