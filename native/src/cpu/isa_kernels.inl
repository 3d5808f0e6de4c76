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

/* One entry point per pass for all dtypes: the dtype is resolved per task, not per element. */
template <mfa_cpu_task F32, mfa_cpu_task F16, mfa_cpu_task BF16>
static void for_dtype(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    switch (plan->problem->dtype) {
        case MFA_DTYPE_F32: F32(plan, task, slot); break;
        case MFA_DTYPE_F16: F16(plan, task, slot); break;
        case MFA_DTYPE_BF16: BF16(plan, task, slot); break;
        default: break; /* the core hands backends f32, f16 and bf16 problems only */
    }
}

const mfa_cpu_kernels kernels = {
    MFA_CPU_ISA_NAME,
    NR,
    for_dtype<forward_pack_task<f32_storage>, forward_pack_task<f16_storage>,
              forward_pack_task<bf16_storage>>,
    for_dtype<forward_task<f32_storage>, forward_task<f16_storage>, forward_task<bf16_storage>>,
    for_dtype<backward_pack_task<f32_storage>, backward_pack_task<f16_storage>,
              backward_pack_task<bf16_storage>>,
    for_dtype<backward_task<f32_storage>, backward_task<f16_storage>, backward_task<bf16_storage>>,
};

} // namespace

extern "C" const mfa_cpu_kernels* MFA_CPU_KERNELS_GETTER(void) { return &kernels; }
