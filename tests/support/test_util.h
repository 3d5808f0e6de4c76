/* Small helpers shared by the C tests: strided test tensors, the tensors and options of one
 * attention call, checked contexts and the loop over every available backend (with the main of a
 * suite run one section at a time), and f16 / bf16 conversions written independently of the
 * library. Checks are check.h's. */
#ifndef MFA_TEST_UTIL_H
#define MFA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mfa.h"

/* The float64 reference (test_reference.h) and the element reads and conversions it goes through
 * are the tests' oracle, not the library under test: the sanitizer builds leave them
 * uninstrumented. Instrumented, they were 72 % of the CPU backend's white-box test under ASan and
 * UBSan (84 s against 30 without); what the sanitizers check is libmfa, and the tests' reads of
 * its outputs come after its writes, where a stray write was already caught. */
#if defined(__clang__)
/* One string literal, as _Pragma takes: */
/* clang-format off */
#define TEST_ORACLE_BEGIN \
    _Pragma("clang attribute push(__attribute__((no_sanitize(\"address\", \"undefined\"))), apply_to = function)")
/* clang-format on */
#define TEST_ORACLE_END _Pragma("clang attribute pop")
#else
#define TEST_ORACLE_BEGIN
#define TEST_ORACLE_END
#endif

/* A deterministic generator (xorshift64*), uniform in [-1, 1). */
static uint64_t test_rng_state = 0x9E3779B97F4A7C15ull;
static double test_uniform(void) {
    test_rng_state ^= test_rng_state >> 12;
    test_rng_state ^= test_rng_state << 25;
    test_rng_state ^= test_rng_state >> 27;
    uint64_t x = test_rng_state * 0x2545F4914F6CDD1Dull;
    return (double)(x >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

TEST_ORACLE_BEGIN
/* IEEE binary16 and bfloat16, round to nearest even. */
static uint16_t test_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) ++half;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
    return (uint16_t)(sign | half);
}
/* Bit for bit, unlike the library's conversion (which scales the significand), so that the
 * two stay independent: a normal half's exponent rebiased (15 to 127) and its mantissa widened;
 * a subnormal one is mant x 2^-24, exact in f32; NaN stays a (quiet) NaN. */
