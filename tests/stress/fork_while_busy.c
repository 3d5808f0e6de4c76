/* fork() while other threads are inside calls: the child must be able to use the contexts it
 * inherited (and new ones), get correct results, and destroy them, without hanging.
 *
 * BUSY threads keep calling the forward and backward on one cpu context with several workers
 * and, where built, one metal-sim context, on problems small enough that the worker pool's
 * lock is taken and released all the time. Meanwhile the main thread forks FORKS times at
 * random moments. Each child runs a forward and a backward on both inherited contexts and a
 * forward on a new cpu context, checks them against the float64 reference, destroys all three
 * and exits 0. A child that hangs is killed by its own alarm (SIGALRM), so a deadlock fails
 * the test instead of stopping it; the alarm is a quarter of MFA_TEST_TIMEOUT (default 900 s
 * per test), at least 20 s.
 *
 * Usage: fork_while_busy [FORKS]  (default 60; not run under a sanitizer, see below). POSIX
 * only. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sanitizer.h"
#include "test_reference.h"

/* Not run under a sanitizer (exit 77, skipped), whose runtime is what fails there, whatever
 * libmfa does: AddressSanitizer's allocator (clang 16) is not locked around fork(), so a
 * child forked while another thread allocates hangs in malloc itself; ThreadSanitizer does
 * not support starting threads in the child of a threaded process (die_after_fork), and with
 * that check off its runtime crashes there. */
enum { DEFAULT_FORKS = 60 };
enum { BUSY = 4, POOL_THREADS = 4 };

typedef struct problem {
    test_attention a;
    mfa_attention_params params;
    ref_problem ref;
    ref_result forward, backward;
} problem;

static problem busy_problem, child_problem;
static mfa_context* contexts[2]; /* cpu, metal-sim (NULL where not built) */
static atomic_int stop_busy;

/* A forward and a backward with out and lse made by the reference, so that the backward does
 * not depend on the forward of the same call. */
static problem make_problem(int64_t hq, int64_t nq, int64_t nk, int64_t d, int causal) {
    problem p;
    p.a = test_attention_make(MFA_DTYPE_F32, 1, hq, 1, nq, nk, d, d, TEST_BHSD);
    p.params = test_params(causal, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 0);
    p.ref = ref_problem_of(&p.a.q.t, &p.a.k.t, &p.a.v.t, &p.params);
    p.forward = ref_forward(&p.ref, &p.a.q.t, &p.a.k.t, &p.a.v.t);
    ref_store_forward(&p.forward, &p.a.out.t, &p.a.lse.t);
    p.backward = ref_backward(&p.ref, &p.a.q.t, &p.a.k.t, &p.a.v.t, &p.a.out.t, &p.a.dout.t,
                              &p.a.lse.t, NULL);
    return p;
}

/* 1 when a forward into fresh buffers and a backward match the reference. */
static int check_calls(mfa_context* ctx, const problem* p, int backward) {
    const test_attention* a = &p->a;
    test_tensor out = test_tensor_make(MFA_DTYPE_F32, 1, p->ref.heads_q, p->ref.seq_q,
                                       p->ref.head_dim_v, TEST_BHSD);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, 1, p->ref.heads_q, p->ref.seq_q, 1, 0);
    test_tensor dq = test_tensor_make(MFA_DTYPE_F32, 1, p->ref.heads_q, p->ref.seq_q,
                                      p->ref.head_dim, TEST_BHSD);
    test_tensor dk = test_tensor_make(MFA_DTYPE_F32, 1, 1, p->ref.seq_k, p->ref.head_dim, 0);
    test_tensor dv = test_tensor_make(MFA_DTYPE_F32, 1, 1, p->ref.seq_k, p->ref.head_dim_v, 0);
    char why[256];
    const int64_t n = p->ref.seq_k + p->ref.head_dim + p->ref.seq_q;
    int ok = mfa_attention_forward(ctx, &p->params, &a->q.t, &a->k.t, &a->v.t, &out.t, &lse.t) ==
                 MFA_OK &&
             ref_compare(&out.t, MFA_DTYPE_F32, p->forward.out, p->forward.out_mag, n,
                         p->forward.max_score, why, sizeof why) &&
             ref_compare(&lse.t, MFA_DTYPE_F32, p->forward.lse, p->forward.lse_mag, n,
                         p->forward.max_score, why, sizeof why);
    if (ok && backward) {
        const ref_result* r = &p->backward;
        ok =
            mfa_attention_backward(ctx, &p->params, &a->q.t, &a->k.t, &a->v.t, &a->out.t,
                                   &a->dout.t, &a->lse.t, &dq.t, &dk.t, &dv.t) == MFA_OK &&
            ref_compare(&dq.t, MFA_DTYPE_F32, r->dq, r->dq_mag, n, r->max_score, why, sizeof why) &&
            ref_compare(&dk.t, MFA_DTYPE_F32, r->dk, r->dk_mag, n, r->max_score, why, sizeof why) &&
            ref_compare(&dv.t, MFA_DTYPE_F32, r->dv, r->dv_mag, n, r->max_score, why, sizeof why);
    }
    test_tensor* all[] = {&out, &lse, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
    return ok;
}

