/* AVX2 + FMA build: 16 ymm registers hold a 6 x 16 tile of C (12 registers) plus 2 B vectors and
 * one broadcast A. Compiled with AVX2 flags (see CMakeLists.txt); run only where cpuid says so. */
#if defined(__x86_64__)
#define MFA_CPU_BF16_DOT       0
#define MFA_CPU_VECTOR_BYTES   32
#define MFA_CPU_ROWS           6
#define MFA_CPU_ISA_NAME       "AVX2"
#define MFA_CPU_KERNELS_GETTER mfa_cpu_kernels_avx2
#include "cpu/isa_kernels.inl"
#endif
