/* Keeps docs/bad-inputs.md true: every row of its matrix is run here and must give the status
 * and a message containing the text the row states, with no output byte written; every bad
 * input this file knows must have a row, and every row a case here.
 *
 * Usage: test_bad_inputs_doc PATH/TO/docs/bad-inputs.md */
#include "test_util.h"

enum { B = 2, HQ = 4, HKV = 2, NQ = 5, NK = 7, D = 8, DV = 6 };
#define SENTINEL 0x5C

/* A valid forward and backward problem that each case breaks in one place. */
typedef struct fixture {
    test_attention a;
    mfa_attention_params params;
    int pass_q, pass_k, pass_v, pass_out, pass_lse; /* 0: that argument is NULL */
    mfa_context* ctx;
    mfa_status status; /* for cases that make their own call */
    void* pointer;     /* for cases that return a pointer */
} fixture;

static mfa_context* cpu_context;

static fixture fixture_make(void) {
    fixture f;
    memset(&f, 0, sizeof f);
    f.a = test_attention_make(MFA_DTYPE_F32, B, HQ, HKV, NQ, NK, D, DV, 0);
    test_fill_random(&f.a.out);
    test_fill_random(&f.a.lse);
    mfa_attention_params_init(&f.params);
    f.pass_q = f.pass_k = f.pass_v = f.pass_out = f.pass_lse = 1;
    f.ctx = cpu_context;
    return f;
}

static void fixture_free(fixture* f) { test_attention_free(&f->a); }

enum kind { FORWARD, BACKWARD, CALL };

static mfa_context* created;
static mfa_context_options options;
static mfa_capabilities caps;

static mfa_status create_with(int backend, void (*change)(mfa_context_options*)) {
    mfa_context_options_init(&options);
    if (change) change(&options);
    return mfa_context_create((mfa_backend)backend, &options, &created);
}
static void options_size(mfa_context_options* o) { o->struct_size = 3; }
static void threads_negative(mfa_context_options* o) { o->num_threads = -1; }
static void threads_too_many(mfa_context_options* o) { o->num_threads = 4097; }
static void family_unknown(mfa_context_options* o) { o->gpu_family = (mfa_gpu_family)5; }
static void family_set(mfa_context_options* o) { o->gpu_family = MFA_GPU_FAMILY_APPLE8; }
static void seed_set(mfa_context_options* o) { o->sim_schedule_seed = 42; }

/* Gives x a fresh storage of n elements (poisoned like any output), keeping its view. */
static void widen(test_tensor* x, size_t n) {
    free(x->storage);
    x->bytes = n * mfa_dtype_size(x->t.dtype);
    x->storage = calloc(n, mfa_dtype_size(x->t.dtype));
    x->t.data = x->storage;
}

/* out laid out in B and H with strides 150 and 60 (blocks of 30 = N x Dv elements): block
 * starts 60h + 150b are distinct for h < 4, b < 2, so no two elements share an address, but
 * 150 does not exceed the 209 elements the smaller strides span. */
static void out_distinct_but_not_nested(fixture* f) {
    widen(&f->a.out, 150 + 3 * 60 + 30);
    f->a.out.t.strides[0] = 150;
    f->a.out.t.strides[1] = 60;
}

/* q and out share one buffer of 16-element rows: q uses elements 0..7 of each row, out 8..13.
 * No byte is shared, but each one's extent contains the other's. */
static void out_interleaved_with_q(fixture* f) {
    widen(&f->a.q, (size_t)B * HQ * NQ * 16);
    const int64_t strides[4] = {HQ * NQ * 16, NQ * 16, 16, 1};
    memcpy(f->a.q.t.strides, strides, sizeof strides);
    test_fill_random(&f->a.q);
    f->a.out.t.data = (float*)f->a.q.storage + 8;
    memcpy(f->a.out.t.strides, strides, sizeof strides);
}

