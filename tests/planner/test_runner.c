/*
 * Plan runner unit tests, against a scripted device that records what the runner asks of it:
 * passes encoded in order with every binding at its operand's index, one memory per operand for
 * the whole call (delta's scratch shared by both backward passes), writability merged over the
 * passes, the re-plan loop when a pipeline runs fewer threads than planned, the checks against
 * the device's limits, and on every failure (planning, pipeline, memory, commands) an error
 * before anything is encoded and everything acquired given back without copying results.
 * Device memory: operands in a device buffer bound in place at their byte offsets, a byte range
 * outside the length the buffer reports refused naming the operand, and a call encoded into a
 * caller's command buffer that keeps its scratch until the command buffer completes.
 *
 * metal-sim runs the same runner with real kernels in every numeric test; this test reaches
 * the paths a simulator never takes (a pipeline with a lower thread limit, failing devices).
 * The planner and runner are compiled into it directly (hidden inside libmfa), with the core's
 * errors.c for mfa_set_error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/validate.h"
#include "planner/runner.h"
#include "test_util.h"

/* ---- A scripted device ---------------------------------------------------------------------- */

#define MAX_ENCODED 8

typedef struct encoded_pass {
    mfa_pass_kind kind;
    uint32_t threads;
    uint32_t num_buffers;
    uint32_t index[MFA_PLAN_MAX_BINDINGS];
    mfa_gpu_memory memory[MFA_PLAN_MAX_BINDINGS];
} encoded_pass;

typedef struct fake_device {
    mfa_gpu_device device;
    /* Script */
    uint32_t pipeline_max[MFA_PASS_KIND_COUNT]; /* threads each kernel's pipeline runs */
    int fail_pipeline;                          /* every pipeline request fails */
    int fail_wrap;                              /* wrapping this operand fails; -1: none */
    int fail_scratch, fail_begin, fail_commit, fail_begin_encode, fail_end_encode;
    uint64_t device_length; /* what every device buffer reports */
    /* Record */
    int pipelines, wraps, scratches, begins, commits, live, released_completed, released_failed;
    int wrapped[MFA_OPERAND_COUNT];  /* times each operand was wrapped */
    int writable[MFA_OPERAND_COUNT]; /* as wrap_host was told */
    int encoded;
    encoded_pass passes[MAX_ENCODED];
    int device_buffers, begin_encodes, end_encodes;
    void (*completed)(void* arg, bool ran); /* end_encode's, until the test completes it */
    void* completed_arg;
} fake_device;

static char placeholder[16];
static int commands_token;

static mfa_pass_kind kind_of(const char* kernel) {
    for (int kind = 0; kind < MFA_PASS_KIND_COUNT; ++kind)
        if (strcmp(kernel, mfa_pass_kernel_name((mfa_pass_kind)kind)) == 0)
            return (mfa_pass_kind)kind;
    return MFA_PASS_KIND_COUNT;
}

static mfa_status fake_pipeline(void* self, const mfa_pass_plan* pass, mfa_gpu_pipeline* out) {
    fake_device* f = (fake_device*)self;
    f->pipelines++;
    if (f->fail_pipeline) return mfa_set_error(MFA_ERROR_INTERNAL, "fake: no pipeline");
    const mfa_pass_kind kind = kind_of(pass->kernel_name);
    CHECK(kind < MFA_PASS_KIND_COUNT, "unknown kernel %s", pass->kernel_name);
    out->pipeline = (void*)pass->kernel_name;
    out->max_total_threads_per_threadgroup = f->pipeline_max[kind];
    out->static_threadgroup_memory_length = 0;
    return MFA_OK;
}

static mfa_status fake_wrap(void* self, const mfa_host_range* range, mfa_gpu_memory* out) {
    fake_device* f = (fake_device*)self;
    f->wraps++;
    if ((int)range->operand == f->fail_wrap)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "fake: cannot wrap %s",
                             mfa_operand_name(range->operand));
    f->wrapped[range->operand]++;
    f->writable[range->operand] = range->writable;
    CHECK(range->length > 0 && range->first == range->data, "range of %s",
          mfa_operand_name(range->operand));
    out->buffer = range->first;
    out->offset = 0;
    out->length = range->length;
    out->owner = malloc(1);
    f->live++;
    return MFA_OK;
}