static float test_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * (float)mant * 0x1p-24f;
    const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (mant ? 0x400000u : 0u)
                                    : sign | ((exp + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static uint16_t test_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
static float test_bf16_to_f32(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
TEST_ORACLE_END

/* Memory layouts of a test tensor: [B, H, S, D] ("bhsd"), [B, S, H, D] ("bshd"), or bhsd with
 * the sequence reversed through a negative stride. */
typedef enum test_layout { TEST_BHSD = 0, TEST_BSHD = 1, TEST_REVERSED = 2 } test_layout;

/* A test tensor owning its storage, which is exactly the tensor's extent so that
 * AddressSanitizer builds catch any access outside it. */
typedef struct test_tensor {
    mfa_tensor t;
    void* storage;
    size_t bytes;
} test_tensor;

static test_tensor test_tensor_make(mfa_dtype dtype, int64_t b, int64_t h, int64_t s, int64_t d,
                                    test_layout layout) {
    test_tensor x;
    memset(&x, 0, sizeof x);
    x.t.dtype = dtype;
    x.t.shape[0] = b;
    x.t.shape[1] = h;
    x.t.shape[2] = s;
    x.t.shape[3] = d;
    if (layout == TEST_BSHD) {
        x.t.strides[3] = 1;
        x.t.strides[1] = d;
        x.t.strides[2] = h * d;
        x.t.strides[0] = s * h * d;
    } else {
        x.t.strides[3] = 1;
        x.t.strides[2] = d;
        x.t.strides[1] = s * d;
        x.t.strides[0] = h * s * d;
    }
    x.bytes = (size_t)(b * h * s * d) * mfa_dtype_size(dtype);
    x.storage = malloc(x.bytes);
    x.t.data = x.storage;
    if (layout == TEST_REVERSED && s > 0) {
        x.t.data = (char*)x.storage + (size_t)((s - 1) * d) * mfa_dtype_size(dtype);
        x.t.strides[2] = -d;
    }
    return x;
}

/* The mfa_array of a tensor view, in host memory. */
static mfa_array test_array_of(const mfa_tensor* t) {
    mfa_array a;
    memset(&a, 0, sizeof a);
    a.data = t->data;
    a.dtype = t->dtype;
    memcpy(a.shape, t->shape, sizeof a.shape);
    memcpy(a.strides, t->strides, sizeof a.strides);
    return a;
}

static int64_t test_element_count(const mfa_tensor* t) {
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

TEST_ORACLE_BEGIN
static int64_t test_offset(const mfa_tensor* t, int64_t b, int64_t h, int64_t s, int64_t d) {
    return b * t->strides[0] + h * t->strides[1] + s * t->strides[2] + d * t->strides[3];
}

static double test_get(const mfa_tensor* t, int64_t b, int64_t h, int64_t s, int64_t d) {
    int64_t o = test_offset(t, b, h, s, d);
    switch (t->dtype) {
        case MFA_DTYPE_F32: return ((const float*)t->data)[o];
        case MFA_DTYPE_F16: return test_f16_to_f32(((const uint16_t*)t->data)[o]);
        default: return test_bf16_to_f32(((const uint16_t*)t->data)[o]);
    }
}

TEST_ORACLE_END

static void test_set(const mfa_tensor* t, int64_t b, int64_t h, int64_t s, int64_t d, float v) {
    int64_t o = test_offset(t, b, h, s, d);
    switch (t->dtype) {
        case MFA_DTYPE_F32: ((float*)t->data)[o] = v; break;
        case MFA_DTYPE_F16: ((uint16_t*)t->data)[o] = test_f32_to_f16(v); break;
        default: ((uint16_t*)t->data)[o] = test_f32_to_bf16(v); break;
    }
}

/* Uniform values in [-1, 1), stored in the view's dtype, through every element of the view. */
static void test_fill_view_random(const mfa_tensor* t) {
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d)
                    test_set(t, b, h, s, d, (float)test_uniform());
}

static void test_fill_random(test_tensor* x) { test_fill_view_random(&x->t); }

/* NaN in every element (all-ones bits in every dtype): an output element the library does not
 * write shows. */
static void test_fill_nan(test_tensor* x) { memset(x->storage, 0xff, x->bytes); }

static void test_tensor_free(test_tensor* x) {
    free(x->storage);
    x->storage = NULL;
}

/* The nine tensors of one forward + backward call, in one dtype and layout (lse: f32, bhsd),
 * with q, k, v and dout filled at random in that order and the outputs left uninitialized. */
typedef struct test_attention {
    test_tensor q, k, v, out, lse, dout, dq, dk, dv;
} test_attention;

static test_attention test_attention_make(mfa_dtype dtype, int64_t b, int64_t hq, int64_t hkv,
                                          int64_t nq, int64_t nk, int64_t d, int64_t dv,
                                          test_layout layout) {
    test_attention a;
    a.q = test_tensor_make(dtype, b, hq, nq, d, layout);
    a.k = test_tensor_make(dtype, b, hkv, nk, d, layout);
    a.v = test_tensor_make(dtype, b, hkv, nk, dv, layout);
    a.out = test_tensor_make(dtype, b, hq, nq, dv, layout);
    a.lse = test_tensor_make(MFA_DTYPE_F32, b, hq, nq, 1, TEST_BHSD);
    a.dout = test_tensor_make(dtype, b, hq, nq, dv, layout);
    a.dq = test_tensor_make(dtype, b, hq, nq, d, layout);
    a.dk = test_tensor_make(dtype, b, hkv, nk, d, layout);
    a.dv = test_tensor_make(dtype, b, hkv, nk, dv, layout);
    test_fill_random(&a.q);
    test_fill_random(&a.k);
    test_fill_random(&a.v);
    test_fill_random(&a.dout);
    return a;
}

static void test_attention_free(test_attention* a) {
    test_tensor* all[] = {&a->q, &a->k, &a->v, &a->out, &a->lse, &a->dout, &a->dq, &a->dk, &a->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
}

/* The gradients of a backward over q [b, hq, nq, d] and k, v [b, hkv, nk, d or dv]: dq in q's
 * layout, dk and dv in kv_layout, NaN-filled so that an element the library does not write
 * shows. */
typedef struct test_gradients {
    test_tensor dq, dk, dv;
} test_gradients;

static test_gradients test_gradients_make(mfa_dtype dtype, int64_t b, int64_t hq, int64_t hkv,
                                          int64_t nq, int64_t nk, int64_t d, int64_t dv,
                                          test_layout q_layout, test_layout kv_layout) {
    test_gradients g = {test_tensor_make(dtype, b, hq, nq, d, q_layout),
                        test_tensor_make(dtype, b, hkv, nk, d, kv_layout),
                        test_tensor_make(dtype, b, hkv, nk, dv, kv_layout)};
    test_tensor* all[] = {&g.dq, &g.dk, &g.dv};
    for (int i = 0; i < 3; ++i) test_fill_nan(all[i]);
    return g;
}

static void test_gradients_free(test_gradients* g) {
    test_tensor* all[] = {&g->dq, &g->dk, &g->dv};
    for (int i = 0; i < 3; ++i) test_tensor_free(all[i]);
}

/* Attention options from a test's mask and scale (scale 0: the library's default). */
static mfa_attention_params test_params(int causal, mfa_alignment alignment, int64_t window_left,
                                        int64_t window_right, float scale) {
    mfa_attention_params params;
    mfa_attention_params_init(&params);
    params.causal = causal;
    params.alignment = alignment;
    params.window_left = window_left;
    params.window_right = window_right;
    params.scale = scale;
    return params;
}

/* A dense attention problem of a test: sizes, options, the layout of its tensors. */
typedef struct test_problem {
    const char* name;
    mfa_dtype dtype;
    int64_t b, hq, hkv, nq, nk, d, dv;
    int causal;
    mfa_alignment alignment;
    int64_t left, right;
    test_layout layout;
    float scale; /* 0: the library's default */
} test_problem;

/* A context of an available backend, or NULL with a failed check naming `label`. */
static mfa_context* test_context(mfa_backend backend, const mfa_context_options* options,
                                 const char* label) {
    mfa_context* ctx = NULL;
    if (mfa_context_create(backend, options, &ctx) != MFA_OK) {
        CHECK(0, "cannot create a %s context: %s", label, mfa_last_error());
        return NULL;
    }
    return ctx;
}

/* The backends of the suites that run on each one that is available, in this order. */
static const mfa_backend test_backends[] = {MFA_BACKEND_CPU, MFA_BACKEND_METAL_SIM,
                                            MFA_BACKEND_METAL};
#define TEST_BACKEND_COUNT ((int)(sizeof test_backends / sizeof test_backends[0]))

/* A context of test_backends[i] (options NULL: the defaults; they apply to cpu and metal-sim
 * only), or NULL where that backend is not available (or cannot be created: a failed check). */
static mfa_context* test_backend_context(int i, const mfa_context_options* options) {
    const mfa_backend backend = test_backends[i];
    if (!mfa_backend_available(backend)) return NULL;
    return test_context(backend, backend == MFA_BACKEND_METAL ? NULL : options,
                        mfa_backend_name(backend));
}

/* run(ctx, backend) on a context of each available backend of test_backends in turn (options as
 * test_backend_context's), destroyed after it; returns how many backends ran. */
static int test_each_backend(const mfa_context_options* options,
                             void (*run)(mfa_context* ctx, mfa_backend backend)) {
    int ran = 0;
    for (int i = 0; i < TEST_BACKEND_COUNT; ++i) {
        mfa_context* ctx = test_backend_context(i, options);
        if (!ctx) continue;
        run(ctx, test_backends[i]);
        mfa_context_destroy(ctx);
        ++ran;
    }
    return ran;
}

/* The section of a sectioned suite (test_main_sections) being run, and how. */
static struct {
    const char *suite, *name;
    void (*run)(const char* section, mfa_context* ctx, mfa_backend backend);
} test_section;

static void test_run_section(mfa_context* ctx, mfa_backend backend) {
    const int failures_before = test_failures;
    test_section.run(test_section.name, ctx, backend);
    printf("%s %s: %s %s\n", test_section.suite, test_section.name, mfa_backend_name(backend),
           test_failures == failures_before ? "passed" : "FAILED");
}

/* The main of a suite that ctest runs one section at a time: argv[1] must name one of the count
 * `sections` (else a usage line and exit status 2); run(section, ctx, backend) on the default
 * context of each available backend, with a line per backend saying whether it passed. Returns
 * main's exit status (test_finish). */
static int
test_main_sections(int argc, char** argv, const char* suite, const char* const* sections, int count,
                   void (*run)(const char* section, mfa_context* ctx, mfa_backend backend)) {
    const char* section = argc > 1 ? argv[1] : "";
    int known = 0;
    for (int i = 0; i < count; ++i) known |= strcmp(section, sections[i]) == 0;
    if (!known) {
        fprintf(stderr, "usage: %s", argv[0]);
        for (int i = 0; i < count; ++i) fprintf(stderr, "%s%s", i ? "|" : " ", sections[i]);
        fputc('\n', stderr);
        return 2;
    }
    test_section.suite = suite;
    test_section.name = section;
    test_section.run = run;
    CHECK(test_each_backend(NULL, test_run_section) > 0, "no backend ran");
    return test_finish(suite);
}

#endif
