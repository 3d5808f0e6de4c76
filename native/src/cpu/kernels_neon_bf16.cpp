/* arm64 build with ARMv8.6's BF16 extension (Apple M2 and later, Neoverse V1/N2 and later): the
 * NEON kernels, with bf16 products on bfdot over bf16 operand pairs (gemm_bf16.inl). Compiled
 * with +bf16 (see CMakeLists.txt); run only where the CPU reports BF16 (isa_select.cpp). */
#if defined(__aarch64__)
#define MFA_CPU_BF16_DOT       1
#define MFA_CPU_VECTOR_BYTES   16
#define MFA_CPU_ROWS           8
#define MFA_CPU_ISA_NAME       "NEON + BF16"
#define MFA_CPU_KERNELS_GETTER mfa_cpu_kernels_neon_bf16
#include "cpu/isa_kernels.inl"
#endif