static mfa_status fake_scratch(void* self, uint64_t bytes, mfa_gpu_memory* out) {
    fake_device* f = (fake_device*)self;
    f->scratches++;
    if (f->fail_scratch) return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "fake: no scratch");
    out->owner = malloc((size_t)bytes);
    out->buffer = out->owner;
    out->offset = 0;
    out->length = bytes;
    f->live++;
    return MFA_OK;
}

static void fake_release(void* self, void* owner, bool completed) {
    fake_device* f = (fake_device*)self;
    free(owner);
    f->live--;
    if (completed)
        f->released_completed++;
    else
        f->released_failed++;
}

static void fake_encode(void* self, void* commands, const mfa_gpu_dispatch* dispatch) {
    fake_device* f = (fake_device*)self;
    CHECK(commands == &commands_token, "commands not from begin");
    CHECK(f->encoded < MAX_ENCODED, "too many dispatches");
    if (f->encoded >= MAX_ENCODED) return;
    encoded_pass* e = &f->passes[f->encoded++];
    e->kind = dispatch->pass->kind;
    e->threads = dispatch->pass->threads_per_threadgroup;
    CHECK(dispatch->pipeline == (void*)dispatch->pass->kernel_name, "pipeline of another pass");
    e->num_buffers = dispatch->num_buffers;
    for (uint32_t i = 0; i < dispatch->num_buffers; ++i) {
        e->index[i] = dispatch->buffers[i].index;
        e->memory[i] = *dispatch->buffers[i].memory;
    }
}

static mfa_status fake_begin(void* self, const char* label, void** commands) {
    fake_device* f = (fake_device*)self;
    f->begins++;
    CHECK(strcmp(label, "forward") == 0 || strcmp(label, "backward") == 0, "label %s", label);
    if (f->fail_begin) return mfa_set_error(MFA_ERROR_DEVICE, "fake: no commands");
    *commands = &commands_token;
    return MFA_OK;
}

static mfa_status fake_commit(void* self, void* commands, const char* what) {
    fake_device* f = (fake_device*)self;
    (void)what;
    f->commits++;
    CHECK(commands == &commands_token, "commands not from begin");
    return f->fail_commit ? mfa_set_error(MFA_ERROR_DEVICE, "fake: the GPU failed") : MFA_OK;
}

/* Device buffers are the test's `memory`, whatever handle the view names. */
static mfa_status fake_device_buffer(void* self, void* buffer, mfa_gpu_memory* out);
static mfa_status fake_begin_encode(void* self, void* command_buffer, const char* label,
                                    void** commands);
static mfa_status fake_end_encode(void* self, void* commands, void (*completed)(void*, bool),
                                  void* arg);

static const mfa_gpu_device_ops fake_ops = {
    fake_pipeline, fake_wrap,   fake_scratch,       fake_release,      fake_encode,
    fake_begin,    fake_commit, fake_device_buffer, fake_begin_encode, fake_end_encode};

static void fake_init(fake_device* f) {
    memset(f, 0, sizeof *f);
    f->device.ops = &fake_ops;
    f->device.self = f;
    f->device.backend = "fake";
    f->device.name = "the fake GPU";
    f->device.family = MFA_GPU_FAMILY_APPLE9;
    f->device.max_threads_per_threadgroup = 1024;
    f->device.max_threadgroup_memory_length = 32768;
    f->device.max_buffer_length = UINT64_MAX;
    f->device.placeholder.buffer = placeholder;
    f->device.placeholder.length = sizeof placeholder;
    for (int kind = 0; kind < MFA_PASS_KIND_COUNT; ++kind) f->pipeline_max[kind] = 1024;
    f->fail_wrap = -1;
}

/* ---- Problems ------------------------------------------------------------------------------ */

/* A contiguous bhsd problem over one buffer, each operand at its own offset (never read). */
static char memory[1 << 16];
static int device_buffer_token, command_buffer_token;

