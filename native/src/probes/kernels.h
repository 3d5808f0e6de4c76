/*
 * The probe kernels, one set per instruction set. Each kernels_<isa>.c is compiled with that
 * instruction set's flags (the way the CPU backend builds its kernels) and only called after
 * probes.c has checked, at run time, that the CPU and the OS support it. The loops are written
 * once, in chains.inl (compute) and read.inl (bandwidth), and so are the probes made of them
 * (fma_read.inl, dot.inl); each file names its instructions.
 *
 * Kernel contracts (the self-checks in mfa_probes.h rely on them):
 *   fma_f32(n, m, a):  `lanes` f32 lanes, all 0, each updated n times by lane = fma(lane, m, a);
 *                      returns the sum of the lanes. m and a are arguments, not constants, so
 *                      that no compiler can fold fma(x, 1, a) into an addition.
 *   dot_bf16(n, a, b): `lanes` f32 lanes, all 0, each updated n times by
 *                      lane += a0*b0 + a1*b1 for the bf16 pairs a = (a0, a1), b = (b0, b1)
 *                      (bit patterns, the low half first); returns the sum of the lanes. (AMX
 *                      tiles add 16 such pairs into each f32 element: 16 lanes each.)
 *   read_u64(p, n):    the wrapping sum of the 64-bit words of p[0, n), n a multiple of
 *                      MFA_PROBE_READ_BLOCK, p 64-byte aligned.
 */
#ifndef MFA_PROBES_KERNELS_H
#define MFA_PROBES_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* The f32 whose bit pattern is `bits` (reading another member of a union is defined in C). */
static inline float probe_f32(uint32_t bits) {
    const union {
        uint32_t bits;
        float value;
    } pun = {bits};
    return pun.value;
}

typedef struct probe_compute {
    const char* isa;
    double (*run)(uint64_t iterations, uint32_t x, uint32_t y); /* fma: x, y are f32 bits */
    int lanes;
    int flops_per_lane; /* per iteration: 2 for an FMA, 4 for a two-product dot */
    const char* method;
} probe_compute;

typedef struct probe_read {
    const char* isa;
    uint64_t (*run)(const void* data, size_t bytes);
    const char* method;
} probe_read;

#if defined(__x86_64__)
const probe_compute* probe_fma_avx512(void);
const probe_read* probe_read_avx512(void);
const probe_compute* probe_fma_avx2(void);
const probe_read* probe_read_avx2(void);
#if MFA_PROBES_HAVE_BF16
const probe_compute* probe_dot_avx512bf16(void);
#endif
#if MFA_PROBES_HAVE_AMX
const probe_compute* probe_dot_amx_bf16(void);
#endif
#elif defined(__aarch64__)
#if MFA_PROBES_HAVE_BF16
const probe_compute* probe_dot_neon_bf16(void);
#endif
#endif
/* NEON on aarch64, the compiler's baseline vectors elsewhere. */
const probe_compute* probe_fma_baseline(void);
const probe_read* probe_read_baseline(void);

#endif
