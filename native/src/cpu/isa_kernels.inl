/*
 * One instruction-set build of every CPU attention kernel. A kernels_<isa>.cpp file defines
 *   MFA_CPU_VECTOR_BYTES   vector register width in bytes,
 *   MFA_CPU_ROWS           micro-kernel rows (MR), sized to the register file,
 *   MFA_CPU_BF16_DOT       1 where bf16 products run on a dot-product instruction (optional),
 *   MFA_CPU_AMX            1 where they run on AMX-BF16 tiles instead (optional),
 *   MFA_CPU_ISA_NAME       the name device_name reports,
 *   MFA_CPU_KERNELS_GETTER the extern "C" function returning the table,
 * and includes this file. Each kernel .inl includes what it uses and keeps its code in the
 * anonymous namespace: the same templates are compiled once per ISA, and internal linkage
 * guarantees no AVX-512 instance is shared with a build meant for older CPUs. For the same
 * reason nothing here instantiates std:: templates.
 */
#include "cpu/backward.inl"
#include "cpu/decode.inl"
#include "cpu/forward.inl"
#include "cpu/kernels.h"
#if MFA_CPU_AMX
#include "cpu/gemm_amx.inl"
#elif MFA_CPU_BF16_DOT
#include "cpu/gemm_bf16.inl"
#endif

namespace {

#if MFA_CPU_AMX
typedef amx_pair_operands bf16_operands;
#elif MFA_CPU_BF16_DOT
typedef bf16_pair_operands bf16_operands;
#else
typedef f32_operands bf16_operands;
#endif

/* One entry point per pass for all dtypes: the dtype is resolved per task, not per element. */
template <mfa_cpu_task F32, mfa_cpu_task F16, mfa_cpu_task BF16>
static void for_dtype(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    switch (plan->problem->dtype) {
        case MFA_DTYPE_F32: F32(plan, task, slot); break;
        case MFA_DTYPE_F16: F16(plan, task, slot); break;
        case MFA_DTYPE_BF16: BF16(plan, task, slot); break;
        default: break; /* the core hands backends f32, f16 and bf16 problems only */
    }
#if MFA_CPU_AMX
    release_tiles(); /* the task's products left their tile configuration loaded */
#endif
}

/* On AMX tiles, a P V product loads and stores O's tiles once per block of keys: on Emerald
 * Rapids they cost about as much as the products of 128 keys, so blocks that no mask or band
 * cuts run 512 keys at a time. Everywhere else the products hold O in registers, and longer
 * blocks gained nothing measurable. */
#if MFA_CPU_AMX
static const int64_t kWideBlockK = 512;
#else
static const int64_t kWideBlockK = 0;
#endif

const mfa_cpu_kernels kernels = {
    MFA_CPU_ISA_NAME,
    NR,
    MFA_CPU_BF16_DOT,
    kWideBlockK,
    append_task,
    for_dtype<forward_pack_task<f32_storage, f32_operands>,
              forward_pack_task<f16_storage, f32_operands>,
              forward_pack_task<bf16_storage, bf16_operands>>,
    for_dtype<forward_task<f32_storage, f32_operands>, forward_task<f16_storage, f32_operands>,
              forward_task<bf16_storage, bf16_operands>>,
    for_dtype<backward_pack_task<f32_storage, f32_operands>,
              backward_pack_task<f16_storage, f32_operands>,
              backward_pack_task<bf16_storage, bf16_operands>>,
    for_dtype<backward_task<f32_storage, f32_operands>, backward_task<f16_storage, f32_operands>,
              backward_task<bf16_storage, bf16_operands>>,
    for_dtype<backward_dq_task<f32_storage>, backward_dq_task<f16_storage>,
              backward_dq_task<bf16_storage>>,
    for_dtype<decode_task<f32_storage>, decode_task<f16_storage>, decode_task<bf16_storage>>,
};

} // namespace

extern "C" const mfa_cpu_kernels* MFA_CPU_KERNELS_GETTER(void) { return &kernels; }