static mfa_status fake_device_buffer(void* self, void* buffer, mfa_gpu_memory* out) {
    fake_device* f = (fake_device*)self;
    CHECK(buffer == &device_buffer_token, "not the problem's buffer");
    f->device_buffers++;
    out->buffer = memory;
    out->offset = 0;
    out->length = f->device_length;
    out->owner = NULL;
    return MFA_OK;
}

static mfa_status fake_begin_encode(void* self, void* command_buffer, const char* label,
                                    void** commands) {
    fake_device* f = (fake_device*)self;
    (void)label;
    CHECK(command_buffer == &command_buffer_token, "not the caller's command buffer");
    f->begin_encodes++;
    if (f->fail_begin_encode) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "fake: committed");
    *commands = &commands_token;
    return MFA_OK;
}

static mfa_status fake_end_encode(void* self, void* commands, void (*completed)(void*, bool),
                                  void* arg) {
    fake_device* f = (fake_device*)self;
    CHECK(commands == &commands_token, "commands not from begin_encode");
    f->end_encodes++;
    if (f->fail_end_encode) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "fake: committed");
    f->completed = completed;
    f->completed_arg = arg;
    return MFA_OK;
}

/* The problem's views moved into the device buffer: the same byte offsets, no host pointers. */
static void to_device(mfa_problem* p) {
    mfa_view* views[] = {&p->q, &p->k, &p->v, &p->out, &p->lse, &p->dout, &p->dq, &p->dk, &p->dv};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; ++i) {
        if (views[i]->data == NULL) continue;
        views[i]->byte_offset = views[i]->data - memory;
        views[i]->buffer = &device_buffer_token;
        views[i]->data = NULL;
    }
    p->memory = MFA_MEMORY_DEVICE;
}

static mfa_problem make_problem(int64_t batch, int with_lse) {
    const int64_t hq = 4, hkv = 2, nq = 33, nk = 70, d = 16, dv = 8;
    mfa_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = MFA_DTYPE_F32;
    p.batch = batch, p.heads_q = hq, p.heads_kv = hkv, p.group = hq / hkv;
    p.seq_q = nq, p.seq_k = nk, p.head_dim = d, p.head_dim_v = dv;
    p.scale = 0.25f;
    mfa_visibility_band(nq, nk, nk - nq, -1, 0, &p.band_lo, &p.band_hi);
    const struct {
        mfa_view* view;
        int64_t heads, rows, width;
    } views[] = {{&p.q, hq, nq, d},    {&p.k, hkv, nk, d},  {&p.v, hkv, nk, dv},
                 {&p.out, hq, nq, dv}, {&p.lse, hq, nq, 1}, {&p.dout, hq, nq, dv},
                 {&p.dq, hq, nq, d},   {&p.dk, hkv, nk, d}, {&p.dv, hkv, nk, dv}};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; ++i) {
        const int64_t strides[4] = {views[i].heads * views[i].rows * views[i].width,
                                    views[i].rows * views[i].width, views[i].width, 1};
        views[i].view->data = memory + i * 4096;
        memcpy(views[i].view->stride, strides, sizeof strides);
    }
    if (!with_lse) p.lse.data = NULL;
    return p;
}

/* The state of a device after a call that failed before running: nothing encoded, begun or
 * left acquired, nothing released as if completed. */
static void check_nothing_ran(const fake_device* f, const char* what) {
    CHECK(f->encoded == 0 && f->begins == 0 && f->commits == 0, "%s: %d encoded, %d begun", what,
          f->encoded, f->begins);
    CHECK(f->live == 0, "%s: %d owners not released", what, f->live);
    CHECK(f->released_completed == 0, "%s: results copied back", what);
}

/* ---- Tests --------------------------------------------------------------------------------- */

/* Passes in plan order, each binding at its operand's index and bound to that operand's one
 * memory; every operand wrapped once, writable if any pass writes it. */
