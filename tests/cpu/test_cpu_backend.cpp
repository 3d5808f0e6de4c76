/*
 * White-box test of the CPU backend: the dtype conversions against independent float64
 * arithmetic, then every kernel build this CPU can run (AVX-512, AVX2, the portable one) through
 * the backend's entry points against the float64 reference of test_reference.h, then concurrent
 * callers on one context. The backend is hidden inside libmfa, so this compiles its sources
 * itself, with the core's error recording (core/errors.c); it stands in for the one other core
 * function they call, mfa_dtype_size.
 */
#include "core/backend.h"
#include "core/validate.h"
#include "cpu/convert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "test_reference.h"

extern "C" size_t mfa_dtype_size(mfa_dtype dtype) {
    switch (dtype) {
        case MFA_DTYPE_F32: return 4;
        case MFA_DTYPE_F16:
        case MFA_DTYPE_BF16: return 2;
    }
    return 0;
}

/* ---- Conversions ---------------------------------------------------------------------------- */

/* The value of an IEEE half from its fields. */
static double half_value(uint16_t h) {
    const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
    double magnitude;
    if (exponent == 0)
        magnitude = ldexp(mantissa, -24);
    else if (exponent == 31)
        magnitude = mantissa ? NAN : INFINITY;
    else
        magnitude = ldexp(1024 + mantissa, exponent - 25);
    return sign ? -magnitude : magnitude;
}

/* x rounded to nearest even on a grid of `quantum` (a power of two, so x / quantum is exact). */
static double round_to_grid(double x, double quantum) { return nearbyint(x / quantum) * quantum; }

/* What rounding x to a float type with `mantissa_bits` stored bits, minimum normal exponent
 * `min_exponent` and largest finite `largest` gives, computed in float64. */
static double reference_round(float x, int mantissa_bits, int min_exponent, double largest) {
    int exponent;
    frexp(x, &exponent); /* x = f * 2^exponent, 0.5 <= |f| < 1 */
    const int e = std::max(exponent - 1, min_exponent);
    const double rounded = round_to_grid(x, ldexp(1.0, e - mantissa_bits));
    /* Past the largest finite value, round-to-nearest goes to infinity at the halfway point. */
    const double halfway = largest + ldexp(1.0, (int)floor(log2(largest)) - mantissa_bits - 1);
    if (fabs(x) >= halfway) return x > 0 ? INFINITY : -INFINITY;
    return rounded;
}

static void test_conversions() {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        const uint16_t h = (uint16_t)bits;
        const double want = half_value(h);
        const float got = mfa_cpu_f16_to_f32(h);
        CHECK(isnan(want) ? isnan(got) : got == want && signbit(got) == signbit(want),
              "f16 0x%04x -> %g, want %g", bits, (double)got, want);
        const float widened = mfa_cpu_bf16_to_f32(h);
        CHECK(mfa_cpu_f32_bits(widened) == bits << 16, "bf16 0x%04x widened to bits 0x%08x", bits,
              mfa_cpu_f32_bits(widened));
    }

    /* f32 -> f16 / bf16 over a stride of all bit patterns plus every halfway case near 1. */
    std::vector<uint32_t> samples;
    for (uint64_t bits = 0; bits < (1ull << 32); bits += 4093) samples.push_back((uint32_t)bits);
    for (uint32_t m = 0; m < 1024; ++m) {
        samples.push_back(0x3f800000u | (m << 13) | 0x1000u); /* f16 halfway points near 1 */
        samples.push_back(mfa_cpu_f32_bits(ldexpf((float)m + 0.5f, -24))); /* f16 subnormal */
    }
    for (uint32_t m = 0; m < 128; ++m)
        samples.push_back(0x3f800000u | (m << 16) | 0x8000u); /* bf16 halfway points near 1 */
    const uint32_t edges[] = {0x477ff000u, 0x477fefffu, 0x477fe000u, 0x38800000u, 0x387fffffu,
                              0x33000000u, 0x33000001u, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
                              0x00000001u, 0x80000000u, 0x7f800000u, 0xff800000u};
    samples.insert(samples.end(), edges, edges + sizeof edges / sizeof *edges);
    for (uint32_t bits : samples) {
        for (uint32_t sign : {0u, 0x80000000u}) {
            const float x = mfa_cpu_f32_from_bits(bits ^ sign);
            const float half = mfa_cpu_f16_to_f32(mfa_cpu_f32_to_f16(x));
            const float brain = mfa_cpu_bf16_to_f32(mfa_cpu_f32_to_bf16(x));
            if (isnan(x)) {
                CHECK(isnan(half) && isnan(brain), "NaN 0x%08x not kept NaN (f16 %g, bf16 %g)",
                      bits ^ sign, half, brain);
                continue;
            }
            const double want_half = reference_round(x, 10, -14, 65504.0);
            const double want_brain = reference_round(x, 7, -126, ldexp(255.0, 120));
            CHECK(half == want_half && signbit(half) == signbit(x), "f32 %a -> f16 %a, want %a",
                  (double)x, (double)half, want_half);
            CHECK(brain == want_brain && signbit(brain) == signbit(x), "f32 %a -> bf16 %a, want %a",
                  (double)x, (double)brain, want_brain);
        }
    }
}

