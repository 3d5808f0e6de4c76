/* Device buffers, command buffers and mfa_attention_encode on metal-sim, whose buffers are host
 * memory behind a handle and whose command buffers run their work when committed, so that the
 * path Metal callers take (a buffer plus a byte offset, encoding into the caller's command
 * buffer, the caller committing) runs here:
 *   - buffers: length, zeroed contents, the errors of a length of 0;
 *   - every operand of a call in one buffer at its own byte offset (element-aligned, not
 *     16-byte aligned), all layouts and dtypes, through mfa_attention_compute and through
 *     mfa_attention_encode, against the float64 reference of test_reference.h;
 *   - views that reach one byte outside their buffer, or start before it, rejected naming the
 *     operand, with nothing encoded and nothing written;
 *   - deferred execution: nothing written before commit; a forward and the backward reading its
 *     out and lse encoded into one command buffer run in order;
 *   - completion status: wait before commit, a second commit, encoding after commit, an
 *     uncommitted command buffer destroyed (its work dropped, its scratch returned: the leak
 *     check of the sanitizer builds sees it), a command buffer whose run fails (its stacks
 *     cannot be mapped: a child process under an address-space limit) reporting the failure
 *     through wait, with its outputs unwritten;
 *   - concurrent encodes on one context into different command buffers (TSan runs this in the
 *     hardening builds).
 * Skipped, saying so, when the library has no metal-sim backend. */
#include <pthread.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_reference.h"
#include "sanitizer.h"
#include "test_util.h"

/* ---- Arrays in one device buffer ------------------------------------------------------------ */

/* A buffer holding copies of host test tensors, each at its own offset. */
typedef struct arena {
    mfa_context* ctx;
    void* buffer;
    char* contents;
    size_t length, used;
} arena;

static arena arena_make(mfa_context* ctx, size_t length) {
    arena a = {ctx, NULL, NULL, length, 0};
    CHECK(mfa_buffer_create(ctx, length, &a.buffer) == MFA_OK, "buffer of %zu bytes: %s", length,
          mfa_last_error());
    a.contents = (char*)mfa_buffer_contents(ctx, a.buffer);
    CHECK(a.contents != NULL && mfa_buffer_length(ctx, a.buffer) == length);
    return a;
}

static void arena_free(arena* a) { mfa_buffer_destroy(a->ctx, a->buffer); }

/* A tensor of the arena: the device array the library gets, and a host view of the same bytes
 * (through the buffer's contents) for reading results and for the reference. */
typedef struct placed {
    mfa_array array;
    test_tensor view; /* view.t.data points into the buffer; view.storage is not owned */
} placed;

/* Copies x's storage three elements past the arena's last tensor (offsets element-aligned but
 * not 16-byte aligned, so the binding offset is really used). */
static placed place(arena* a, const test_tensor* x) {
    const size_t elem = mfa_dtype_size(x->t.dtype);
    const size_t start = (a->used + elem - 1) / elem * elem + 3 * elem;
    CHECK(start + x->bytes <= a->length, "arena too small");
    memcpy(a->contents + start, x->storage, x->bytes);
    a->used = start + x->bytes;
    placed p;
    memset(&p, 0, sizeof p);
    const int64_t origin = (int64_t)((const char*)x->t.data - (const char*)x->storage);
    p.array.buffer = a->buffer;
    p.array.byte_offset = (int64_t)start + origin;
    p.array.dtype = x->t.dtype;
    memcpy(p.array.shape, x->t.shape, sizeof p.array.shape);
    memcpy(p.array.strides, x->t.strides, sizeof p.array.strides);
    p.view = *x;
    p.view.storage = a->contents + start;
    p.view.t.data = a->contents + start + origin;
    return p;
}

static const test_problem configs[] = {
    {"f32 causal bottom-right Nq < Nk", MFA_DTYPE_F32, 2, 2, 2, 9, 17, 16, 16, 1,
     MFA_ALIGN_BOTTOM_RIGHT, -1, -1, TEST_BHSD, 0},
    {"f16 GQA window top-left bshd", MFA_DTYPE_F16, 1, 4, 2, 13, 11, 8, 8, 0, MFA_ALIGN_TOP_LEFT, 3,
     2, TEST_BSHD, 0},
    {"bf16 Dv != D, reversed rows", MFA_DTYPE_BF16, 1, 2, 1, 7, 20, 16, 8, 1, MFA_ALIGN_TOP_LEFT, 5,
     -1, TEST_REVERSED, 0},
};

