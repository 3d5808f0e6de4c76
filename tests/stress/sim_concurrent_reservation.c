/* Concurrent backward calls on one metal-sim context with many workers: none may fail for
 * lack of resources, none may write part of its outputs and then fail, and the memory
 * mappings the simulator makes for its fiber stacks must be bounded while the context lives
 * and given back when it is destroyed.
 *
 * CALLERS threads each make CALLS backward calls (3; 1 under a sanitizer) on one context with
 * num_threads = 128, on q [1, 32, 8, 8] and k, v [1, 32, 128, 8] (f32): enough threadgroups
 * that all the callers' workers want their fiber stacks at once (as many mappings live as with
 * 256 keys). Every output lives in a buffer of canary bytes: a guard before and after it and a
 * gap after every element (strided views), so that a byte written outside an element shows,
 * and so does any write at all by a call that fails.
 * A successful call's gradients are checked against the float64 reference.
 *
 * All of that twice (once under a sanitizer), with a new context each round: the mappings counted in /proc/self/maps
 * must fall back to what they were before the first context once each is destroyed, and the
 * second round must not grow the address space (VmSize in /proc/self/status) beyond the first.
 * Then a call for which no fiber stack can be mapped (RLIMIT_AS just above what the process
 * uses): it must fail with MFA_ERROR_OUT_OF_MEMORY and write nothing, and the context must work
 * again once the limit is lifted.
 *
 * Linux only; elsewhere the test exits 77, skipped. Usage: sim_concurrent_reservation [CALLERS]. */
#include <pthread.h>
#include <sys/resource.h>

#include "sanitizer.h"
#include "test_reference.h"

/* Under a sanitizer every simulated call costs 10 to 20 times as much: one call per caller
 * still has all six compete for the context's stacks, and one round still checks that the
 * stacks are given back (the unsanitized run checks that a second round adds nothing). */
#ifdef TEST_SANITIZED
enum { CALLS = 1, ROUNDS = 1 };
#else
enum { CALLS = 3, ROUNDS = 2 };
#endif
enum { DEFAULT_CALLERS = 6, WORKERS = 128 };
enum { B = 1, HQ = 32, HKV = 32, NQ = 8, NK = 128, D = 8 };

#define CANARY      0xC3 /* as f32 bytes: -390.9, nothing a gradient here comes near */
#define GUARD_BYTES 256

/* Mappings the process may still hold once a context is gone, and what a second round of the
 * same work may add to the first's: not the library's, but caches of the C library (glibc
 * keeps up to 40 MiB of exited threads' stacks for reuse; ctest runs the test with one malloc
 * arena, since threads of a loaded round would get new ones) and of a sanitizer's runtime
 * (per-thread allocator caches). The fiber stacks of one context are thousands of mappings. */
#define SLACK_MAPPINGS       256
#define SLACK_ROUND_MAPPINGS 64
#define SLACK_VM_KIB         (64 * 1024)
/* While the context lives: its fiber stacks (two mappings each, stack and guard page) are
 * bounded per context and process-wide; 128 workers, each a threadgroup's worth, would need
 * far more (that is what ran out). */
#define LIVE_MAPPINGS_BOUND 40000

static long count_mappings(void) {
    FILE* f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    long lines = 0;
    for (int c; (c = fgetc(f)) != EOF;) lines += c == '\n';
    fclose(f);
    return lines;
}