/* X(id, kind, statements breaking fixture f): the rows of docs/bad-inputs.md. */
#define BAD_INPUTS(X)                                                                              \
    X("ctx-null", FORWARD, f->ctx = NULL)                                                          \
    X("create-out-null", CALL, f->status = mfa_context_create(MFA_BACKEND_CPU, NULL, NULL))        \
    X("create-backend-unknown", CALL, f->status = create_with(42, NULL))                           \
    X("create-options-size", CALL, f->status = create_with(MFA_BACKEND_CPU, options_size))         \
    X("create-threads-negative", CALL, f->status = create_with(MFA_BACKEND_CPU, threads_negative)) \
    X("create-threads-too-many", CALL, f->status = create_with(MFA_BACKEND_CPU, threads_too_many)) \
    X("create-family-unknown", CALL,                                                               \
      f->status = create_with(MFA_BACKEND_METAL_SIM, family_unknown))                              \
    X("create-family-not-sim", CALL, f->status = create_with(MFA_BACKEND_CPU, family_set))         \
    X("create-seed-not-sim", CALL, f->status = create_with(MFA_BACKEND_CPU, seed_set))             \
    X("caps-null", CALL, f->status = mfa_context_capabilities(cpu_context, NULL))                  \
    X("caps-size", CALL, caps.struct_size = 4;                                                     \
      f->status = mfa_context_capabilities(cpu_context, &caps))                                    \
    X("tensor-null", FORWARD, f->pass_k = 0)                                                       \
    X("out-null", FORWARD, f->pass_out = 0)                                                        \
    X("data-null", FORWARD, f->a.v.t.data = NULL)                                                  \
    X("dtype-unknown", FORWARD, f->a.q.t.dtype = (mfa_dtype)9)                                     \
    X("dtype-mixed", FORWARD, f->a.k.t.dtype = MFA_DTYPE_F16)                                      \
    X("out-dtype", FORWARD, f->a.out.t.dtype = MFA_DTYPE_BF16)                                     \
    X("lse-dtype", FORWARD, f->a.lse.t.dtype = MFA_DTYPE_F16)                                      \
    X("shape-zero", FORWARD, f->a.q.t.shape[2] = 0)                                                \
    X("shape-negative", FORWARD, f->a.v.t.shape[3] = -4)                                           \
    X("batch-mismatch", FORWARD, f->a.v.t.shape[0] = 1)                                            \
    X("head-dim-mismatch", FORWARD, f->a.k.t.shape[3] = D + 1)                                     \
    X("kv-heads-mismatch", FORWARD, f->a.v.t.shape[1] = 1)                                         \
    X("kv-seq-mismatch", FORWARD, f->a.v.t.shape[2] = NK - 1)                                      \
    X("heads-not-multiple", FORWARD, f->a.q.t.shape[1] = 3; f->a.out.t.shape[1] = 3;               \
      f->a.lse.t.shape[1] = 3)                                                                     \
    X("out-shape", FORWARD, f->a.out.t.shape[3] = D)                                               \
    X("lse-shape", FORWARD, f->a.lse.t.shape[3] = 2)                                               \
    X("lse-shape-zero", FORWARD, f->a.lse.t.shape[3] = 0)                                          \
    X("head-dim-too-large", FORWARD, f->a.q.t.shape[3] = f->a.k.t.shape[3] = (int64_t)1 << 20;     \
      f->a.q.t.strides[3] = f->a.k.t.strides[3] = 0)                                               \
    X("element-count-overflow", FORWARD, f->a.q.t.shape[0] = (int64_t)1 << 40;                     \
      f->a.q.t.shape[2] = (int64_t)1 << 40; f->a.q.t.strides[0] = f->a.q.t.strides[2] = 0)         \
    X("offset-overflow", FORWARD, f->a.k.t.strides[2] = INT64_MAX / 2)                             \
    X("offset-int64-max", FORWARD, f->a.k.t.strides[2] = (INT64_MAX - 175) / 6)                    \
    X("address-overflow", FORWARD, f->a.v.t.strides[0] = (int64_t)1 << 61)                         \
    X("address-negative", FORWARD, f->a.v.t.strides[1] = -((int64_t)1 << 60))                      \
    X("misaligned", FORWARD, f->a.k.t.data = (char*)f->a.k.t.data + 2)                             \
    X("output-broadcast", FORWARD, f->a.out.t.strides[1] = 0)                                      \
    X("output-self-overlap", FORWARD, f->a.out.t.strides[2] = 2)                                   \
    X("output-aliases-input", FORWARD, f->a.out.t.data = f->a.q.t.data)                            \
    X("outputs-alias", FORWARD, f->a.lse.t.data = f->a.out.t.data)                                 \
    X("output-strides-not-nested", FORWARD, out_distinct_but_not_nested(f))                        \
    X("output-extent-interleaves", FORWARD, out_interleaved_with_q(f))                             \
    X("params-size", FORWARD, f->params.struct_size = sizeof f->params - 8)                        \
    X("scale-nan", FORWARD, f->params.scale = NAN)                                                 \
    X("scale-inf", FORWARD, f->params.scale = -INFINITY)                                           \
    X("causal-flag", FORWARD, f->params.causal = 2)                                                \
    X("alignment-unknown", FORWARD, f->params.alignment = (mfa_alignment)3)                        \
    X("window-below-minus-one", FORWARD, f->params.window_right = -5)                              \
    X("backward-lse-null", BACKWARD, f->pass_lse = 0)                                              \
    X("backward-dout-shape", BACKWARD, f->a.dout.t.shape[2] = NQ + 1)                              \
    X("backward-grad-dtype", BACKWARD, f->a.dq.t.dtype = MFA_DTYPE_F16)                            \
    X("backward-grad-aliases-input", BACKWARD, f->a.dk.t.data = f->a.k.t.data)                     \
    X("backward-grads-alias", BACKWARD, f->a.dv.t.data = f->a.dq.t.data)                           \
    X("backward-grad-broadcast", BACKWARD, f->a.dv.t.strides[2] = 0)                               \
    X("alloc-overflow", CALL, f->pointer = mfa_alloc(SIZE_MAX);                                    \
      f->status = f->pointer == NULL ? MFA_ERROR_SIZE_OVERFLOW : MFA_OK)