/* The nine operands of a call placed in one arena; outputs start as NaN. */
typedef struct device_call {
    test_attention host; /* inputs, and the templates of the outputs */
    arena arena;
    placed q, k, v, out, lse, dout, dq, dk, dv;
    mfa_attention_params params;
} device_call;

static void device_call_make(device_call* c, mfa_context* ctx, const test_problem* cfg) {
    c->host = test_attention_make(cfg->dtype, cfg->b, cfg->hq, cfg->hkv, cfg->nq, cfg->nk, cfg->d,
                                  cfg->dv, cfg->layout);
    test_tensor* outputs[] = {&c->host.out, &c->host.lse, &c->host.dq, &c->host.dk, &c->host.dv};
    for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; ++i) test_fill_nan(outputs[i]);
    size_t total = 0;
    const test_tensor* all[] = {&c->host.q,    &c->host.k,  &c->host.v,  &c->host.out, &c->host.lse,
                                &c->host.dout, &c->host.dq, &c->host.dk, &c->host.dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) total += all[i]->bytes + 64;
    c->arena = arena_make(ctx, total);
    c->q = place(&c->arena, &c->host.q), c->k = place(&c->arena, &c->host.k);
    c->v = place(&c->arena, &c->host.v), c->out = place(&c->arena, &c->host.out);
    c->lse = place(&c->arena, &c->host.lse), c->dout = place(&c->arena, &c->host.dout);
    c->dq = place(&c->arena, &c->host.dq), c->dk = place(&c->arena, &c->host.dk);
    c->dv = place(&c->arena, &c->host.dv);
    c->params = test_params(cfg->causal, cfg->alignment, cfg->left, cfg->right, cfg->scale);
}

static void device_call_free(device_call* c) {
    arena_free(&c->arena);
    test_attention_free(&c->host);
}

static void args_of(device_call* c, mfa_direction direction, mfa_attention_args* args) {
    mfa_attention_args_init(args, sizeof *args);
    args->q = &c->q.array, args->k = &c->k.array, args->v = &c->v.array;
    args->out = &c->out.array, args->lse = &c->lse.array;
    if (direction == MFA_BACKWARD) {
        args->dout = &c->dout.array, args->dq = &c->dq.array, args->dk = &c->dk.array;
        args->dv = &c->dv.array;
    }
}

static void check(const char* label, const char* what, const placed* got, mfa_dtype dtype,
                  const double* want, const double* magnitude, int64_t reduction,
                  double max_score) {
    char why[256];
    CHECK(ref_compare(&got->view.t, dtype, want, magnitude, reduction, max_score, why, sizeof why),
          "%s: %s: %s", label, what, why);
}

/* out and lse against the reference of the inputs; with backward, dq, dk and dv against the
 * gradients of the forward as stored (what the backward reads, as test_compute checks them).
 * Tolerances: ref_allowed_error for the dtype, as test_compute. */
static void check_results(const char* label, const device_call* c, const test_problem* cfg,
                          bool backward) {
    const ref_problem problem =
        ref_problem_of(&c->host.q.t, &c->host.k.t, &c->host.v.t, &c->params);
    ref_result want = ref_forward(&problem, &c->host.q.t, &c->host.k.t, &c->host.v.t);
    check(label, "out", &c->out, cfg->dtype, want.out, want.out_mag, cfg->nk, want.max_score);
    check(label, "lse", &c->lse, MFA_DTYPE_F32, want.lse, want.lse_mag, cfg->nk, want.max_score);
    if (backward) {
        ref_result grads = ref_backward(&problem, &c->host.q.t, &c->host.k.t, &c->host.v.t,
                                        &c->out.view.t, &c->host.dout.t, &c->lse.view.t, NULL);
        const int64_t longest = cfg->nk > cfg->nq ? cfg->nk : cfg->nq;
        check(label, "dq", &c->dq, cfg->dtype, grads.dq, grads.dq_mag, longest, grads.max_score);
        check(label, "dk", &c->dk, cfg->dtype, grads.dk, grads.dk_mag, longest * cfg->hq,
              grads.max_score);
        check(label, "dv", &c->dv, cfg->dtype, grads.dv, grads.dv_mag, longest * cfg->hq,
              grads.max_score);
        ref_free(&grads);
    }
    ref_free(&want);
}

