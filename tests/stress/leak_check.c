/* Memory held by libmfa must not grow with use: contexts created and destroyed, forward and
 * backward calls, failed calls, on every available backend, round after round.
 *
 * After a few warm-up rounds (first-use allocations: thread-local error buffers, kernel
 * selection) the bytes the allocator has handed out and not got back are measured; ROUNDS
 * further rounds may not add more than a few small allocations' worth. Under AddressSanitizer
 * the count comes from the sanitizer's allocator, covering every thread, and LeakSanitizer
 * also checks at exit that nothing became unreachable: that is the authoritative run
 * (scripts/hardening). Otherwise the count is glibc's mallinfo2, which sees the main arena
 * only: allocations made by the calling thread, not by worker threads. */
#include <malloc.h>

#include "sanitizer.h"
#include "test_util.h"

#ifdef TEST_ASAN
#include <sanitizer/allocator_interface.h>
static size_t allocated_bytes(void) { return __sanitizer_get_current_allocated_bytes(); }
#else
static size_t allocated_bytes(void) { return mallinfo2().uordblks; }
#endif

enum { WARMUP = 3, ROUNDS = 20 };
/* Slack for allocator bookkeeping that is not the library's: a leak of more than 51 bytes a
 * round (a context, a workspace, a message buffer) exceeds it over ROUNDS rounds. */
#define ALLOWED_GROWTH 1024

static void one_round(mfa_backend backend) {
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = 2;
    mfa_context* ctx = test_context(backend, &options, mfa_backend_name(backend));
    if (!ctx) return;
    test_attention a = test_attention_make(MFA_DTYPE_F16, 1, 2, 1, 9, 13, 16, 8, TEST_BHSD);
    const mfa_attention_params params = test_params(1, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 0);
    CHECK(mfa_attention_forward(ctx, &params, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.lse.t) == MFA_OK,
          "%s", mfa_last_error());
    CHECK(mfa_attention_backward(ctx, &params, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.dout.t,
                                 &a.lse.t, &a.dq.t, &a.dk.t, &a.dv.t) == MFA_OK,
          "%s", mfa_last_error());
    /* Failed calls must not leak either. */
    CHECK(mfa_attention_forward(ctx, &params, &a.q.t, &a.k.t, &a.v.t, &a.q.t, NULL) != MFA_OK,
          "out aliasing q was accepted");
    CHECK(mfa_attention_backward(ctx, &params, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.dout.t, NULL,
                                 &a.dq.t, &a.dk.t, &a.dv.t) != MFA_OK,
          "backward without lse was accepted");
    mfa_capabilities caps;
    caps.struct_size = sizeof caps;
    CHECK(mfa_context_capabilities(ctx, &caps) == MFA_OK, "%s", mfa_last_error());
    mfa_context_destroy(ctx);
    test_attention_free(&a);
    void* page = mfa_alloc(12345);
    CHECK(page != NULL, "mfa_alloc: %s", mfa_last_error());
    mfa_free(page);
}

int main(void) {
    const mfa_backend backends[] = {MFA_BACKEND_CPU, MFA_BACKEND_METAL_SIM, MFA_BACKEND_METAL};
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; ++b) {
        if (!mfa_backend_available(backends[b])) continue;
        for (int i = 0; i < WARMUP; ++i) one_round(backends[b]);
        const size_t before = allocated_bytes();
        for (int i = 0; i < ROUNDS; ++i) one_round(backends[b]);
        const size_t after = allocated_bytes();
        const long long growth = (long long)after - (long long)before;
        printf("leak_check: %s: %d rounds, %lld bytes of growth\n", mfa_backend_name(backends[b]),
               ROUNDS, growth);
        CHECK(growth <= ALLOWED_GROWTH, "%s: held memory grew by %lld bytes over %d rounds",
              mfa_backend_name(backends[b]), growth, ROUNDS);
    }
    return test_finish("leak_check");
}