/* ---- Attention against float64 ------------------------------------------------------------- */

/* A rank-4 tensor in one of several memory layouts, read and written through its view. */
struct Tensor {
    mfa_dtype dtype;
    int64_t shape[4];
    std::vector<char> memory;
    mfa_view view;

    /* layout 0: [B,H,N,D]; 1: [B,N,H,D]; 2: padded strides with every other element;
     * reverse: the sequence axis runs backwards (negative stride). */
    Tensor(mfa_dtype type, int64_t b, int64_t h, int64_t n, int64_t d, int layout, bool reverse)
        : dtype(type), shape{b, h, n, d} {
        int64_t s[4];
        if (layout == 0) {
            s[3] = 1, s[2] = d, s[1] = n * d, s[0] = h * n * d;
        } else if (layout == 1) {
            s[3] = 1, s[1] = d, s[2] = h * d, s[0] = n * h * d;
        } else {
            s[3] = 2, s[2] = 2 * d + 3, s[1] = s[2] * n + 5, s[0] = s[1] * h;
        }
        int64_t span = 1;
        for (int i = 0; i < 4; ++i) span += (shape[i] - 1) * s[i];
        memory.assign((size_t)span * mfa_dtype_size(dtype), 0);
        view.data = memory.data();
        for (int i = 0; i < 4; ++i) view.stride[i] = s[i];
        if (reverse) {
            view.data += (n - 1) * s[2] * (int64_t)mfa_dtype_size(dtype);
            view.stride[2] = -s[2];
        }
    }

    char* at(int64_t b, int64_t h, int64_t n, int64_t d) {
        return view.data +
               (int64_t)mfa_dtype_size(dtype) * (b * view.stride[0] + h * view.stride[1] +
                                                 n * view.stride[2] + d * view.stride[3]);
    }

    /* The view as the public API describes it, for the reference and for reading results. */
    mfa_tensor tensor() const {
        mfa_tensor t;
        t.data = view.data;
        t.dtype = dtype;
        for (int i = 0; i < 4; ++i) t.shape[i] = shape[i], t.strides[i] = view.stride[i];
        return t;
    }

    void set(int64_t b, int64_t h, int64_t n, int64_t d, float x) {
        char* p = at(b, h, n, d);
        if (dtype == MFA_DTYPE_F32) {
            memcpy(p, &x, 4);
            return;
        }
        const uint16_t bits =
            dtype == MFA_DTYPE_F16 ? mfa_cpu_f32_to_f16(x) : mfa_cpu_f32_to_bf16(x);
        memcpy(p, &bits, 2);
    }

    void fill_normal(std::mt19937& rng) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (int64_t b = 0; b < shape[0]; ++b)
            for (int64_t h = 0; h < shape[1]; ++h)
                for (int64_t n = 0; n < shape[2]; ++n)
                    for (int64_t d = 0; d < shape[3]; ++d) set(b, h, n, d, normal(rng));
    }
};