static int all_nan_bytes(const placed* p) {
    for (size_t i = 0; i < p->view.bytes; ++i)
        if (((const unsigned char*)p->view.storage)[i] != 0xff) return 0;
    return 1;
}

/* ---- Buffers ----------------------------------------------------------------------------------- */

static void test_buffers(mfa_context* ctx) {
    void* buffer = (void*)16;
    CHECK_ERROR("length 0", mfa_buffer_create(ctx, 0, &buffer), MFA_ERROR_INVALID_ARGUMENT,
                "length must be >= 1 byte");
    CHECK(buffer == NULL, "*buffer not reset on failure");
    CHECK(mfa_buffer_create(ctx, 1000, &buffer) == MFA_OK, "%s", mfa_last_error());
    const unsigned char* contents = (const unsigned char*)mfa_buffer_contents(ctx, buffer);
    CHECK(contents != NULL && (uintptr_t)contents % 16 == 0, "contents misaligned");
    CHECK(mfa_buffer_length(ctx, buffer) == 1000);
    for (int i = 0; i < 1000; ++i) CHECK(contents[i] == 0, "byte %d of a new buffer not 0", i);
    mfa_buffer_destroy(ctx, buffer);
    CHECK(mfa_buffer_length(ctx, NULL) == 0 && mfa_buffer_contents(ctx, NULL) == NULL);
    mfa_buffer_destroy(ctx, NULL);
}

/* ---- Results: compute and encode ------------------------------------------------------------ */

static void test_compute_and_encode(mfa_context* ctx) {
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; ++i) {
        for (int via_encode = 0; via_encode < 2; ++via_encode) {
            const test_problem* cfg = &configs[i];
            char label[200];
            snprintf(label, sizeof label, "%s via %s", cfg->name,
                     via_encode ? "mfa_attention_encode" : "mfa_attention_compute");
            device_call c;
            device_call_make(&c, ctx, cfg);
            mfa_attention_args forward, backward;
            args_of(&c, MFA_FORWARD, &forward);
            args_of(&c, MFA_BACKWARD, &backward);
            if (via_encode) {
                void* commands = NULL;
                CHECK(mfa_command_buffer_create(ctx, &commands) == MFA_OK, "%s", mfa_last_error());
                CHECK(mfa_attention_encode(ctx, commands, MFA_FORWARD, &c.params, &forward) ==
                          MFA_OK,
                      "%s: encode forward: %s", label, mfa_last_error());
                /* The backward reads the forward's out and lse: both in one command buffer,
                 * which runs them in encoding order. */
                CHECK(mfa_attention_encode(ctx, commands, MFA_BACKWARD, &c.params, &backward) ==
                          MFA_OK,
                      "%s: encode backward: %s", label, mfa_last_error());
                CHECK(all_nan_bytes(&c.out) && all_nan_bytes(&c.lse) && all_nan_bytes(&c.dq) &&
                          all_nan_bytes(&c.dk) && all_nan_bytes(&c.dv),
                      "%s: an output was written before commit", label);
                CHECK(mfa_command_buffer_commit(ctx, commands) == MFA_OK, "%s", mfa_last_error());
                CHECK(mfa_command_buffer_wait(ctx, commands) == MFA_OK, "%s: run: %s", label,
                      mfa_last_error());
                mfa_command_buffer_destroy(ctx, commands);
            } else {
                CHECK(mfa_attention_compute(ctx, MFA_FORWARD, &c.params, &forward) == MFA_OK,
                      "%s: forward: %s", label, mfa_last_error());
                CHECK(mfa_attention_compute(ctx, MFA_BACKWARD, &c.params, &backward) == MFA_OK,
                      "%s: backward: %s", label, mfa_last_error());
            }
            check_results(label, &c, cfg, true);
            device_call_free(&c);
        }
    }
}

/* ---- Views outside their buffer ------------------------------------------------------------ */

/* Each operand moved so that its last byte is one past the buffer's end, or its first byte one
 * element before the start: refused naming it, nothing encoded (the command buffer then runs
 * nothing) and no byte of the buffer written. */