static void test_bindings(void) {
    for (int backward = 0; backward < 2; ++backward) {
        for (int with_lse = backward; with_lse < 2; ++with_lse) {
            fake_device f;
            fake_init(&f);
            const mfa_problem p = make_problem(2, with_lse);
            mfa_plan plan;
            CHECK((backward ? mfa_plan_backward : mfa_plan_forward)(&p, f.device.family, 1024,
                                                                    &plan) == MFA_OK,
                  "%s", mfa_last_error());
            CHECK(mfa_gpu_run(&f.device, &p, backward) == MFA_OK, "run: %s", mfa_last_error());
            CHECK(f.begins == 1 && f.commits == 1, "begins %d commits %d", f.begins, f.commits);
            CHECK(f.encoded == (int)plan.num_passes, "%d of %u passes encoded", f.encoded,
                  plan.num_passes);
            uint32_t bound = 0, written = 0;
            for (int i = 0; i < f.encoded && i < (int)plan.num_passes; ++i) {
                const mfa_pass_plan* pass = &plan.passes[i];
                const encoded_pass* e = &f.passes[i];
                CHECK(e->kind == pass->kind && e->num_buffers == pass->num_bindings,
                      "pass %d: kind %d, %u buffers", i, (int)e->kind, e->num_buffers);
                for (uint32_t j = 0; j < e->num_buffers; ++j) {
                    const mfa_buffer_binding* b = &pass->bindings[j];
                    CHECK(e->index[j] == b->operand, "%s bound at %u", mfa_operand_name(b->operand),
                          e->index[j]);
                    bound |= 1u << b->operand;
                    if (b->writable) written |= 1u << b->operand;
                    if (b->operand == MFA_OPERAND_DELTA) {
                        CHECK(e->memory[j].length == (uint64_t)plan.scratch_bytes, "delta length");
                    } else {
                        mfa_operand_view view;
                        mfa_problem_operand(&p, b->operand, &view);
                        CHECK(e->memory[j].buffer == view.view->data + b->byte_offset &&
                                  e->memory[j].length == (uint64_t)b->byte_length,
                              "%s: not its own memory", mfa_operand_name(b->operand));
                    }
                    /* The same memory in every pass that binds the operand. */
                    for (int k = 0; k < i; ++k)
                        for (uint32_t m = 0; m < f.passes[k].num_buffers; ++m)
                            if (f.passes[k].index[m] == e->index[j])
                                CHECK(f.passes[k].memory[m].buffer == e->memory[j].buffer,
                                      "%s: another memory in pass %d", mfa_operand_name(b->operand),
                                      k);
                }
            }
            for (mfa_operand op = 0; op < MFA_OPERAND_COUNT; ++op) {
                const int expected = op == MFA_OPERAND_DELTA ? 0 : (bound >> op) & 1;
                CHECK(f.wrapped[op] == expected, "%s wrapped %d times", mfa_operand_name(op),
                      f.wrapped[op]);
                if (expected)
                    CHECK(f.writable[op] == (int)((written >> op) & 1), "%s writable %d",
                          mfa_operand_name(op), f.writable[op]);
            }
            CHECK(((bound >> MFA_OPERAND_L) & 1) == (uint32_t)with_lse, "lse bound %u", bound);
            CHECK(f.scratches == backward, "%d scratches", f.scratches);
            /* What the kernels write, independently of the plan's own flags. */
            const uint32_t writes =
                backward ? 1u << MFA_OPERAND_DQ | 1u << MFA_OPERAND_DK | 1u << MFA_OPERAND_DV
                         : 1u << MFA_OPERAND_O | (with_lse ? 1u << MFA_OPERAND_L : 0);
            for (mfa_operand op = 0; op < MFA_OPERAND_COUNT; ++op)
                if (op != MFA_OPERAND_DELTA && f.wrapped[op])
                    CHECK(f.writable[op] == (int)((writes >> op) & 1), "%s writable %d",
                          mfa_operand_name(op), f.writable[op]);
            CHECK(f.live == 0, "%d owners not released", f.live);
            CHECK(f.released_completed == f.wraps + f.scratches && f.released_failed == 0,
                  "released %d completed, %d failed", f.released_completed, f.released_failed);
        }
    }
}

