/* AVX-512 build with AVX512_BF16 (Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and
 * later): the AVX-512 kernels, with bf16 products on vdpbf16ps over bf16 operand pairs
 * (gemm_bf16.inl) at twice the f32 FMA rate. Compiled with those flags (see CMakeLists.txt); run
 * only where cpuid says so. */
#if defined(__x86_64__)
#define MFA_CPU_VECTOR_BYTES   64
#define MFA_CPU_ROWS           8
#define MFA_CPU_BF16_DOT       1
#define MFA_CPU_ISA_NAME       "AVX-512 + BF16"
#define MFA_CPU_KERNELS_GETTER mfa_cpu_kernels_avx512_bf16
#include "cpu/isa_kernels.inl"
#endif