static void test_out_of_range(mfa_context* ctx) {
    const test_problem* cfg = &configs[2]; /* reversed rows: the lowest byte is below the origin */
    device_call c;
    device_call_make(&c, ctx, cfg);
    placed* operands[] = {&c.q, &c.k, &c.v, &c.out, &c.lse, &c.dout, &c.dq, &c.dk, &c.dv};
    const char* names[] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    char* snapshot = (char*)malloc(c.arena.length);
    memcpy(snapshot, c.arena.contents, c.arena.length);
    void* commands = NULL;
    CHECK(mfa_command_buffer_create(ctx, &commands) == MFA_OK, "%s", mfa_last_error());
    for (size_t i = 0; i < sizeof operands / sizeof operands[0]; ++i) {
        placed* p = operands[i];
        const int64_t elem = (int64_t)mfa_dtype_size(p->array.dtype);
        const int64_t saved = p->array.byte_offset;
        const int64_t lowest = saved - (int64_t)((char*)p->view.t.data - (char*)p->view.storage);
        const int64_t moves[2] = {
            (int64_t)c.arena.length - (lowest + (int64_t)p->view.bytes) + elem, -lowest - elem};
        for (int m = 0; m < 2; ++m) {
            p->array.byte_offset = saved + moves[m];
            mfa_attention_args args;
            args_of(&c, MFA_BACKWARD, &args);
            char label[64];
            snprintf(label, sizeof label, "%s %s", names[i],
                     m ? "before the start" : "past the end");
            char text[64];
            snprintf(text, sizeof text, "%s: the view reaches bytes", names[i]);
            CHECK_ERROR(label, mfa_attention_encode(ctx, commands, MFA_BACKWARD, &c.params, &args),
                        MFA_ERROR_INVALID_ARGUMENT, text);
            CHECK_ERROR(label, mfa_attention_compute(ctx, MFA_BACKWARD, &c.params, &args),
                        MFA_ERROR_INVALID_ARGUMENT, text);
        }
        /* A misaligned offset is refused too (GPU loads need aligned elements). */
        p->array.byte_offset = saved + 1;
        mfa_attention_args args;
        args_of(&c, MFA_BACKWARD, &args);
        CHECK_ERROR(names[i], mfa_attention_encode(ctx, commands, MFA_BACKWARD, &c.params, &args),
                    MFA_ERROR_INVALID_ARGUMENT, "is not a multiple of its element size");
        p->array.byte_offset = saved;
    }
    /* A host array among device ones, and host arrays only, for encode. */
    mfa_array host_q = c.q.array;
    host_q.buffer = NULL;
    host_q.data = c.host.q.t.data;
    host_q.byte_offset = 0;
    mfa_attention_args args;
    args_of(&c, MFA_FORWARD, &args);
    args.k = &host_q;
    CHECK_ERROR("mixed memory", mfa_attention_encode(ctx, commands, MFA_FORWARD, &c.params, &args),
                MFA_ERROR_INVALID_ARGUMENT, "all in host memory or all in device buffers");
    CHECK(mfa_command_buffer_commit(ctx, commands) == MFA_OK, "%s", mfa_last_error());
    CHECK(mfa_command_buffer_wait(ctx, commands) == MFA_OK, "%s", mfa_last_error());
    mfa_command_buffer_destroy(ctx, commands);
    CHECK(memcmp(snapshot, c.arena.contents, c.arena.length) == 0,
          "a refused call wrote into the buffer");
    free(snapshot);
    device_call_free(&c);
}

/* ---- Command buffer states ------------------------------------------------------------------ */

