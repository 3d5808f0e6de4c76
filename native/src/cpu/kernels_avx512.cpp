/* AVX-512 build (F, BW, DQ, VL): 32 zmm registers hold an 8 x 32 tile of C (16 registers) plus
 * operands. Compiled with AVX-512 flags (see CMakeLists.txt); run only where cpuid says so. */
#if defined(__x86_64__)
#define MFA_CPU_BF16_DOT       0
#define MFA_CPU_VECTOR_BYTES   64
#define MFA_CPU_ROWS           8
#define MFA_CPU_ISA_NAME       "AVX-512"
#define MFA_CPU_KERNELS_GETTER mfa_cpu_kernels_avx512
#include "cpu/isa_kernels.inl"
#endif
