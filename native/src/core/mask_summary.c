/* mfa_mask_summarize: validation of its arguments and the core's portable implementation for
 * host memory (backend.h, mfa_core_mask_summarize_host). */
#include <stdint.h>
#include <string.h>

#include "core/validate.h"

static const char* const mask_dims[4] = {"batch", "heads", "query", "key"};

static int64_t blocks_of(int64_t n) { return n / MFA_MASK_BLOCK + (n % MFA_MASK_BLOCK != 0); }

mfa_status mfa_build_summary(const mfa_target* target, const mfa_array* mask, int64_t seq_q,
                             int64_t seq_k, const mfa_array* summary,
                             mfa_summary_problem* problem) {
    if (seq_q < 1 || seq_k < 1) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s must be >= 1, got %lld",
                             seq_q < 1 ? "seq_q" : "seq_k", (long long)(seq_q < 1 ? seq_q : seq_k));
    }
    mfa_checked storage[2];
    mfa_checks checks;
    mfa_checks_init(&checks, target, storage, 2);
    mfa_array_rule rule = mfa_rule(1u << MFA_DTYPE_BOOL | 1u << MFA_DTYPE_F32 |
                                       1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16,
                                   "boolean, or additive", false);
    rule.dim_names = mask_dims;
    mfa_rule_size(&rule, 2, seq_q, "seq_q", true);
    mfa_rule_size(&rule, 3, seq_k, "seq_k", true);
    const mfa_checked *mask_checked, *summary_checked;
    mfa_status status = mfa_check_array(&checks, "mask", mask, &rule, &mask_checked);
    if (status != MFA_OK) return status;
    rule = mfa_rule(1u << MFA_DTYPE_BOOL, "summary codes are bytes", true);
    rule.dim_names = mask_dims;
    mfa_rule_size(&rule, 0, mask->shape[0], "mask.shape[0]", mask_checked->view.stride[0] == 0);
    mfa_rule_size(&rule, 1, mask->shape[1], "mask.shape[1]", mask_checked->view.stride[1] == 0);
    mfa_rule_size(&rule, 2, blocks_of(seq_q), "ceil(seq_q / MFA_MASK_BLOCK)", false);
    mfa_rule_size(&rule, 3, blocks_of(seq_k), "ceil(seq_k / MFA_MASK_BLOCK)", false);
    if ((status = mfa_check_array(&checks, "summary", summary, &rule, &summary_checked)) ||
        (status = mfa_check_no_overlap(&checks)))
        return status;
    memset(problem, 0, sizeof *problem);
    problem->memory = (mfa_memory)checks.memory;
    problem->batch = summary->shape[0];
    problem->heads = summary->shape[1];
    problem->seq_q = seq_q;
    problem->seq_k = seq_k;
    problem->mask = mask_checked->view;
    problem->mask_dtype = mask->dtype;
    problem->summary = summary_checked->view;
    return MFA_OK;
}

/* What one mask element says about its pair. */
enum { HIDDEN = 1, PLAIN = 2, OTHER = 4 }; /* hidden; visible adding 0; anything else */

static int classify(const char* element, mfa_dtype dtype) {
    switch (dtype) {
        case MFA_DTYPE_BOOL: return *element ? PLAIN : HIDDEN;
        case MFA_DTYPE_F32: {
            uint32_t bits;
            memcpy(&bits, element, sizeof bits);
            if (bits == 0xff800000u) return HIDDEN;
            return (bits & 0x7fffffffu) == 0 ? PLAIN : OTHER;
        }
        default: { /* f16 (-inf 0xfc00) and bf16 (-inf 0xff80): both have +-0 at 0 / 0x8000 */
            uint16_t bits;
            memcpy(&bits, element, sizeof bits);
            if (bits == (dtype == MFA_DTYPE_F16 ? 0xfc00u : 0xff80u)) return HIDDEN;
            return (bits & 0x7fffu) == 0 ? PLAIN : OTHER;
        }
    }
}

/* Each block of the summary reads its part of the mask once, and stops as soon as the block is
 * known to be mixed. */
mfa_status mfa_core_mask_summarize_host(const mfa_summary_problem* p) {
    const int64_t elem = (int64_t)mfa_dtype_size(p->mask_dtype);
    const int64_t* ms = p->mask.stride;
    const int64_t* ss = p->summary.stride;
    const int64_t row_blocks = blocks_of(p->seq_q), key_blocks = blocks_of(p->seq_k);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->heads; ++h)
            for (int64_t r = 0; r < row_blocks; ++r)
                for (int64_t c = 0; c < key_blocks; ++c) {
                    const int64_t i_end = r * MFA_MASK_BLOCK + MFA_MASK_BLOCK < p->seq_q
                                              ? r * MFA_MASK_BLOCK + MFA_MASK_BLOCK
                                              : p->seq_q;
                    const int64_t j_end = c * MFA_MASK_BLOCK + MFA_MASK_BLOCK < p->seq_k
                                              ? c * MFA_MASK_BLOCK + MFA_MASK_BLOCK
                                              : p->seq_k;
                    int seen = 0;
                    for (int64_t i = r * MFA_MASK_BLOCK;
                         i < i_end && seen != (HIDDEN | PLAIN) && !(seen & OTHER); ++i) {
                        const char* row = p->mask.data + elem * (b * ms[0] + h * ms[1] + i * ms[2]);
                        for (int64_t j = c * MFA_MASK_BLOCK; j < j_end; ++j) {
                            seen |= classify(row + elem * j * ms[3], p->mask_dtype);
                            if ((seen & OTHER) || seen == (HIDDEN | PLAIN)) break;
                        }
                    }
                    const uint8_t code = seen == HIDDEN ? 0 : seen == PLAIN ? 2 : 1;
                    p->summary.data[b * ss[0] + h * ss[1] + r * ss[2] + c * ss[3]] = (char)code;
                }
    return MFA_OK;
}
