/* mfa_attention_merge: validation of its arguments and the core's portable implementation for
 * host memory (backend.h, mfa_core_merge_host). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/validate.h"

#define FLOAT_DTYPES (1u << MFA_DTYPE_F32 | 1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16)

enum { OUT_GROUP = 1, LSE_GROUP = 2 }; /* in-place groups: out with the parts' outs, lse likewise */

/* Names for messages ("outs[12]"), one per array, alive for the whole validation. */
typedef char array_name[24];

mfa_status mfa_build_merge(const mfa_target* target, int32_t count, const mfa_array* const* outs,
                           const mfa_array* const* lses, const mfa_array* out, const mfa_array* lse,
                           mfa_merge_part* parts, mfa_merge_problem* problem) {
    const int capacity = 2 * count + 2;
    mfa_checked* storage = (mfa_checked*)calloc((size_t)capacity, sizeof *storage);
    array_name* names = (array_name*)calloc((size_t)capacity, sizeof *names);
    if (storage == NULL || names == NULL) {
        free(storage);
        free(names);
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "cannot allocate the checks of %d parts",
                             (int)count);
    }
    mfa_checks checks;
    mfa_checks_init(&checks, target, storage, capacity);
    mfa_status status = MFA_OK;
    static const char* const from_out[4] = {"outs[0].shape[0]", "outs[0].shape[1]",
                                            "outs[0].shape[2]", "outs[0].shape[3]"};
    mfa_array_rule out_rule = mfa_rule(FLOAT_DTYPES, "outputs of attention", false);
    out_rule.in_place_group = OUT_GROUP;
    mfa_array_rule lse_rule = mfa_rule(1u << MFA_DTYPE_F32, "lse is always f32", false);
    lse_rule.in_place_group = LSE_GROUP;
    for (int32_t i = 0; i < count && status == MFA_OK; ++i) {
        const mfa_checked *part_out, *part_lse;
        snprintf(names[2 * i], sizeof names[2 * i], "outs[%d]", (int)i);
        snprintf(names[2 * i + 1], sizeof names[2 * i + 1], "lses[%d]", (int)i);
        if ((status = mfa_check_array(&checks, names[2 * i], outs[i], &out_rule, &part_out))) break;
        if (i == 0) {
            for (int d = 0; d < 4; ++d)
                mfa_rule_size(&out_rule, d, outs[0]->shape[d], from_out[d], false);
            for (int d = 0; d < 3; ++d)
                mfa_rule_size(&lse_rule, d, outs[0]->shape[d], from_out[d], false);
            mfa_rule_size(&lse_rule, 3, 1, NULL, false);
        }
        if ((status = mfa_check_array(&checks, names[2 * i + 1], lses[i], &lse_rule, &part_lse)))
            break;
        parts[i].out = part_out->view;
        parts[i].out_dtype = outs[i]->dtype;
        parts[i].lse = part_lse->view;
    }
    const mfa_checked* checked;
    memset(problem, 0, sizeof *problem);
    if (status == MFA_OK) {
        out_rule.output = true;
        status = mfa_check_array(&checks, "out", out, &out_rule, &checked);
        if (status == MFA_OK) {
            problem->out = checked->view;
            problem->out_dtype = out->dtype;
        }
    }
    if (status == MFA_OK && lse != NULL) {
        lse_rule.output = true;
        status = mfa_check_array(&checks, "lse", lse, &lse_rule, &checked);
        if (status == MFA_OK) problem->lse = checked->view;
    }
    if (status == MFA_OK) status = mfa_check_no_overlap(&checks);
    if (status == MFA_OK) {
        problem->memory = (mfa_memory)checks.memory;
        problem->batch = outs[0]->shape[0];
        problem->heads = outs[0]->shape[1];
        problem->rows = outs[0]->shape[2];
        problem->head_dim_v = outs[0]->shape[3];
        problem->count = count;
        problem->parts = parts;
    }
    free(storage);
    free(names);
    return status;
}

/* Storage dtypes, converted by hand (round to nearest even, NaN kept quiet). */
static float f16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    float magnitude;
    if (exponent == 0)
        magnitude = ldexpf((float)mantissa, -24);
    else if (exponent == 31)
        magnitude = mantissa ? NAN : INFINITY;
    else
        magnitude = ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
    return sign ? -magnitude : magnitude;
}