static void* busy(void* arg) {
    const int thread = (int)(intptr_t)arg;
    for (int i = 0; !atomic_load(&stop_busy); ++i) {
        mfa_context* ctx = contexts[(thread + i) % 2];
        if (ctx && !check_calls(ctx, &busy_problem, i % 3 == 0)) {
            fprintf(stderr, "fork_while_busy: a call in the parent went wrong: %s\n",
                    mfa_last_error());
            atomic_store(&stop_busy, 2);
        }
    }
    return NULL;
}

/* What a child does; its exit status says how it went (the parent names it). */
enum { CHILD_OK = 0, CHILD_WRONG_INHERITED = 1, CHILD_WRONG_NEW = 2, CHILD_NO_CONTEXT = 3 };

static void child(unsigned alarm_seconds) {
    alarm(alarm_seconds);
    for (int c = 0; c < 2; ++c)
        if (contexts[c] && !check_calls(contexts[c], &child_problem, 1))
            _exit(CHILD_WRONG_INHERITED);
    mfa_context* fresh = NULL;
    if (mfa_context_create(MFA_BACKEND_CPU, NULL, &fresh) != MFA_OK) _exit(CHILD_NO_CONTEXT);
    const int ok = check_calls(fresh, &child_problem, 0);
    mfa_context_destroy(fresh);
    for (int c = 0; c < 2; ++c) mfa_context_destroy(contexts[c]);
    _exit(ok ? CHILD_OK : CHILD_WRONG_NEW);
}

int main(int argc, char** argv) {
#ifdef TEST_SANITIZED
    printf("fork_while_busy: the sanitizer's runtime does not survive this, skipped\n");
    return 77;
#endif
    const int forks = argc > 1 ? atoi(argv[1]) : DEFAULT_FORKS;
    const char* timeout = getenv("MFA_TEST_TIMEOUT");
    const int per_test = timeout && atoi(timeout) > 0 ? atoi(timeout) : 900;
    const unsigned alarm_seconds = per_test / 4 > 20 ? (unsigned)(per_test / 4) : 20;

    busy_problem = make_problem(4, 9, 13, 8, 1);
    child_problem = make_problem(2, 11, 17, 16, 0);
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = POOL_THREADS;
    contexts[0] = test_context(MFA_BACKEND_CPU, &options, "cpu");
    if (mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        options.num_threads = 2;
        contexts[1] = test_context(MFA_BACKEND_METAL_SIM, &options, "metal-sim");
    }
    if (!contexts[0]) return test_finish("fork_while_busy");

    pthread_t threads[BUSY];
    for (int t = 0; t < BUSY; ++t) pthread_create(&threads[t], NULL, busy, (void*)(intptr_t)t);
    uint64_t state = 0x243F6A8885A308D3ull;
    int hung = 0, wrong = 0, other = 0;
    for (int f = 0; f < forks && atomic_load(&stop_busy) == 0; ++f) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const struct timespec pause = {0, (long)(state % 3000000)}; /* up to 3 ms */
        nanosleep(&pause, NULL);
        const pid_t pid = fork();
        if (pid == 0) child(alarm_seconds);
        if (pid < 0) {
            CHECK(0, "fork failed");
            break;
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
            if (hung++ == 0) CHECK(0, "fork %d: the child hung for %u s", f, alarm_seconds);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != CHILD_OK) {
            const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            if (code == CHILD_WRONG_INHERITED || code == CHILD_WRONG_NEW) {
                if (wrong++ == 0)
                    CHECK(0, "fork %d: the child got a wrong result from %s context", f,
                          code == CHILD_WRONG_NEW ? "a new" : "an inherited");
            } else if (other++ == 0) {
                CHECK(0, "fork %d: the child ended with %s %d", f,
                      WIFSIGNALED(status) ? "signal" : "status",
                      WIFSIGNALED(status) ? WTERMSIG(status) : code);
            }
        }
    }
    const int parent_failed = atomic_load(&stop_busy) == 2;
    atomic_store(&stop_busy, 1);
    for (int t = 0; t < BUSY; ++t) pthread_join(threads[t], NULL);
    CHECK(!parent_failed, "calls in the parent went wrong while it forked");
    printf("fork_while_busy: %d forks with %d busy threads: %d hung, %d wrong, %d otherwise "
           "failed\n",
           forks, BUSY, hung, wrong, other);
    for (int c = 0; c < 2; ++c) mfa_context_destroy(contexts[c]);
    problem* all[] = {&busy_problem, &child_problem};
    for (int i = 0; i < 2; ++i) {
        test_attention_free(&all[i]->a);
        ref_free(&all[i]->forward);
        ref_free(&all[i]->backward);
    }
    return test_finish("fork_while_busy");
}