static long vm_size_kib(void) {
    FILE* f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* An output view of shape [b, h, s, d] inside a canary-filled buffer: a guard on both sides
 * and one unused element after each element (strides twice the dense ones). */
typedef struct canaried {
    mfa_tensor t;
    unsigned char* buffer;
    size_t bytes;
} canaried;

static canaried canaried_make(int64_t b, int64_t h, int64_t s, int64_t d) {
    canaried c;
    const int64_t elements = b * h * s * d;
    c.bytes = GUARD_BYTES + (size_t)(2 * elements) * sizeof(float) + GUARD_BYTES;
    c.buffer = malloc(c.bytes);
    memset(c.buffer, CANARY, c.bytes);
    c.t.data = c.buffer + GUARD_BYTES;
    c.t.dtype = MFA_DTYPE_F32;
    const int64_t shape[4] = {b, h, s, d};
    memcpy(c.t.shape, shape, sizeof shape);
    c.t.strides[3] = 2;
    c.t.strides[2] = 2 * d;
    c.t.strides[1] = 2 * d * s;
    c.t.strides[0] = 2 * d * s * h;
    return c;
}

/* Bytes that are not part of an element (or, with `all`, any byte) that are no longer the
 * canary. */
static int64_t changed_bytes(const canaried* c, int all) {
    int64_t changed = 0;
    for (size_t i = 0; i < c->bytes; ++i) {
        const int inside = i >= GUARD_BYTES && i < c->bytes - GUARD_BYTES;
        const int element = inside && (i - GUARD_BYTES) / sizeof(float) % 2 == 0;
        if ((all || !element) && c->buffer[i] != CANARY) ++changed;
    }
    return changed;
}

typedef struct shared_inputs {
    mfa_context* ctx;
    test_tensor q, k, v, out, lse, dout;
    ref_result backward;
} shared_inputs;

/* One backward into canaried outputs: a failed call must have written nothing, a successful
 * one exactly its elements, correctly. Returns the status. */
static mfa_status checked_backward(const shared_inputs* in) {
    canaried dq = canaried_make(B, HQ, NQ, D);
    canaried dk = canaried_make(B, HKV, NK, D);
    canaried dv = canaried_make(B, HKV, NK, D);
    const mfa_status s =
        mfa_attention_backward(in->ctx, NULL, &in->q.t, &in->k.t, &in->v.t, &in->out.t, &in->dout.t,
                               &in->lse.t, &dq.t, &dk.t, &dv.t);
    const canaried* outputs[] = {&dq, &dk, &dv};
    const char* names[] = {"dq", "dk", "dv"};
    for (int o = 0; o < 3; ++o) {
        const int64_t changed = changed_bytes(outputs[o], s != MFA_OK);
        CHECK(changed == 0, "a %s call changed %lld canary bytes of %s%s",
              s == MFA_OK ? "successful" : "failed", (long long)changed, names[o],
              s == MFA_OK ? " outside its elements" : ": a partial write");
    }
    if (s == MFA_OK) {
        const ref_result* r = &in->backward;
        const int64_t n = D + D + NK + NQ;
        const double* want[] = {r->dq, r->dk, r->dv};
        const double* magnitude[] = {r->dq_mag, r->dk_mag, r->dv_mag};
        char why[256];
        for (int o = 0; o < 3; ++o)
            CHECK(ref_compare(&outputs[o]->t, MFA_DTYPE_F32, want[o], magnitude[o], n, r->max_score,
                              why, sizeof why),
                  "%s: %s", names[o], why);
    }
    free(dq.buffer);
    free(dk.buffer);
    free(dv.buffer);
    return s;
}

static void* caller(void* arg) {
    const shared_inputs* in = arg;
    for (int call = 0; call < CALLS; ++call)
        CHECK(checked_backward(in) == MFA_OK, "backward failed: %s", mfa_last_error());
    return NULL;
}

/* No address space for the fiber stacks at all (RLIMIT_AS just above what the process uses):
 * the call must fail with MFA_ERROR_OUT_OF_MEMORY having written nothing, and the next call,
 * with the limit lifted, must succeed on the same context. Not under a sanitizer, whose shadow
 * memory an address-space limit would starve. */
static void test_exhaustion_writes_nothing(shared_inputs* in) {
#ifdef TEST_SANITIZED
    (void)in;
    printf("sim_concurrent_reservation: exhaustion under RLIMIT_AS not run under a sanitizer\n");
#else
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = WORKERS;
    in->ctx = test_context(MFA_BACKEND_METAL_SIM, &options, "metal-sim, 128 workers");
    if (!in->ctx) return;
    struct rlimit original;
    getrlimit(RLIMIT_AS, &original);
    /* 4 MiB of room: the call's scratch and bookkeeping fit, one worker's 64 stacks of 256 KiB
     * do not. */
    struct rlimit tight = original;
    tight.rlim_cur = (rlim_t)vm_size_kib() * 1024 + ((rlim_t)4 << 20);
    if (setrlimit(RLIMIT_AS, &tight) != 0) {
        CHECK(0, "setrlimit(RLIMIT_AS) failed");
    } else {
        const mfa_status s = checked_backward(in);
        const char* message = mfa_last_error();
        setrlimit(RLIMIT_AS, &original);
        CHECK(s == MFA_ERROR_OUT_OF_MEMORY && strstr(message, "fiber stacks") != NULL,
              "without address space for fiber stacks the backward returned %s: %s",
              mfa_status_string(s), message);
        CHECK(checked_backward(in) == MFA_OK, "with the limit lifted, the backward failed: %s",
              mfa_last_error());
        printf("sim_concurrent_reservation: without address space for stacks: %s, nothing "
               "written; then a successful call\n",
               mfa_status_string(s));
    }
    mfa_context_destroy(in->ctx);
    in->ctx = NULL;
#endif
}

int main(int argc, char** argv) {
    const int callers = argc > 1 ? atoi(argv[1]) : DEFAULT_CALLERS;
    if (!mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        printf("sim_concurrent_reservation: metal-sim not built, skipped\n");
        return 77;
    }
    if (count_mappings() < 0 || vm_size_kib() < 0) {
        printf("sim_concurrent_reservation: no /proc/self/maps here, skipped\n");
        return 77;
    }
    shared_inputs in;
    in.q = test_tensor_make(MFA_DTYPE_F32, B, HQ, NQ, D, TEST_BHSD);
    in.k = test_tensor_make(MFA_DTYPE_F32, B, HKV, NK, D, TEST_BHSD);
    in.v = test_tensor_make(MFA_DTYPE_F32, B, HKV, NK, D, TEST_BHSD);
    in.dout = test_tensor_make(MFA_DTYPE_F32, B, HQ, NQ, D, TEST_BHSD);
    in.out = test_tensor_make(MFA_DTYPE_F32, B, HQ, NQ, D, TEST_BHSD);
    in.lse = test_tensor_make(MFA_DTYPE_F32, B, HQ, NQ, 1, TEST_BHSD);
    test_fill_random(&in.q);
    test_fill_random(&in.k);
    test_fill_random(&in.v);
    test_fill_random(&in.dout);
    const ref_problem p = ref_problem_of(&in.q.t, &in.k.t, &in.v.t, NULL);
    ref_result forward = ref_forward(&p, &in.q.t, &in.k.t, &in.v.t);
    ref_store_forward(&forward, &in.out.t, &in.lse.t);
    in.backward =
        ref_backward(&p, &in.q.t, &in.k.t, &in.v.t, &in.out.t, &in.dout.t, &in.lse.t, NULL);

    /* First use of the simulator and of threads outside the measurement. */
    mfa_context* warm = test_context(MFA_BACKEND_METAL_SIM, NULL, "metal-sim");
    mfa_context_destroy(warm);
    const long maps_before = count_mappings();
    long maps_after_first = 0, vm_after_first = 0;
    for (int round = 0; round < ROUNDS; ++round) {
        mfa_context_options options;
        mfa_context_options_init(&options);
        options.num_threads = WORKERS;
        in.ctx = test_context(MFA_BACKEND_METAL_SIM, &options, "metal-sim, 128 workers");
        if (!in.ctx) break;
        pthread_t threads[64];
        const int count = callers < 64 ? callers : 64;
        for (int t = 0; t < count; ++t)
            CHECK(pthread_create(&threads[t], NULL, caller, &in) == 0, "cannot start thread %d", t);
        for (int t = 0; t < count; ++t) pthread_join(threads[t], NULL);

        const long maps_live = count_mappings();
        mfa_context_destroy(in.ctx);
        const long maps_after = count_mappings(), vm_after = vm_size_kib();
        printf("sim_concurrent_reservation: round %d: %d callers x %d backward calls; mappings "
               "%ld before, %ld with the context, %ld after it; VmSize after it %ld MiB\n",
               round, count, CALLS, maps_before, maps_live, maps_after, vm_after >> 10);
/* ThreadSanitizer maps shadow and metadata for every mapping the program makes and keeps much
 * of it after the program unmaps: its mapping counts say nothing about the library's, so
 * they are printed, not checked, there. */
#ifndef TEST_TSAN
        CHECK(maps_live - maps_before <= LIVE_MAPPINGS_BOUND,
              "round %d: the context holds %ld more mappings than before it existed (bound %d)",
              round, maps_live - maps_before, LIVE_MAPPINGS_BOUND);
        CHECK(maps_after - maps_before <= SLACK_MAPPINGS,
              "round %d: %ld mappings more than before the first context remain after "
              "destroying it",
              round, maps_after - maps_before);
        if (round == 0) {
            maps_after_first = maps_after;
            vm_after_first = vm_after;
        } else {
            CHECK(maps_after - maps_after_first <= SLACK_ROUND_MAPPINGS,
                  "round %d: %ld more mappings than after the first round", round,
                  maps_after - maps_after_first);
            CHECK(vm_after - vm_after_first <= SLACK_VM_KIB,
                  "round %d: the address space grew by %ld MiB over the first round's", round,
                  (vm_after - vm_after_first) >> 10);
        }
#endif
    }

    test_exhaustion_writes_nothing(&in);

    ref_free(&forward);
    ref_free(&in.backward);
    test_tensor* all[] = {&in.q, &in.k, &in.v, &in.out, &in.lse, &in.dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
    return test_finish("sim_concurrent_reservation");
}