static uint16_t float_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const int32_t exponent = (int32_t)((x >> 23) & 0xffu) - 127 + 15;
    uint32_t mantissa = x & 0x7fffffu;
    if (((x >> 23) & 0xffu) == 0xffu) return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u : 0));
    if (exponent >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exponent <= 0) {
        if (exponent < -10) return (uint16_t)sign;
        mantissa |= 0x800000u;
        const uint32_t shift = (uint32_t)(14 - exponent);
        uint32_t half = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1), middle = 1u << (shift - 1);
        if (rest > middle || (rest == middle && (half & 1u))) ++half;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)exponent << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half; /* may carry into inf */
    return (uint16_t)(sign | half);
}

static float bf16_to_float(uint16_t b) {
    const uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static double load(const char* data, mfa_dtype dtype, int64_t index) {
    if (dtype == MFA_DTYPE_F32) {
        float value;
        memcpy(&value, data + 4 * index, sizeof value);
        return value;
    }
    uint16_t bits;
    memcpy(&bits, data + 2 * index, sizeof bits);
    return dtype == MFA_DTYPE_F16 ? f16_to_float(bits) : bf16_to_float(bits);
}

static void store(char* data, mfa_dtype dtype, int64_t index, double value) {
    const float rounded = (float)value;
    if (dtype == MFA_DTYPE_F32) {
        memcpy(data + 4 * index, &rounded, sizeof rounded);
        return;
    }
    const uint16_t bits = dtype == MFA_DTYPE_F16 ? float_to_f16(rounded) : float_to_bf16(rounded);
    memcpy(data + 2 * index, &bits, sizeof bits);
}

static int64_t row_offset(const mfa_view* view, int64_t b, int64_t h, int64_t n) {
    return b * view->stride[0] + h * view->stride[1] + n * view->stride[2];
}

/* Row by row: every part's lse of the row first (the weights), then element by element every
 * part's out before the merged value is stored, so an output that is one part's view is read
 * before it is overwritten. */
mfa_status mfa_core_merge_host(const mfa_merge_problem* p) {
    double* weights = (double*)malloc((size_t)p->count * sizeof *weights);
    if (weights == NULL)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "cannot allocate %d merge weights",
                             (int)p->count);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->heads; ++h)
            for (int64_t n = 0; n < p->rows; ++n) {
                double peak = -INFINITY;
                int invalid = 0;
                for (int32_t i = 0; i < p->count; ++i) {
                    const mfa_view* lse = &p->parts[i].lse;
                    weights[i] = load(lse->data, MFA_DTYPE_F32, row_offset(lse, b, h, n));
                    if (isnan(weights[i]) || weights[i] == INFINITY) invalid = 1;
                    if (weights[i] > peak) peak = weights[i];
                }
                double total = 0.0, merged_lse;
                if (invalid) {
                    merged_lse = NAN;
                } else if (peak == -INFINITY) {
                    merged_lse = -INFINITY;
                } else {
                    for (int32_t i = 0; i < p->count; ++i) {
                        weights[i] = weights[i] == -INFINITY ? 0.0 : exp(weights[i] - peak);
                        total += weights[i];
                    }
                    merged_lse = peak + log(total);
                }
                const int64_t out_row = row_offset(&p->out, b, h, n);
                for (int64_t d = 0; d < p->head_dim_v; ++d) {
                    double value;
                    if (invalid) {
                        value = NAN;
                    } else if (peak == -INFINITY) {
                        value = 0.0;
                    } else {
                        double sum = 0.0;
                        for (int32_t i = 0; i < p->count; ++i) {
                            if (weights[i] == 0.0) continue; /* saw no key: out is not read */
                            const mfa_view* part = &p->parts[i].out;
                            sum +=
                                weights[i] * load(part->data, p->parts[i].out_dtype,
                                                  row_offset(part, b, h, n) + d * part->stride[3]);
                        }
                        value = sum / total;
                    }
                    store(p->out.data, p->out_dtype, out_row + d * p->out.stride[3], value);
                }
                if (p->lse.data != NULL)
                    store(p->lse.data, MFA_DTYPE_F32, row_offset(&p->lse, b, h, n), merged_lse);
            }
    free(weights);
    return MFA_OK;
}
