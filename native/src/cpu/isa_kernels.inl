/*
 * One instruction-set build of every CPU attention kernel. A kernels_<isa>.cpp file defines
 *   MFA_CPU_VECTOR_BYTES   vector register width in bytes,
 *   MFA_CPU_ROWS           micro-kernel rows (MR), sized to the register file,
 *   MFA_CPU_ISA_NAME       the name device_name reports,
 *   MFA_CPU_KERNELS_GETTER the extern "C" function returning the table,
 * and includes this file. Everything else is in an anonymous namespace: the same templates are
 * compiled once per ISA, and internal linkage guarantees no AVX-512 instance is shared with a
 * build meant for older CPUs. For the same reason nothing here instantiates std:: templates.
 */
#include "cpu/convert.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

#include "cpu/simd.inl"
#include "cpu/gemm.inl"
#include "cpu/pack.inl"
#include "cpu/mask.inl"
#include "cpu/forward.inl"
#include "cpu/backward.inl"

typedef void (*task_fn)(const mfa_cpu_plan*, int64_t, float*);

/* One entry point per pass for all dtypes: the dtype is resolved per task, not per element. */
template <template <class> class Task>
struct by_dtype {
    static void run(const mfa_cpu_plan* plan, int64_t task, float* slot)
    {
        switch (plan->problem->dtype) {
        case MFA_DTYPE_F32: Task<f32_storage>::run(plan, task, slot); break;
        case MFA_DTYPE_F16: Task<f16_storage>::run(plan, task, slot); break;
        case MFA_DTYPE_BF16: Task<bf16_storage>::run(plan, task, slot); break;
        }
    }
};

template <class S> struct forward_pass {
    static void run(const mfa_cpu_plan* pl, int64_t t, float* s) { forward_task<S>(pl, t, s); }
};
template <class S> struct row_dot_pass {
    static void run(const mfa_cpu_plan* pl, int64_t t, float* s) { row_dot_task<S>(pl, t, s); }
};
template <class S> struct backward_pass {
    static void run(const mfa_cpu_plan* pl, int64_t t, float* s) { backward_task<S>(pl, t, s); }
};

const mfa_cpu_kernels kernels = {
    MFA_CPU_ISA_NAME,
    NR,
    by_dtype<forward_pass>::run,
    by_dtype<row_dot_pass>::run,
    by_dtype<backward_pass>::run,
};

} // namespace

extern "C" const mfa_cpu_kernels* MFA_CPU_KERNELS_GETTER(void)
{
    return &kernels;
}
