/* Prints the pipeline variants the planner can ask for: one JSON line per distinct (kernel,
 * function constants) over every family, precision class, pass and table row (at the row's
 * largest head dimension), for metal_sim_check_residency.py. Built with the planner's sources. */
#include <stdio.h>
#include <string.h>

#include "core/validate.h"
#include "planner/planner.h"
#include "planner/tables.h"

#define MAX_VARIANTS 512

#define MAX_LINE 2048

static char printed[MAX_VARIANTS][MAX_LINE];
static int printed_count;

static void contiguous(mfa_view* view, char* base, int64_t h, int64_t n, int64_t d) {
    view->data = base;
    view->stride[3] = 1;
    view->stride[2] = d;
    view->stride[1] = n * d;
    view->stride[0] = h * n * d;
}

/* A dense causal-free problem over dummy addresses, which planning never dereferences. */
static mfa_problem problem_for(mfa_dtype dtype, int64_t d) {
    static char base[16];
    const int64_t n = 256;
    mfa_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = dtype;
    p.batch = 1;
    p.heads_q = 1;
    p.heads_kv = 1;
    p.group = 1;
    p.seq_q = n;
    p.seq_k = n;
    p.head_dim = d;
    p.head_dim_v = d;
    p.scale = 0.125f;
    mfa_visibility_band(n, n, 0, -1, -1, &p.band_lo, &p.band_hi);
    contiguous(&p.q, base + 1, 1, n, d);
    contiguous(&p.k, base + 2, 1, n, d);
    contiguous(&p.v, base + 3, 1, n, d);
    contiguous(&p.out, base + 4, 1, n, d);
    contiguous(&p.lse, base + 5, 1, n, 1);
    contiguous(&p.dout, base + 6, 1, n, d);
    contiguous(&p.dq, base + 7, 1, n, d);
    contiguous(&p.dk, base + 8, 1, n, d);
    contiguous(&p.dv, base + 9, 1, n, d);
    return p;
}

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

int main(void) {
    static const mfa_gpu_family families[] = {MFA_GPU_FAMILY_APPLE7, MFA_GPU_FAMILY_APPLE8,
                                              MFA_GPU_FAMILY_APPLE9};
    /* f32 and f16 select the two precision classes; bf16 shares f16's table and code. */
    static const mfa_dtype dtypes[] = {MFA_DTYPE_F32, MFA_DTYPE_F16};
    for (int f = 0; f < 3; ++f) {
        for (int t = 0; t < 2; ++t) {
            const mfa_precision_class precision = t ? MFA_PRECISION_16BIT : MFA_PRECISION_F32;
            for (int kind = MFA_PASS_FORWARD; kind <= MFA_PASS_BACKWARD_KEY_VALUE; ++kind) {
                const mfa_block_table table =
                    mfa_block_table_for(families[f], precision, (mfa_pass_kind)kind);
                for (uint32_t r = 0; r < table.num_rows; ++r) {
                    int64_t d = table.rows[r].max_head_dim;
                    if (d > MFA_PLAN_MAX_HEAD_DIM) d = MFA_PLAN_MAX_HEAD_DIM;
                    const mfa_problem p = problem_for(dtypes[t], d);
                    mfa_plan plan;
                    const mfa_status status = kind == MFA_PASS_FORWARD
                                                  ? mfa_plan_forward(&p, families[f], 1024, &plan)
                                                  : mfa_plan_backward(&p, families[f], 1024, &plan);
                    if (status != MFA_OK) {
                        fprintf(stderr, "planner_variants: no plan for family %d, D=%lld: %s\n",
                                (int)families[f], (long long)d, mfa_last_error());
                        return 1;
                    }
                    for (uint32_t i = 0; i < plan.num_passes; ++i)
                        if ((int)plan.passes[i].kind == kind && print_pass(&plan.passes[i]))
                            return 1;
                }
            }
        }
    }
    return 0;
}