struct Case {
    const char* name;
    mfa_dtype dtype;
    int64_t batch, heads_q, heads_kv, seq_q, seq_k, dim, dim_v;
    int64_t window_left, window_right; /* causal is window_right = 0, as the core hands it over */
    bool bottom_right;
    int layout;
    bool reverse;
};

static const Case cases[] = {
    {"tiny, no mask", MFA_DTYPE_F32, 1, 2, 1, 7, 5, 3, 3, -1, -1, true, 0, false},
    {"causal, GQA, Dv < D", MFA_DTYPE_F32, 2, 4, 2, 130, 70, 33, 17, -1, 0, true, 0, false},
    {"causal top-left, Nq < Nk, bshd", MFA_DTYPE_F32, 1, 3, 3, 70, 130, 64, 80, -1, 0, false, 1,
     true},
    {"Nq > Nk causal: rows see nothing", MFA_DTYPE_F32, 1, 2, 1, 100, 60, 8, 8, -1, 0, true, 2,
     true},
    {"window 5/3", MFA_DTYPE_F32, 1, 2, 2, 90, 90, 16, 16, 5, 3, true, 0, false},
    {"diagonal only", MFA_DTYPE_F32, 1, 2, 2, 90, 90, 16, 16, 0, 0, true, 1, false},
    {"D = 1", MFA_DTYPE_F32, 1, 1, 1, 40, 50, 1, 1, -1, -1, true, 0, false},
    {"one query, one key", MFA_DTYPE_F32, 1, 1, 1, 1, 1, 2, 2, -1, -1, true, 0, false},
    {"MQA, left window only", MFA_DTYPE_F32, 1, 4, 1, 200, 129, 128, 64, 20, -1, false, 1, false},
    {"D = 1024, Dv = 7", MFA_DTYPE_F32, 1, 1, 1, 30, 40, 1024, 7, -1, -1, true, 0, false},
    {"window over many blocks, GQA", MFA_DTYPE_F32, 2, 4, 2, 300, 600, 40, 24, 100, 50, true, 1,
     true},
    {"f16 causal", MFA_DTYPE_F16, 1, 2, 1, 77, 130, 64, 64, -1, 0, true, 0, false},
    {"f16 window, Nq > Nk", MFA_DTYPE_F16, 1, 2, 2, 300, 150, 16, 48, 30, -1, true, 2, false},
    {"bf16 causal, Dv < D", MFA_DTYPE_BF16, 1, 2, 2, 77, 130, 96, 40, -1, 0, true, 1, true},
    {"bf16 top-left causal, MQA", MFA_DTYPE_BF16, 1, 4, 1, 270, 140, 64, 64, -1, 0, false, 0,
     false},
    {"bf16 D = 512", MFA_DTYPE_BF16, 1, 1, 1, 65, 65, 512, 512, -1, -1, true, 0, false},
    /* 8 query heads' packs of 260 x 1024 rows exceed the 32 MiB pack budget: the backward
     * takes the group in two passes and carries dK and dV between them. */
    {"MQA group over several backward passes", MFA_DTYPE_F32, 1, 8, 1, 260, 8, 1024, 1024, 100, -1,
     false, 0, false},
};

/* Relative error bound of a result element, scaled by (1 + |reference|). f32: accumulation over
 * up to a few thousand terms in f32 (~1e-6 each) with margin. f16/bf16: the reference is computed
 * from the same rounded inputs, so what remains is the output's own rounding (2^-11, 2^-8)
 * plus f32 accumulation; gradients combine several rounded products, hence twice the bound. */
static double tolerance(mfa_dtype dtype) {
    return dtype == MFA_DTYPE_F32 ? 2e-5 : dtype == MFA_DTYPE_F16 ? 2e-3 : 1.6e-2;
}

/* Every element of `got` within bound * (1 + |want|) of the reference (dense [b][h][n][d]);
 * where the reference is -inf (the lse of a row that sees nothing), exactly -inf. */
