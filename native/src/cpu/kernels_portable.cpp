/* The build every CPU of the target architecture runs, at the compiler's baseline flags: 128-bit
 * vectors, which are NEON on arm64 (32 registers: an 8 x 8 tile) and SSE2 on x86-64 (16
 * registers: a 6 x 8 tile). */
#if defined(__aarch64__)
#define MFA_CPU_ROWS     8
#define MFA_CPU_ISA_NAME "NEON"
#elif defined(__x86_64__)
#define MFA_CPU_ROWS     6
#define MFA_CPU_ISA_NAME "SSE2"
#else
#define MFA_CPU_ROWS     6
#define MFA_CPU_ISA_NAME "portable"
#endif
#define MFA_CPU_BF16_DOT       0
#define MFA_CPU_VECTOR_BYTES   16
#define MFA_CPU_KERNELS_GETTER mfa_cpu_kernels_portable
#include "cpu/isa_kernels.inl"