/* A pipeline that runs fewer threads than planned makes the runner plan again for its bound;
 * what is encoded fits every pipeline. One below a simdgroup cannot be planned for. */
static void test_replan(void) {
    const uint32_t limits[] = {512, 96, 64, 32};
    for (size_t l = 0; l < sizeof limits / sizeof limits[0]; ++l) {
        fake_device f;
        fake_init(&f);
        f.pipeline_max[MFA_PASS_BACKWARD_KEY_VALUE] = limits[l];
        const mfa_problem p = make_problem(1, 1);
        CHECK(mfa_gpu_run(&f.device, &p, true) == MFA_OK, "limit %u: %s", limits[l],
              mfa_last_error());
        CHECK(f.encoded == 2, "limit %u: %d passes", limits[l], f.encoded);
        for (int i = 0; i < f.encoded; ++i)
            CHECK(f.passes[i].threads <= f.pipeline_max[f.passes[i].kind],
                  "limit %u: pass %d runs %u threads", limits[l], i, f.passes[i].threads);
        CHECK(f.live == 0, "limit %u: %d owners not released", limits[l], f.live);
    }
    fake_device f;
    fake_init(&f);
    f.pipeline_max[MFA_PASS_FORWARD] = 16;
    const mfa_problem p = make_problem(1, 1);
    CHECK(mfa_gpu_run(&f.device, &p, false) == MFA_ERROR_INVALID_ARGUMENT, "16 threads planned");
    CHECK(strstr(mfa_last_error(), "one simdgroup") != NULL, "message: %s", mfa_last_error());
    check_nothing_ran(&f, "16 threads");
}

/* Every failure before running: the status and message of the failing step, nothing encoded,
 * everything acquired so far given back without copying results. */
