/* What needs no context: versions, dtypes and the defaults of the input structs. Apart from
 * api.c so that the core's unit tests can link validation without any backend. */
#include <stdbool.h>
#include <string.h>

#include "core/backend.h"
#include "core/export.h"

_Static_assert(MFA_VERSION_NUMBER ==
                   MFA_VERSION_MAJOR * 10000 + MFA_VERSION_MINOR * 100 + MFA_VERSION_PATCH,
               "MFA_VERSION_NUMBER must match the MAJOR, MINOR and PATCH macros");

#define MFA_STRINGIFY_(x) #x
#define MFA_STRINGIFY(x)  MFA_STRINGIFY_(x)

MFA_EXPORT unsigned mfa_version_number(void) { return MFA_VERSION_NUMBER; }

MFA_EXPORT const char* mfa_version_string(void) {
    return MFA_STRINGIFY(MFA_VERSION_MAJOR) "." MFA_STRINGIFY(MFA_VERSION_MINOR) "." MFA_STRINGIFY(
        MFA_VERSION_PATCH);
}

/* Each dtype's size and name, indexed by its value. */
static const struct {
    size_t size;
    const char* name;
} dtypes[] = {
    [MFA_DTYPE_F32] = {4, "f32"},   [MFA_DTYPE_F16] = {2, "f16"}, [MFA_DTYPE_BF16] = {2, "bf16"},
    [MFA_DTYPE_BOOL] = {1, "bool"}, [MFA_DTYPE_I32] = {4, "i32"},
};

/* Callers may pass any integer (see validate.c): only the table's values are dtypes. */
static bool is_dtype(mfa_dtype dtype) {
    return (unsigned)(int)dtype < sizeof dtypes / sizeof dtypes[0];
}

MFA_EXPORT size_t mfa_dtype_size(mfa_dtype dtype) {
    return is_dtype(dtype) ? dtypes[(int)dtype].size : 0;
}

MFA_EXPORT const char* mfa_dtype_name(mfa_dtype dtype) {
    return is_dtype(dtype) ? dtypes[(int)dtype].name : "unknown";
}

MFA_EXPORT void mfa_attention_params_init(mfa_attention_params* params) {
    if (params == NULL) return;
    memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->scale = 0.0f;
    params->causal = 0;
    params->alignment = MFA_ALIGN_BOTTOM_RIGHT;
    params->window_left = -1;
    params->window_right = -1;
}

MFA_EXPORT void mfa_attention_args_init(mfa_attention_args* args, size_t struct_size) {
    if (args == NULL || struct_size < sizeof args->struct_size) return;
    /* Every default is zero; bytes past this library's struct belong to fields it does not
     * know, zero too, and the calls reject the size. */
    memset(args, 0, struct_size);
    args->struct_size = struct_size;
}

MFA_EXPORT void mfa_context_options_init(mfa_context_options* options) {
    if (options == NULL) return;
    memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->num_threads = 0;
    options->gpu_family = MFA_GPU_FAMILY_NONE;
    options->sim_schedule_seed = 0;
}
