/*
 * metal_backend.h - what the Metal backend offers libmfa beyond mfa_backend_ops (backend.h).
 * Plain C, so the core can include it where MFA_HAVE_METAL is set.
 */
#ifndef MFA_METAL_BACKEND_H
#define MFA_METAL_BACKEND_H

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mfa_metal_last_gpu_time(): GPU execution time in seconds (GPUEndTime - GPUStartTime) of the
 * command buffer that most recently completed on the Metal context whose backend state is
 * `state`. Under concurrent use that is whichever call finished last. Fails with
 * MFA_ERROR_INVALID_ARGUMENT when seconds is NULL or no attention call has completed yet. */
mfa_status mfa_metal_last_gpu_time(void* state, double* seconds);

#ifdef __cplusplus
}
#endif

#endif /* MFA_METAL_BACKEND_H */