static void test_failures_before_running(void) {
    const mfa_problem p = make_problem(2, 1);
    struct {
        const char* name;
        int backward;
        mfa_status status;
        const char* message;
    } cases[] = {
        {"pipeline", 1, MFA_ERROR_INTERNAL, "fake: no pipeline"},
        {"wrap dout", 1, MFA_ERROR_OUT_OF_MEMORY, "fake: cannot wrap dout"},
        {"wrap q", 0, MFA_ERROR_OUT_OF_MEMORY, "fake: cannot wrap q"},
        {"scratch", 1, MFA_ERROR_OUT_OF_MEMORY, "fake: no scratch"},
        {"buffer length", 1, MFA_ERROR_UNSUPPORTED, "fake: operand q spans"},
        {"threadgroup memory", 0, MFA_ERROR_INTERNAL, "bytes of threadgroup memory; the fake GPU"},
        {"begin", 1, MFA_ERROR_DEVICE, "fake: no commands"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        fake_device f;
        fake_init(&f);
        f.fail_pipeline = c == 0;
        f.fail_wrap = c == 1 ? (int)MFA_OPERAND_DOUT : c == 2 ? (int)MFA_OPERAND_Q : -1;
        f.fail_scratch = c == 3;
        if (c == 4) f.device.max_buffer_length = 64;
        /* Below the one 16-byte granule even a kernel that stages nothing binds. */
        if (c == 5) f.device.max_threadgroup_memory_length = 8;
        f.fail_begin = c == 6;
        const mfa_status status = mfa_gpu_run(&f.device, &p, cases[c].backward);
        CHECK(status == cases[c].status, "%s: status %d", cases[c].name, (int)status);
        CHECK(strstr(mfa_last_error(), cases[c].message) != NULL, "%s: message %s", cases[c].name,
              mfa_last_error());
        CHECK(f.encoded == 0 && f.commits == 0, "%s: %d encoded", cases[c].name, f.encoded);
        CHECK(f.live == 0 && f.released_completed == 0, "%s: %d live, %d completed", cases[c].name,
              f.live, f.released_completed);
        if (c == 1) /* dout comes after q, k, v, out, lse and delta: those were given back */
            CHECK(f.released_failed == 6, "wrap dout: %d released", f.released_failed);
        if (c < 6) CHECK(f.begins == 0, "%s: commands begun", cases[c].name);
    }
}

/* A device that fails while running: the status comes back, staged results are not copied. */
static void test_failure_while_running(void) {
    fake_device f;
    fake_init(&f);
    f.fail_commit = 1;
    const mfa_problem p = make_problem(1, 1);
    CHECK(mfa_gpu_run(&f.device, &p, true) == MFA_ERROR_DEVICE, "commit failure lost");
    CHECK(f.encoded == 2 && f.live == 0 && f.released_completed == 0 && f.released_failed > 0,
          "encoded %d, live %d, completed %d", f.encoded, f.live, f.released_completed);
}

/* A pass without threadgroups is neither compiled, bound nor encoded; a call without any runs
 * no commands. */
static void test_no_work(void) {
    fake_device f;
    fake_init(&f);
    const mfa_problem p = make_problem(0, 1);
    for (int backward = 0; backward < 2; ++backward) {
        mfa_gpu_call call;
        CHECK(mfa_gpu_call_prepare(&call, &f.device, &p, backward) == MFA_OK, "%s",
              mfa_last_error());
        CHECK(!mfa_gpu_call_has_work(&call), "batch 0 has work");
        mfa_gpu_call_finish(&call, true);
        CHECK(mfa_gpu_run(&f.device, &p, backward) == MFA_OK, "%s", mfa_last_error());
    }
    CHECK(f.pipelines == 0 && f.wraps == 0 && f.scratches == 0 && f.begins == 0,
          "pipelines %d wraps %d scratches %d begins %d", f.pipelines, f.wraps, f.scratches,
          f.begins);
}

/* Device operands are bound in place: the buffer's memory at view byte_offset + the binding's
 * offset, for exactly the binding's length, never wrapped; one byte beyond the length the
 * buffer reports, or a range starting before it, is refused naming the operand before anything
 * is encoded. */
static void test_device_operands(void) {
    for (int backward = 0; backward < 2; ++backward) {
        fake_device f;
        fake_init(&f);
        f.device_length = sizeof memory;
        mfa_problem p = make_problem(2, 1);
        to_device(&p);
        mfa_plan plan;
        CHECK((backward ? mfa_plan_backward : mfa_plan_forward)(&p, f.device.family, 1024, &plan) ==
                  MFA_OK,
              "%s", mfa_last_error());
        CHECK(mfa_gpu_run(&f.device, &p, backward) == MFA_OK, "run: %s", mfa_last_error());
        CHECK(f.wraps == 0 && f.device_buffers > 0, "%d wraps, %d device buffers", f.wraps,
              f.device_buffers);
        /* The highest byte any binding reaches, to place the buffer's end right after it. */
        int64_t end = 0;
        mfa_operand last = MFA_OPERAND_COUNT;
        for (int i = 0; i < f.encoded && i < (int)plan.num_passes; ++i) {
            for (uint32_t j = 0; j < f.passes[i].num_buffers; ++j) {
                const mfa_buffer_binding* b = &plan.passes[i].bindings[j];
                const mfa_gpu_memory* m = &f.passes[i].memory[j];
                if (b->operand == MFA_OPERAND_DELTA) continue;
                mfa_operand_view view;
                mfa_problem_operand(&p, b->operand, &view);
                const int64_t first = view.view->byte_offset + b->byte_offset;
                CHECK(m->buffer == memory && m->offset == (uint64_t)first &&
                          m->length == (uint64_t)b->byte_length,
                      "%s: bound at %llu for %llu bytes", mfa_operand_name(b->operand),
                      (unsigned long long)m->offset, (unsigned long long)m->length);
                if (first + b->byte_length > end) {
                    end = first + b->byte_length;
                    last = b->operand;
                }
            }
        }
        CHECK(f.live == 0, "%d owners left", f.live);

        fake_init(&f);
        f.device_length = (uint64_t)end;
        CHECK(mfa_gpu_run(&f.device, &p, backward) == MFA_OK, "exact fit: %s", mfa_last_error());
        fake_init(&f);
        f.device_length = (uint64_t)end - 1;
        char expected[96];
        snprintf(expected, sizeof expected, "fake: operand %s reaches bytes",
                 mfa_operand_name(last));
        CHECK_ERROR("one byte short", mfa_gpu_run(&f.device, &p, backward),
                    MFA_ERROR_INVALID_ARGUMENT, expected);
        check_nothing_ran(&f, "one byte short");

        fake_init(&f);
        f.device_length = sizeof memory;
        const int64_t saved = p.q.byte_offset;
        p.q.byte_offset = -4;
        CHECK_ERROR("before the start", mfa_gpu_run(&f.device, &p, backward),
                    MFA_ERROR_INVALID_ARGUMENT, "fake: operand q reaches bytes -4");
        check_nothing_ran(&f, "before the start");
        p.q.byte_offset = saved;

        /* A device without device memory refuses it, naming the operand. */
        static const mfa_gpu_device_ops host_only = {fake_pipeline, fake_wrap,   fake_scratch,
                                                     fake_release,  fake_encode, fake_begin,
                                                     fake_commit};
        fake_init(&f);
        f.device.ops = &host_only;
        CHECK_ERROR("host-only device", mfa_gpu_run(&f.device, &p, backward), MFA_ERROR_UNSUPPORTED,
                    "is in a device buffer");
        check_nothing_ran(&f, "host-only device");
    }
}

/* mfa_gpu_encode: everything encoded into the caller's command buffer and nothing run; the
 * call's scratch held until the command buffer reports completion, then given back (as
 * completed or not, as it says); a failure of begin_encode or end_encode gives everything back
 * at once. */
static void test_encode(void) {
    fake_device f;
    fake_init(&f);
    f.device_length = sizeof memory;
    mfa_problem p = make_problem(2, 1);
    to_device(&p);
    for (int ran = 0; ran < 2; ++ran) {
        fake_init(&f);
        f.device_length = sizeof memory;
        CHECK(mfa_gpu_encode(&f.device, &command_buffer_token, &p, true) == MFA_OK, "%s",
              mfa_last_error());
        CHECK(f.begin_encodes == 1 && f.end_encodes == 1 && f.begins == 0 && f.commits == 0,
              "begin_encode %d end_encode %d begin %d commit %d", f.begin_encodes, f.end_encodes,
              f.begins, f.commits);
        CHECK(f.encoded > 0 && f.scratches == 1 && f.live == 1,
              "%d encoded, %d scratches, %d live before completion", f.encoded, f.scratches,
              f.live);
        CHECK(f.completed != NULL, "no completion arranged");
        if (f.completed) f.completed(f.completed_arg, ran);
        CHECK(f.live == 0 && f.released_completed == ran && f.released_failed == !ran,
              "after completion: %d live, %d completed, %d failed", f.live, f.released_completed,
              f.released_failed);
    }
    for (int which = 0; which < 2; ++which) {
        fake_init(&f);
        f.device_length = sizeof memory;
        f.fail_begin_encode = which == 0;
        f.fail_end_encode = which == 1;
        CHECK_ERROR(which ? "end_encode fails" : "begin_encode fails",
                    mfa_gpu_encode(&f.device, &command_buffer_token, &p, true),
                    MFA_ERROR_INVALID_ARGUMENT, "fake: committed");
        CHECK(f.live == 0 && f.released_completed == 0 && f.completed == NULL,
              "%d live, %d completed", f.live, f.released_completed);
    }
    /* Planning fails: nothing begun. */
    fake_init(&f);
    f.device_length = sizeof memory;
    f.fail_pipeline = 1;
    CHECK(mfa_gpu_encode(&f.device, &command_buffer_token, &p, false) != MFA_OK, "no pipeline");
    CHECK(f.begin_encodes == 0 && f.live == 0, "begun %d, live %d", f.begin_encodes, f.live);
}

int main(void) {
    test_bindings();
    test_device_operands();
    test_encode();
    test_replan();
    test_failures_before_running();
    test_failure_while_running();
    test_no_work();
    return test_finish("runner tests");
}
