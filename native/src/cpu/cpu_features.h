/*
 * CPU features that cpuid or __builtin_cpu_supports cannot answer alone, shared by the CPU
 * backend's kernel choice (isa_select.cpp) and the roof probes (native/src/probes), so that the
 * benchmark's roofs are measured on exactly the instructions the kernels run. Plain C, static
 * inline: each library gets its own copy.
 */
#ifndef MFA_CPU_FEATURES_H
#define MFA_CPU_FEATURES_H

#include <stdbool.h>
#include <stddef.h>

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#if defined(__x86_64__)
/* AMX-TILE and AMX-BF16 (cpuid leaf 7: EDX bits 24 and 22), and the tile data state granted to
 * this process: Linux leaves the 8 KiB of tile registers off until a process asks for them
 * (arch_prctl ARCH_REQ_XCOMP_PERM; asking again once granted succeeds). The caller checks
 * AVX-512 first. */
static inline bool mfa_cpu_amx_bf16_granted(void) {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!(edx & (1u << 24)) || !(edx & (1u << 22))) return false;
#if defined(__linux__)
    const long request_permission = 0x1023; /* ARCH_REQ_XCOMP_PERM */
    const long tile_data = 18;              /* XFEATURE_XTILEDATA */
    return syscall(SYS_arch_prctl, request_permission, tile_data) == 0;
#else
    return false;
#endif
}
#endif

#if defined(__aarch64__)
/* Armv8.6 BF16 (bfdot, bfmmla), as the kernel reports it. */
static inline bool mfa_cpu_arm_bf16(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP2) & (1ul << 14)) != 0; /* HWCAP2_BF16 */
#elif defined(__APPLE__)
    int present = 0;
    size_t size = sizeof present;
    return sysctlbyname("hw.optional.arm.FEAT_BF16", &present, &size, NULL, 0) == 0 && present;
#else
    return false;
#endif
}
#endif

#endif /* MFA_CPU_FEATURES_H */