static void test_status(mfa_context* ctx) {
    const test_problem* cfg = &configs[0];
    device_call c;
    device_call_make(&c, ctx, cfg);
    mfa_attention_args forward, backward;
    args_of(&c, MFA_FORWARD, &forward);
    args_of(&c, MFA_BACKWARD, &backward);

    void* commands = NULL;
    CHECK(mfa_command_buffer_create(ctx, &commands) == MFA_OK, "%s", mfa_last_error());
    CHECK_ERROR("wait before commit", mfa_command_buffer_wait(ctx, commands),
                MFA_ERROR_INVALID_ARGUMENT, "never committed");
    CHECK(mfa_attention_encode(ctx, commands, MFA_FORWARD, &c.params, &forward) == MFA_OK, "%s",
          mfa_last_error());
    CHECK(all_nan_bytes(&c.out), "out written by encoding");
    CHECK(mfa_command_buffer_commit(ctx, commands) == MFA_OK, "%s", mfa_last_error());
    CHECK(mfa_command_buffer_wait(ctx, commands) == MFA_OK, "%s", mfa_last_error());
    CHECK(mfa_command_buffer_wait(ctx, commands) == MFA_OK, "a second wait: %s", mfa_last_error());
    CHECK_ERROR("second commit", mfa_command_buffer_commit(ctx, commands),
                MFA_ERROR_INVALID_ARGUMENT, "already committed");
    memset(c.dq.view.storage, 0xff, c.dq.view.bytes);
    CHECK_ERROR("encode after commit",
                mfa_attention_encode(ctx, commands, MFA_BACKWARD, &c.params, &backward),
                MFA_ERROR_INVALID_ARGUMENT, "already committed");
    CHECK(all_nan_bytes(&c.dq), "a refused encode wrote dq");
    mfa_command_buffer_destroy(ctx, commands);
    check_results("forward of the status test", &c, cfg, false);

    /* Work encoded and never committed is dropped with its command buffer: nothing written, and
     * the backward's scratch returned (the sanitizer builds' leak check sees a lost one). */
    CHECK(mfa_command_buffer_create(ctx, &commands) == MFA_OK, "%s", mfa_last_error());
    CHECK(mfa_attention_encode(ctx, commands, MFA_BACKWARD, &c.params, &backward) == MFA_OK, "%s",
          mfa_last_error());
    mfa_command_buffer_destroy(ctx, commands);
    CHECK(all_nan_bytes(&c.dq) && all_nan_bytes(&c.dk) && all_nan_bytes(&c.dv),
          "a dropped command buffer's work ran");

    CHECK_ERROR("NULL command buffer",
                mfa_attention_encode(ctx, NULL, MFA_FORWARD, &c.params, &forward),
                MFA_ERROR_INVALID_ARGUMENT, "command_buffer is NULL");
    CHECK_ERROR("commit NULL", mfa_command_buffer_commit(ctx, NULL), MFA_ERROR_INVALID_ARGUMENT,
                "command_buffer is NULL");
    device_call_free(&c);
}

/* ---- A command buffer whose run fails ------------------------------------------------------- */

/* Bytes of address space the process maps now (/proc/self/statm's first field), or 0. */
static size_t mapped_bytes(void) {
    FILE* f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f == NULL) return 0;
    if (fscanf(f, "%lu", &pages) != 1) pages = 0;
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* In a child process: a fresh context (no fiber stacks mapped yet), a forward encoded, then the
 * address space limited to what is mapped plus 1 MiB, far less than the stacks of one
 * threadgroup, so that the command buffer fails when it runs. wait must report the failure
 * (out of memory) with its message, the output must be unwritten, and work encoded after the
 * failed call must not run. The child's exit status carries the verdict. */
static int failing_child(void) {
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = 1;
    mfa_context* ctx = test_context(MFA_BACKEND_METAL_SIM, &options, "metal-sim");
    if (ctx == NULL) return 2;
    device_call c;
    device_call_make(&c, ctx, &configs[0]);
    mfa_attention_args forward, backward;
    args_of(&c, MFA_FORWARD, &forward);
    args_of(&c, MFA_BACKWARD, &backward);
    void* commands = NULL;
    if (mfa_command_buffer_create(ctx, &commands) != MFA_OK ||
        mfa_attention_encode(ctx, commands, MFA_FORWARD, &c.params, &forward) != MFA_OK ||
        mfa_attention_encode(ctx, commands, MFA_BACKWARD, &c.params, &backward) != MFA_OK) {
        fprintf(stderr, "failing_child: setup: %s\n", mfa_last_error());
        return 3;
    }
    struct rlimit saved, limited;
    getrlimit(RLIMIT_AS, &saved);
    limited = saved;
    limited.rlim_cur = mapped_bytes() + (1u << 20);
    if (mapped_bytes() == 0 || setrlimit(RLIMIT_AS, &limited) != 0) return 4;
    const mfa_status committed = mfa_command_buffer_commit(ctx, commands);
    const mfa_status waited = mfa_command_buffer_wait(ctx, commands);
    setrlimit(RLIMIT_AS, &saved);
    int verdict = 0;
    if (committed != MFA_OK) {
        fprintf(stderr, "failing_child: commit: %s\n", mfa_last_error());
        verdict = 5;
    } else if (waited != MFA_ERROR_OUT_OF_MEMORY || strstr(mfa_last_error(), "stack") == NULL) {
        fprintf(stderr, "failing_child: wait gave %s: %s\n", mfa_status_string(waited),
                mfa_last_error());
        verdict = 6;
    } else if (!all_nan_bytes(&c.out) || !all_nan_bytes(&c.dq)) {
        fprintf(stderr, "failing_child: a failed command buffer wrote outputs\n");
        verdict = 7;
    }
    mfa_command_buffer_destroy(ctx, commands);
    device_call_free(&c);
    mfa_context_destroy(ctx);
    return verdict;
}

