/*
 * The table one instruction-set build of the attention kernels exports. isa_select.cpp picks one
 * table per context; everything below a table entry runs at that single ISA.
 */
#ifndef MFA_CPU_KERNELS_H
#define MFA_CPU_KERNELS_H

#include "cpu/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mfa_cpu_kernels {
    const char* isa_name;   /* "AVX-512", "AVX2", "NEON", "SSE2", "portable" */
    int64_t panel_width;    /* floats per packed panel: the micro-kernel's register width */
    /* One block of query rows: O and, if requested, the log-sum-exp. */
    void (*forward_task)(const mfa_cpu_plan* plan, int64_t task, float* slot);
    /* One block of query rows: plan->row_dot = rowsum(dO * O). */
    void (*row_dot_task)(const mfa_cpu_plan* plan, int64_t task, float* slot);
    /* Tasks [0, dq_tasks) are blocks of query rows (dQ); the rest blocks of key rows (dK, dV). */
    void (*backward_task)(const mfa_cpu_plan* plan, int64_t task, float* slot);
} mfa_cpu_kernels;

const mfa_cpu_kernels* mfa_cpu_kernels_portable(void);
#if defined(__x86_64__) || defined(_M_X64)
const mfa_cpu_kernels* mfa_cpu_kernels_avx2(void);
const mfa_cpu_kernels* mfa_cpu_kernels_avx512(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* MFA_CPU_KERNELS_H */