static void expect_close(const char* name, const char* what, const Tensor& got, const double* want,
                         double bound) {
    const mfa_tensor t = got.tensor();
    int64_t at = 0;
    for (int64_t b = 0; b < t.shape[0]; ++b)
        for (int64_t h = 0; h < t.shape[1]; ++h)
            for (int64_t n = 0; n < t.shape[2]; ++n)
                for (int64_t d = 0; d < t.shape[3]; ++d, ++at) {
                    const double g = test_get(&t, b, h, n, d), w = want[at];
                    CHECK(w == -INFINITY ? g == w : fabs(g - w) <= bound * (1.0 + fabs(w)),
                          "%s: %s[%lld,%lld,%lld,%lld] = %.9g, want %.9g", name, what, (long long)b,
                          (long long)h, (long long)n, (long long)d, g, w);
                }
}

static void run_case(const mfa_backend_ops* ops, void* state, const Case& c, std::mt19937& rng) {
    const int64_t B = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, Nq = c.seq_q, Nk = c.seq_k;
    const int64_t D = c.dim, Dv = c.dim_v, group = Hq / Hkv;
    Tensor q(c.dtype, B, Hq, Nq, D, c.layout, c.reverse);
    Tensor k(c.dtype, B, Hkv, Nk, D, (c.layout + 1) % 3, false);
    Tensor v(c.dtype, B, Hkv, Nk, Dv, c.layout, c.reverse);
    Tensor out(c.dtype, B, Hq, Nq, Dv, c.layout, false);
    Tensor lse(MFA_DTYPE_F32, B, Hq, Nq, 1, 0, c.reverse);
    Tensor dout(c.dtype, B, Hq, Nq, Dv, c.layout, false);
    Tensor dq(c.dtype, B, Hq, Nq, D, c.layout, c.reverse);
    Tensor dk(c.dtype, B, Hkv, Nk, D, c.layout, false);
    Tensor dv(c.dtype, B, Hkv, Nk, Dv, (c.layout + 2) % 3, c.reverse);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    dout.fill_normal(rng);

    mfa_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = c.dtype;
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hkv, p.group = group;
    p.seq_q = Nq, p.seq_k = Nk, p.head_dim = D, p.head_dim_v = Dv;
    p.scale = 1.3f / sqrtf((float)D);
    const int64_t diag_offset = c.bottom_right ? Nk - Nq : 0;
    mfa_visibility_band(Nq, Nk, diag_offset, c.window_left, c.window_right, &p.band_lo, &p.band_hi);
    p.q = q.view, p.k = k.view, p.v = v.view, p.out = out.view, p.lse = lse.view;
    p.dout = dout.view, p.dq = dq.view, p.dk = dk.view, p.dv = dv.view;
    const mfa_status forward = ops->forward(state, &p);
    CHECK(forward == MFA_OK, "%s: forward failed: %s", c.name, mfa_last_error());
    if (forward != MFA_OK) return;
    const mfa_status backward = ops->backward(state, &p);
    CHECK(backward == MFA_OK, "%s: backward failed: %s", c.name, mfa_last_error());
    if (backward != MFA_OK) return;

    /* The reference of the problem as the core hands it over: the causal mask is a window whose
     * right edge is the diagonal, the alignment the diagonal's offset. Its gradients are taken
     * around its own out and lse. */
    const ref_problem reference = {B,
                                   Hq,
                                   Hkv,
                                   Nq,
                                   Nk,
                                   D,
                                   Dv,
                                   p.scale,
                                   0,
                                   c.bottom_right ? MFA_ALIGN_BOTTOM_RIGHT : MFA_ALIGN_TOP_LEFT,
                                   c.window_left,
                                   c.window_right};
    const mfa_tensor tq = q.tensor(), tk = k.tensor(), tv = v.tensor(), tdout = dout.tensor();
    ref_result f = ref_forward(&reference, &tq, &tk, &tv);
    ref_result g = ref_backward(&reference, &tq, &tk, &tv, nullptr, &tdout, nullptr, &f);
    const double bound = tolerance(c.dtype);
    expect_close(c.name, "out", out, f.out, bound);
    expect_close(c.name, "lse", lse, f.lse, 2e-6);
    expect_close(c.name, "dq", dq, g.dq, 2 * bound);
    expect_close(c.name, "dk", dk, g.dk, 2 * bound);
    expect_close(c.name, "dv", dv, g.dv, 2 * bound);
    ref_free(&f);
    ref_free(&g);
}

