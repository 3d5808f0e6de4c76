/* AVX-512 build with AMX-BF16 (Intel Sapphire Rapids and later): the AVX-512 + BF16 kernels
 * with bf16 matrix products on AMX tiles (gemm_amx.inl). Compiled with those flags (see
 * CMakeLists.txt); run only where cpuid says so and Linux has granted the process the tile data
 * state (isa_select.cpp). */
#if defined(__x86_64__)
#define MFA_CPU_VECTOR_BYTES   64
#define MFA_CPU_ROWS           8
#define MFA_CPU_BF16_DOT       1
#define MFA_CPU_AMX            1
#define MFA_CPU_ISA_NAME       "AVX-512 + AMX-BF16"
#define MFA_CPU_KERNELS_GETTER mfa_cpu_kernels_amx_bf16
#include "cpu/isa_kernels.inl"
#endif