#define ID(id, kind, ...)   id,
#define KIND(id, kind, ...) kind,
#define APPLY(id, kind, ...)                                                                       \
    if (index == i++) {                                                                            \
        __VA_ARGS__;                                                                               \
    }

static const char* const ids[] = {BAD_INPUTS(ID)};
static const int kinds[] = {BAD_INPUTS(KIND)};
#define CASE_COUNT ((int)(sizeof ids / sizeof ids[0]))

static void break_fixture(int index, fixture* f) {
    int i = 0;
    BAD_INPUTS(APPLY)
}

static int find_case(const char* id) {
    for (int i = 0; i < CASE_COUNT; ++i)
        if (strcmp(ids[i], id) == 0) return i;
    return -1;
}

static const char* status_name(mfa_status s) {
    switch (s) {
        case MFA_OK: return "MFA_OK";
        case MFA_ERROR_INVALID_ARGUMENT: return "MFA_ERROR_INVALID_ARGUMENT";
        case MFA_ERROR_UNSUPPORTED: return "MFA_ERROR_UNSUPPORTED";
        case MFA_ERROR_BACKEND_UNAVAILABLE: return "MFA_ERROR_BACKEND_UNAVAILABLE";
        case MFA_ERROR_OUT_OF_MEMORY: return "MFA_ERROR_OUT_OF_MEMORY";
        case MFA_ERROR_SIZE_OVERFLOW: return "MFA_ERROR_SIZE_OVERFLOW";
        case MFA_ERROR_DEVICE: return "MFA_ERROR_DEVICE";
        case MFA_ERROR_INTERNAL: return "MFA_ERROR_INTERNAL";
    }
    return "unknown";
}

static void poison(test_tensor* x) { memset(x->storage, SENTINEL, x->bytes); }

static int untouched(const test_tensor* x) {
    for (size_t i = 0; i < x->bytes; ++i)
        if (((const unsigned char*)x->storage)[i] != SENTINEL) return 0;
    return 1;
}

/* A message no row expects ("caps->struct_size = 0; ..."), so a row whose call forgot to set
 * its own cannot pass on a leftover one. */
static void plant_stale_message(void) {
    mfa_capabilities tiny;
    tiny.struct_size = 0;
    mfa_context_capabilities(cpu_context, &tiny);
}