/* Several caller threads share one context; each must get exactly what it gets alone. */
static void test_concurrent_callers(const mfa_backend_ops* ops, void* state) {
    const int64_t N = 300, D = 32, H = 2;
    const int callers = 6;
    struct Problem {
        std::vector<float> qkv, out;
        mfa_problem p;
    };
    auto make = [&](int seed, Problem& problem) {
        std::mt19937 rng((unsigned)seed);
        std::normal_distribution<float> normal;
        problem.qkv.resize((size_t)(H * N * D));
        for (float& x : problem.qkv) x = normal(rng);
        problem.out.assign((size_t)(H * N * D), 0.0f);
        mfa_problem& p = problem.p;
        memset(&p, 0, sizeof p);
        p.dtype = MFA_DTYPE_F32, p.batch = 1, p.heads_q = H, p.heads_kv = H, p.group = 1;
        p.seq_q = N, p.seq_k = N, p.head_dim = D, p.head_dim_v = D, p.scale = 0.2f;
        mfa_visibility_band(N, N, 0, -1, seed % 2 ? 0 : -1, &p.band_lo, &p.band_hi);
        mfa_view view = {(char*)problem.qkv.data(), {H * N * D, N * D, D, 1}};
        p.q = p.k = p.v = view;
        view.data = (char*)problem.out.data();
        p.out = view;
    };
    std::vector<Problem> alone((size_t)callers);
    for (int t = 0; t < callers; ++t) {
        make(t, alone[(size_t)t]);
        ops->forward(state, &alone[(size_t)t].p);
    }
    std::vector<int> mismatches((size_t)callers, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < callers; ++t)
        threads.emplace_back([&, t] {
            Problem mine;
            make(t, mine);
            for (int repeat = 0; repeat < 10; ++repeat) {
                std::fill(mine.out.begin(), mine.out.end(), 0.0f);
                if (ops->forward(state, &mine.p) != MFA_OK ||
                    memcmp(mine.out.data(), alone[(size_t)t].out.data(), mine.out.size() * 4))
                    ++mismatches[(size_t)t];
            }
        });
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < callers; ++t)
        CHECK(mismatches[(size_t)t] == 0,
              "concurrent caller %d: %d of 10 results differ from its result alone", t,
              mismatches[(size_t)t]);
}

static void test_kernel_build(const mfa_backend_ops* ops, const char* isa) {
    setenv("MFA_CPU_ISA", isa, 1);
    mfa_context_options options;
    memset(&options, 0, sizeof options);
    options.num_threads = 3;
    void* state = nullptr;
    const mfa_status status = ops->create(&options, &state);
    if (status == MFA_ERROR_UNSUPPORTED) {
        printf("kernel build %s: skipped (%s)\n", isa, mfa_last_error());
        return;
    }
    CHECK(status == MFA_OK, "create with MFA_CPU_ISA=%s: %s", isa, mfa_last_error());
    if (status != MFA_OK) return;
    printf("kernel build %s: %s\n", isa, ops->device_name(state));
    std::mt19937 rng(7);
    for (const Case& c : cases) {
        run_case(ops, state, c, rng);
    }
    test_concurrent_callers(ops, state);
    ops->destroy(state);
}

int main() {
    test_conversions();
    printf("conversions: %s\n", test_failures ? "FAILED" : "ok");

    const mfa_backend_ops* ops = mfa_cpu_backend_ops();
    CHECK(ops->backend == MFA_BACKEND_CPU && ops->available(),
          "the ops table is not an available cpu backend");
#if defined(__x86_64__)
    const char* builds[] = {"avx512", "avx2", "portable"};
#else
    const char* builds[] = {"portable"};
#endif
    for (const char* isa : builds) test_kernel_build(ops, isa);

    setenv("MFA_CPU_ISA", "no-such-isa", 1);
    void* state = nullptr;
    CHECK_ERROR("MFA_CPU_ISA=no-such-isa", ops->create(nullptr, &state), MFA_ERROR_INVALID_ARGUMENT,
                "no-such-isa");
    unsetenv("MFA_CPU_ISA");

    return test_finish("cpu backend");
}
