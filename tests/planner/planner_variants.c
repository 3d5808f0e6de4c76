/* Prints the pipeline variants the planner can ask for: one JSON line per distinct (kernel,
 * function constants), for metal_sim_check_residency.py. Over every family: each table row's
 * dense forward and backward at the row's largest head dimension (f32 and f16), and, at D = 128
 * with bf16, the plans of the other layouts and features, which between them reach every pass
 * kind and every function constant the planner sets: packed sequences with every score
 * modifier and the sinks' gradient; an additive mask with GQA and an initial state; decoding
 * from a paged cache with appended keys (append, a GQA-packed split-key forward, combine); and a
 * dense split-key decode. f16 and bf16 share every table and differ only in how an element is
 * converted, and the features' code is the same in every precision, so each path is compiled
 * somewhere at a fraction of the cost of every combination. Built with the planner's sources. */
#include <stdio.h>
#include <string.h>

#include "planner/planner.h"
#include "planner/tables.h"
#include "planner_problems.h"

#define MAX_VARIANTS 512

#define MAX_LINE 2048

static char printed[MAX_VARIANTS][MAX_LINE];
static int printed_count;

static int print_pass(const mfa_pass_plan* pass) {
    char line[MAX_LINE];
    int used =
        snprintf(line, sizeof line, "{\"kernel\": \"%s\", \"constants\": {", pass->kernel_name);
    for (uint32_t i = 0; i < pass->num_constants; ++i) {
        const mfa_function_constant* c = &pass->constants[i];
        const char* value = c->type == MFA_CONSTANT_TYPE_BOOL ? (c->value ? "true" : "false") : 0;
        used += value ? snprintf(line + used, sizeof line - used, "%s\"%u\": %s", i ? ", " : "",
                                 c->index, value)
                      : snprintf(line + used, sizeof line - used, "%s\"%u\": %u", i ? ", " : "",
                                 c->index, c->value);
    }
    if (used + 3 > (int)sizeof line) {
        fprintf(stderr, "planner_variants: a variant longer than %d characters\n", MAX_LINE);
        return 1;
    }
    snprintf(line + used, sizeof line - used, "}}");
    for (int i = 0; i < printed_count; ++i)
        if (strcmp(printed[i], line) == 0) return 0;
    if (printed_count == MAX_VARIANTS) {
        fprintf(stderr, "planner_variants: more than %d variants\n", MAX_VARIANTS);
        return 1;
    }
    strcpy(printed[printed_count++], line);
    puts(line);
    return 0;
}

/* Prints the passes of the forward (direction 0) or backward (1) plan of p, or of those of
 * kind `only` when it is not negative. */
static int print_plan(const mfa_problem* p, mfa_gpu_family family, int backward, int only) {
    mfa_plan plan;
    const mfa_status status = backward ? mfa_plan_backward(p, family, 1024, &plan)
                                       : mfa_plan_forward(p, family, 1024, &plan);
    if (status != MFA_OK) {
        fprintf(stderr, "planner_variants: no plan for family %d, D=%lld: %s\n", (int)family,
                (long long)p->head_dim, mfa_last_error());
        return 1;
    }
    for (uint32_t i = 0; i < plan.num_passes; ++i)
        if ((only < 0 || (int)plan.passes[i].kind == only) && print_pass(&plan.passes[i])) return 1;
    return 0;
}

/* Packed sequences (3 of at most 256 rows) with a boolean mask and its summary, softcap, ALiBi
 * and sinks with their gradient. */
static mfa_problem packed_with_modifiers(mfa_dtype dtype) {
    char* base = planner_problem_base;
    mfa_problem p = make_problem(dtype, 1, 2, 2, 600, 600, 128, 128, 1);
    p.batch = 3;
    p.seq_q = p.seq_k = 256;
    p.layout = MFA_LAYOUT_VARLEN;
    p.varlen.total_q = p.varlen.total_k = 600;
    p.varlen.longest_q = p.varlen.longest_k = 256;
    contiguous(&p.varlen.cu_seqlens_q, base + 10, 1, 1, 4);
    contiguous(&p.varlen.cu_seqlens_k, base + 11, 1, 1, 4);
    p.mask_dtype = MFA_DTYPE_BOOL;
    contiguous(&p.mask, base + 12, 2, 256, 256);
    contiguous(&p.block_mask, base + 13, 2, 4, 4);
    contiguous(&p.alibi_slopes, base + 14, 2, 1, 1);
    contiguous(&p.sinks, base + 15, 2, 1, 1);
    contiguous(&p.dsinks, base + 16, 2, 1, 1);
    p.softcap = 30.0f;
    return p;
}