static void test_failing_command_buffer(void) {
#ifdef TEST_SANITIZED
    printf("test_device_memory: the failing command buffer is not run under a sanitizer (its "
           "runtime maps more than an address-space limit allows)\n");
#else
    fflush(stdout);
    fflush(stderr);
    const pid_t child = fork();
    if (child == 0) _exit(failing_child());
    int status = 0;
    CHECK(child > 0 && waitpid(child, &status, 0) == child, "fork");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the failing command buffer's child ended with status 0x%x", status);
#endif
}

/* ---- Concurrent encodes --------------------------------------------------------------------- */

enum { THREADS = 4 };

typedef struct worker {
    mfa_context* ctx;
    const test_problem* cfg;
    device_call call;
} worker;

/* Each thread: its own command buffer on the shared context, a forward and a backward encoded,
 * committed and waited for. */
static void* encode_thread(void* arg) {
    worker* w = (worker*)arg;
    mfa_attention_args forward, backward;
    args_of(&w->call, MFA_FORWARD, &forward);
    args_of(&w->call, MFA_BACKWARD, &backward);
    void* commands = NULL;
    CHECK(mfa_command_buffer_create(w->ctx, &commands) == MFA_OK, "%s", mfa_last_error());
    CHECK(mfa_attention_encode(w->ctx, commands, MFA_FORWARD, &w->call.params, &forward) == MFA_OK,
          "%s", mfa_last_error());
    CHECK(mfa_attention_encode(w->ctx, commands, MFA_BACKWARD, &w->call.params, &backward) ==
              MFA_OK,
          "%s", mfa_last_error());
    CHECK(mfa_command_buffer_commit(w->ctx, commands) == MFA_OK, "%s", mfa_last_error());
    CHECK(mfa_command_buffer_wait(w->ctx, commands) == MFA_OK, "%s", mfa_last_error());
    mfa_command_buffer_destroy(w->ctx, commands);
    return NULL;
}

static void test_concurrent(mfa_context* ctx) {
    worker workers[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; ++i) {
        workers[i].ctx = ctx;
        workers[i].cfg = &configs[i % (sizeof configs / sizeof configs[0])];
        device_call_make(&workers[i].call, ctx, workers[i].cfg);
    }
    for (int i = 0; i < THREADS; ++i)
        CHECK(pthread_create(&threads[i], NULL, encode_thread, &workers[i]) == 0);
    for (int i = 0; i < THREADS; ++i) pthread_join(threads[i], NULL);
    for (int i = 0; i < THREADS; ++i) {
        char label[96];
        snprintf(label, sizeof label, "thread %d: %s", i, workers[i].cfg->name);
        check_results(label, &workers[i].call, workers[i].cfg, true);
        device_call_free(&workers[i].call);
    }
}

int main(void) {
    if (!mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        printf("test_device_memory: skipped: no metal-sim backend in this library\n");
        return 0;
    }
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = 2;
    mfa_context* ctx = test_context(MFA_BACKEND_METAL_SIM, &options, "metal-sim");
    if (ctx == NULL) return test_finish("test_device_memory");
    mfa_capabilities caps;
    caps.struct_size = sizeof caps;
    CHECK(mfa_context_capabilities(ctx, &caps) == MFA_OK);
    CHECK((caps.features & MFA_FEATURE_DEVICE_BUFFERS) && (caps.features & MFA_FEATURE_ENCODE),
          "metal-sim lacks device buffers or encoding: features 0x%x", (unsigned)caps.features);
    test_buffers(ctx);
    test_compute_and_encode(ctx);
    test_out_of_range(ctx);
    test_status(ctx);
    test_concurrent(ctx);
    mfa_context_destroy(ctx);
    test_failing_command_buffer();
    return test_finish("test_device_memory");
}
