/*
 * Choosing the instruction set the CPU kernels run at.
 *
 * How the SIMD code is written, and why: the kernels are written once, with GCC/Clang vector
 * extensions (`float __attribute__((vector_size(N)))`), and that one source is compiled several
 * times (kernels_<isa>.cpp) with different target flags into separate, internally linked copies.
 *   - Intrinsics would need a hand-written copy of every kernel per ISA (AVX-512, AVX2, NEON, SSE)
 *     to keep in sync; the vector extensions give one copy that GCC >= 9 and Clang (including
 *     Apple clang, where NEON is the baseline) lower to each ISA's registers and FMAs.
 *   - A portable SIMD library (Highway, xsimd) would do the same job but adds a dependency every
 *     user must build, for the half-dozen operations the kernels need (FMA, loads, broadcast,
 *     compare/select, exp2 from integer bit tricks).
 *   - Per-file flags rather than target attributes, because attributes do not propagate into
 *     inlined templates and would have to be spelled on every helper.
 * Register blocking is explicit in the source (gemm.inl), so code quality does not depend on the
 * auto-vectorizer; the compiler only allocates registers and unrolls fixed-count loops.
 *
 * Selection happens once per context, here, with cpuid (__builtin_cpu_supports, which also checks
 * that the OS saves the wide registers). No code compiled with AVX flags runs unless this says so,
 * so the library loads and runs on any x86-64; on arm64 the kernel's hardware capabilities
 * (HWCAP2, or sysctl on macOS) say whether BF16 is there. AMX is the one feature the OS must also
 * grant per process: Linux leaves the 8 KiB tile data state off until the process asks for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM), so the AMX build is chosen only once that request succeeds.
 * f16 operands are widened to f32 on every build: AVX512-FP16 multiplies and accumulates in f16,
 * whose 11-bit significand does not hold a sum over thousands of keys, and AMX-FP16 (f32 sums)
 * is on no CPU this was measured on.
 * MFA_CPU_ISA in the environment pins one build ("amxbf16", "avx512bf16", "avx512", "avx2",
 * "neonbf16" or "portable") so tests can cover every compiled path; asking for one the CPU lacks
 * is an error, never a silent substitution.
 */
#include "cpu/isa_select.h"

#include "cpu/cpu_features.h"

#include <stdlib.h>
#include <string.h>

namespace {

struct isa_choice {
    const char* name;
    const mfa_cpu_kernels* (*kernels)(void);
    bool (*supported)(void);
};

bool always(void) { return true; }

#if defined(__x86_64__)
bool has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("fma");
}

bool has_avx512_bf16(void) {
    __builtin_cpu_init();
    return has_avx512() && __builtin_cpu_supports("avx512bf16");
}

/* AMX-BF16 with the tile data state granted (cpu_features.h). */
bool has_amx_bf16(void) { return has_avx512_bf16() && mfa_cpu_amx_bf16_granted(); }

bool has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

#if defined(__aarch64__)
bool has_neon_bf16(void) { return mfa_cpu_arm_bf16(); }
#endif

/* Fastest first. A build left out of this library (CMake's MFA_CPU_KERNELS) has no kernels, and
 * is never picked. */
const isa_choice choices[] = {
#if defined(__x86_64__)
#if MFA_CPU_WITH_AMXBF16
    {"amxbf16", mfa_cpu_kernels_amx_bf16, has_amx_bf16},
#else
    {"amxbf16", nullptr, has_amx_bf16},
#endif
#if MFA_CPU_WITH_AVX512BF16
    {"avx512bf16", mfa_cpu_kernels_avx512_bf16, has_avx512_bf16},
#else
    {"avx512bf16", nullptr, has_avx512_bf16},
#endif
#if MFA_CPU_WITH_AVX512
    {"avx512", mfa_cpu_kernels_avx512, has_avx512},
#else
    {"avx512", nullptr, has_avx512},
#endif
#if MFA_CPU_WITH_AVX2
    {"avx2", mfa_cpu_kernels_avx2, has_avx2},
#else
    {"avx2", nullptr, has_avx2},
#endif
#elif defined(__aarch64__)
#if MFA_CPU_WITH_NEONBF16
    {"neonbf16", mfa_cpu_kernels_neon_bf16, has_neon_bf16},
#else
    {"neonbf16", nullptr, has_neon_bf16},
#endif
#endif
    {"portable", mfa_cpu_kernels_portable, always},
};

} // namespace

mfa_status mfa_cpu_select_kernels(const mfa_cpu_kernels** kernels) {
    const char* pinned = getenv("MFA_CPU_ISA");
    if (pinned && *pinned) {
        for (const isa_choice& choice : choices) {
            if (strcmp(choice.name, pinned) != 0) continue;
            if (!choice.kernels)
                return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                                     "MFA_CPU_ISA=%s: this library was built without the %s "
                                     "kernels (MFA_CPU_KERNELS)",
                                     pinned, choice.name);
            if (!choice.supported())
                return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                                     "MFA_CPU_ISA=%s: this CPU does not support %s", pinned,
                                     choice.name);
            *kernels = choice.kernels();
            return MFA_OK;
        }
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "MFA_CPU_ISA=%s: expected one of the kernel builds in this library "
                             "(%s%s)",
                             pinned,
#if defined(__x86_64__)
                             "amxbf16, avx512bf16, avx512, avx2, ",
#elif defined(__aarch64__)
                             "neonbf16, ",
#else
                             "",
#endif
                             "portable");
    }
    for (const isa_choice& choice : choices) {
        if (choice.kernels && choice.supported()) {
            *kernels = choice.kernels();
            return MFA_OK;
        }
    }
    return mfa_set_error(MFA_ERROR_INTERNAL, "no CPU kernel build is usable");
}
