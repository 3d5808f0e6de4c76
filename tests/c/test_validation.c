/* Every validation path of the C API: each row of the bad-input table (tests/support/
 * bad_inputs.h) gets its status and a message naming the problem, with no output byte written;
 * valid calls succeed; an unavailable backend is an error; errors are per thread. */
#include <pthread.h>

#include "bad_inputs.h"

static void test_valid_calls_succeed(void) {
    bad_input_fixture f = bad_input_fixture_make();
    mfa_context* ctx = bad_input_cpu_context;
    mfa_status s =
        mfa_attention_forward(ctx, &f.params, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t, &f.a.lse.t);
    CHECK(s == MFA_OK, "valid forward failed: %s", mfa_last_error());
    s = mfa_attention_backward(ctx, &f.params, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t,
                               &f.a.dout.t, &f.a.lse.t, &f.a.dq.t, &f.a.dk.t, &f.a.dv.t);
    CHECK(s == MFA_OK, "valid backward failed: %s", mfa_last_error());
    s = mfa_attention_forward(ctx, NULL, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t, NULL);
    CHECK(s == MFA_OK, "forward with default params and no lse failed: %s", mfa_last_error());
    test_attention_free(&f.a);
}

/* Where the Metal backend is not built (or there is no GPU), asking for it is an error, not a
 * fallback. */
static void test_unavailable_backend(void) {
    if (mfa_backend_available(MFA_BACKEND_METAL)) return;
    mfa_context* c = (mfa_context*)&c;
    CHECK_ERROR("metal unavailable", mfa_context_create(MFA_BACKEND_METAL, NULL, &c),
                MFA_ERROR_BACKEND_UNAVAILABLE, "metal");
    CHECK(c == NULL, "failed create must set *out to NULL");
}

/* Errors are per thread: a failure on one thread leaves another thread's message alone. */
static void* fail_on_other_thread(void* arg) {
    (void)arg;
    CHECK_ERROR("the other thread's error", mfa_context_create((mfa_backend)99, NULL, NULL),
                MFA_ERROR_INVALID_ARGUMENT, "out is NULL");
    return NULL;
}

static void test_errors_are_per_thread(void) {
    mfa_context* c;
    const mfa_status mine = mfa_context_create((mfa_backend)42, NULL, &c);
    pthread_t thread;
    const int started = pthread_create(&thread, NULL, fail_on_other_thread, NULL) == 0;
    CHECK(started, "cannot start a second thread");
    if (started) pthread_join(thread, NULL);
    CHECK_ERROR("this thread's error, after the other thread's", mine, MFA_ERROR_INVALID_ARGUMENT,
                "not an mfa_backend");
}

int main(void) {
    bad_input_cpu_context = test_context(MFA_BACKEND_CPU, NULL, "cpu");
    if (!bad_input_cpu_context) return test_finish("test_validation");
    test_valid_calls_succeed();
    for (int i = 0; i < BAD_INPUT_COUNT; ++i) bad_input_run(i, bad_input_cpu_context);
    /* The rules of the arguments alone, on the simulator's context too. */
    int on_sim = 0;
    if (mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        mfa_context* sim = test_context(MFA_BACKEND_METAL_SIM, NULL, "metal-sim");
        for (int i = 0; sim && i < BAD_INPUT_COUNT; ++i)
            if (bad_input_any_backend(&bad_inputs[i])) bad_input_run(i, sim), ++on_sim;
        mfa_context_destroy(sim);
    }
    test_unavailable_backend();
    test_errors_are_per_thread();
    mfa_context_destroy(bad_input_cpu_context);
    mfa_context_destroy(NULL);
    printf("test_validation: %d bad inputs on cpu, %d of them on metal-sim\n", BAD_INPUT_COUNT,
           on_sim);
    return test_finish("test_validation");
}