/* Runs one row: status and message as the doc says, nothing written. */
static void check_row(const char* id, const char* want_status, const char* want_text) {
    const int index = find_case(id);
    if (index < 0) {
        CHECK(0, "docs/bad-inputs.md row `%s` has no case in test_bad_inputs_doc.c", id);
        return;
    }
    fixture f = fixture_make();
    plant_stale_message();
    break_fixture(index, &f);
    test_tensor* inputs[] = {&f.a.q, &f.a.k, &f.a.v, &f.a.dout};
    unsigned char* before[4];
    for (int i = 0; i < 4; ++i) {
        before[i] = (unsigned char*)malloc(inputs[i]->bytes);
        memcpy(before[i], inputs[i]->storage, inputs[i]->bytes);
    }
    mfa_status status = f.status;
    if (kinds[index] == FORWARD) {
        poison(&f.a.out);
        poison(&f.a.lse);
        status =
            mfa_attention_forward(f.ctx, &f.params, f.pass_q ? &f.a.q.t : NULL,
                                  f.pass_k ? &f.a.k.t : NULL, f.pass_v ? &f.a.v.t : NULL,
                                  f.pass_out ? &f.a.out.t : NULL, f.pass_lse ? &f.a.lse.t : NULL);
        CHECK(untouched(&f.a.out) && untouched(&f.a.lse), "%s: an output was written", id);
    } else if (kinds[index] == BACKWARD) {
        poison(&f.a.dq);
        poison(&f.a.dk);
        poison(&f.a.dv);
        status = mfa_attention_backward(f.ctx, &f.params, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t,
                                        &f.a.dout.t, f.pass_lse ? &f.a.lse.t : NULL, &f.a.dq.t,
                                        &f.a.dk.t, &f.a.dv.t);
        CHECK(untouched(&f.a.dq) && untouched(&f.a.dk) && untouched(&f.a.dv),
              "%s: a gradient was written", id);
    }
    for (int i = 0; i < 4; ++i) {
        CHECK(memcmp(before[i], inputs[i]->storage, inputs[i]->bytes) == 0,
              "%s: an input was written", id);
        free(before[i]);
    }
    mfa_free(f.pointer);
    if (created) {
        mfa_context_destroy(created);
        created = NULL;
        CHECK(0, "%s: a context was created", id);
    }
    const char* message = mfa_last_error();
    CHECK(strcmp(status_name(status), want_status) == 0,
          "%s: status %s, the doc says %s (message: %s)", id, status_name(status), want_status,
          message);
    CHECK(strstr(message, want_text) != NULL,
          "%s: message \"%s\" does not contain the doc's \"%s\"", id, message, want_text);
    fixture_free(&f);
}

/* A cell with surrounding blanks and one pair of backticks removed, in place. */
static char* cell_text(char* cell) {
    while (*cell == ' ') ++cell;
    char* end = cell + strlen(cell);
    while (end > cell && end[-1] == ' ') *--end = '\0';
    if (end - cell >= 2 && cell[0] == '`' && end[-1] == '`') {
        end[-1] = '\0';
        ++cell;
    }
    return cell;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s docs/bad-inputs.md\n", argv[0]);
        return 2;
    }
    FILE* doc = fopen(argv[1], "r");
    if (!doc) {
        perror(argv[1]);
        return 1;
    }
    cpu_context = test_context(MFA_BACKEND_CPU, NULL, "cpu");
    if (!cpu_context) return 1;
    int documented[sizeof ids / sizeof ids[0]] = {0};
    int rows = 0, in_matrix = 0;
    char line[1024];
    /* The matrix is the table under the "## The matrix" heading: | `id` | input | `status` | `text` | */
    while (fgets(line, sizeof line, doc)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "## ", 3) == 0) in_matrix = strcmp(line, "## The matrix") == 0;
        if (!in_matrix || strncmp(line, "| `", 3) != 0) continue;
        char* cells[5];
        int n = 0;
        for (char* p = strtok(line + 1, "|"); p && n < 5; p = strtok(NULL, "|"))
            cells[n++] = cell_text(p);
        if (n != 4) {
            CHECK(0, "malformed matrix row (needs 4 cells): %s", line);
            continue;
        }
        const int index = find_case(cells[0]);
        if (index >= 0) {
            CHECK(!documented[index], "row `%s` appears twice", cells[0]);
            documented[index] = 1;
        }
        check_row(cells[0], cells[2], cells[3]);
        ++rows;
    }
    fclose(doc);
    for (int i = 0; i < CASE_COUNT; ++i)
        CHECK(documented[i], "bad input `%s` is tested here but has no row in the doc", ids[i]);
    mfa_context_destroy(cpu_context);
    printf("test_bad_inputs_doc: %d rows checked\n", rows);
    return test_finish("test_bad_inputs_doc");
}