/* An additive f32 mask, GQA 4:1, a causal band and an initial state. */
static mfa_problem additive_mask_initial_state(mfa_dtype dtype) {
    mfa_problem p = make_problem(dtype, 1, 8, 2, 256, 256, 128, 128, 1);
    mfa_visibility_band(256, 256, 0, -1, 0, &p.band_lo, &p.band_hi);
    p.window_right = 0;
    p.window_left = -1;
    p.mask_dtype = MFA_DTYPE_F32;
    contiguous(&p.mask, planner_problem_base + 12, 8, 256, 256);
    p.initial_state = 1;
    return p;
}

/* One query per head of a GQA 8:1 group against 8192 cached keys in blocks of 256, two keys
 * appended, with sinks and an initial state: append, a split-key forward, combine. */
static mfa_problem paged_decode(mfa_dtype dtype) {
    char* base = planner_problem_base;
    mfa_problem p = make_problem(dtype, 1, 8, 1, 1, 8192, 128, 128, 1);
    p.layout = MFA_LAYOUT_PAGED;
    p.paged.block_size = 256;
    p.paged.num_blocks = 32;
    p.paged.max_blocks = 32;
    p.paged.new_len = 2;
    p.paged.longest_k = 8192;
    contiguous(&p.k, base + 2, 1, 256, 128);
    contiguous(&p.v, base + 3, 1, 256, 128);
    contiguous(&p.paged.block_table, base + 17, 1, 1, 32);
    contiguous(&p.paged.cache_seqlens, base + 18, 1, 1, 1);
    contiguous(&p.paged.k_new, base + 19, 1, 2, 128);
    contiguous(&p.paged.v_new, base + 20, 1, 2, 128);
    contiguous(&p.sinks, base + 15, 8, 1, 1);
    p.initial_state = 1;
    return p;
}

int main(void) {
    static const mfa_gpu_family families[] = {MFA_GPU_FAMILY_APPLE7, MFA_GPU_FAMILY_APPLE8,
                                              MFA_GPU_FAMILY_APPLE9};
    static const mfa_dtype dense_dtypes[] = {MFA_DTYPE_F32, MFA_DTYPE_F16};
    for (int f = 0; f < 3; ++f) {
        for (int t = 0; t < 2; ++t) {
            const mfa_precision_class precision = t ? MFA_PRECISION_16BIT : MFA_PRECISION_F32;
            for (int kind = MFA_PASS_FORWARD; kind <= MFA_PASS_BACKWARD_KEY_VALUE; ++kind) {
                const mfa_block_table table =
                    mfa_block_table_for(families[f], precision, (mfa_pass_kind)kind);
                for (uint32_t r = 0; r < table.num_rows; ++r) {
                    int64_t d = table.rows[r].max_head_dim;
                    if (d > MFA_PLAN_MAX_HEAD_DIM) d = MFA_PLAN_MAX_HEAD_DIM;
                    const mfa_problem p = make_problem(dense_dtypes[t], 1, 1, 1, 256, 256, d, d, 1);
                    if (print_plan(&p, families[f], kind != MFA_PASS_FORWARD, kind)) return 1;
                }
            }
        }
        const mfa_problem packed = packed_with_modifiers(MFA_DTYPE_BF16);
        const mfa_problem additive = additive_mask_initial_state(MFA_DTYPE_BF16);
        const mfa_problem paged = paged_decode(MFA_DTYPE_BF16);
        const mfa_problem decode = make_problem(MFA_DTYPE_BF16, 1, 1, 1, 1, 8192, 128, 128, 0);
        if (print_plan(&packed, families[f], 0, -1) || print_plan(&packed, families[f], 1, -1) ||
            print_plan(&additive, families[f], 0, -1) ||
            print_plan(&additive, families[f], 1, -1) || print_plan(&paged, families[f], 0, -1) ||
            print_plan(&decode, families[f], 0, -1))
            return 1;
    }
    return 0;
}
