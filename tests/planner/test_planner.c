/*
 * Planner unit tests: every table row fits the hardware limits, every plan covers the problem
 * exactly once, bindings are complete and distinct, function constants agree with the plan,
 * and the band the core derives and the planner hands the kernels sees exactly the keys mfa.h
 * says.
 *
 * The planner is compiled into this test directly (it is hidden inside libmfa), with the core's
 * error recording (core/errors.c), which it reports through.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/validate.h"
#include "planner/planner.h"
#include "planner/tables.h"
#include "planner_problems.h"

static const mfa_gpu_family families[] = {MFA_GPU_FAMILY_APPLE7, MFA_GPU_FAMILY_APPLE8,
                                          MFA_GPU_FAMILY_APPLE9};
static const mfa_dtype dtypes[] = {MFA_DTYPE_F32, MFA_DTYPE_F16, MFA_DTYPE_BF16};

static uint32_t constant_value(const mfa_pass_plan* pass, uint32_t index, int* found) {
    *found = 0;
    for (uint32_t i = 0; i < pass->num_constants; ++i)
        if (pass->constants[i].index == index) {
            ++*found;
            return pass->constants[i].value;
        }
    return 0;
}

/* Structural checks that hold for every pass of every plan. */
static void check_pass(const mfa_problem* p, const mfa_pass_plan* pass, uint32_t max_threads) {
    CHECK(pass->threadgroup_memory_length <= MFA_PLAN_THREADGROUP_MEMORY_LIMIT, "tg %u",
          pass->threadgroup_memory_length);
    CHECK(pass->threadgroup_memory_length % 16 == 0, "tg %u", pass->threadgroup_memory_length);
    int found;
    /* With direct loads the kernels stage nothing; a paged cache is always staged. */
    const uint32_t direct = constant_value(pass, MFA_FC_DIRECT_LOADS, &found);
    CHECK(found == 1, "direct_loads present %d times", found);
    CHECK(!direct || p->layout != MFA_LAYOUT_PAGED, "a paged cache read from device memory");
    CHECK(pass->threadgroup_memory_length >=
              mfa_staging_bytes(
                  direct ? 0 : pass->block_parallel, direct ? 0 : pass->block_traversal,
                  pass->block_traversal, pass->block_head, p->dtype == MFA_DTYPE_F32 ? 4 : 2,
                  pass->kind == MFA_PASS_FORWARD && p->layout == MFA_LAYOUT_PAGED ? 2 : 0),
          "tg memory below the kernel's carve-up");
    CHECK(pass->threads_per_threadgroup == pass->block_parallel / 8 * 32, "threads %u",
          pass->threads_per_threadgroup);
    CHECK(pass->threads_per_threadgroup <= max_threads, "threads %u > %u",
          pass->threads_per_threadgroup, max_threads);
    CHECK(pass->block_parallel % 8 == 0 && pass->block_parallel <= MFA_MAX_BLOCK_PARALLEL, "P %u",
          pass->block_parallel);
    CHECK(pass->block_traversal % 8 == 0 && pass->block_traversal <= MFA_MAX_BLOCK_TRAVERSAL,
          "T %u", pass->block_traversal);
    CHECK(pass->block_head % 8 == 0 && pass->block_head > 0 &&
              pass->block_head <= MFA_MAX_BLOCK_HEAD,
          "head %u", pass->block_head);
    CHECK(pass->block_out % pass->block_head == 0 && pass->block_out <= MFA_MAX_BLOCK_OUT,
          "out %u head %u", pass->block_out, pass->block_head);
    CHECK(pass->params_index == MFA_BUFFER_PARAMS, "params index");
    CHECK(pass->kernel_name && strncmp(pass->kernel_name, "kernel_attention_", 17) == 0, "name");

    /* Function constants: distinct indices, values equal to the plan's fields. */
    for (uint32_t i = 0; i < pass->num_constants; ++i)
        for (uint32_t j = i + 1; j < pass->num_constants; ++j)
            CHECK(pass->constants[i].index != pass->constants[j].index, "duplicate constant %u",
                  pass->constants[i].index);
    const struct {
        uint32_t index, expected;
    } expect[] = {
        {MFA_FC_DTYPE, (uint32_t)p->dtype},
        {MFA_FC_HEAD_DIM, (uint32_t)p->head_dim},
        {MFA_FC_HEAD_DIM_V, (uint32_t)p->head_dim_v},
        {MFA_FC_BLOCK_PARALLEL, pass->block_parallel},
        {MFA_FC_BLOCK_TRAVERSAL, pass->block_traversal},
        {MFA_FC_BLOCK_HEAD, pass->block_head},
        {MFA_FC_BLOCK_OUT, pass->block_out},
        {MFA_FC_CACHE_PARALLEL,
         (pass->cached_operands &
          (1u << (pass->kind == MFA_PASS_BACKWARD_KEY_VALUE ? MFA_OPERAND_K : MFA_OPERAND_Q))) !=
             0},
        {MFA_FC_CACHE_PARALLEL2,
         (pass->cached_operands &
          (1u << (pass->kind == MFA_PASS_BACKWARD_KEY_VALUE ? MFA_OPERAND_V : MFA_OPERAND_DOUT))) !=
             0},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; ++i) {
        uint32_t value = constant_value(pass, expect[i].index, &found);
        CHECK(found == 1, "constant %u present %d times", expect[i].index, found);
        CHECK(value == expect[i].expected, "constant %u = %u, expected %u", expect[i].index, value,
              expect[i].expected);
    }
    for (uint32_t i = 0; i < pass->num_constants; ++i) {
        const mfa_function_constant* c = &pass->constants[i];
        CHECK(c->type == MFA_CONSTANT_TYPE_UINT || c->type == MFA_CONSTANT_TYPE_BOOL, "type");
        if (c->type == MFA_CONSTANT_TYPE_BOOL) CHECK(c->value <= 1, "bool %u", c->value);
    }
    const uint32_t packed = constant_value(pass, MFA_FC_PACK_GROUP, &found);
    if (pass->kind == MFA_PASS_FORWARD) {
        CHECK(found == 1, "pack_group in forward");
        CHECK(packed == (p->group > 1 && p->seq_q < (int64_t)pass->block_parallel),
              "pack_group %u for group %lld, Nq %lld, P %u", packed, (long long)p->group,
              (long long)p->seq_q, pass->block_parallel);
    }
    uint32_t has_lse = constant_value(pass, MFA_FC_HAS_LSE, &found);
    if (pass->kind == MFA_PASS_FORWARD) {
        CHECK(found == 1 && has_lse == (p->lse.data != NULL), "has_lse");
    } else {
        CHECK(found == 1 && has_lse == 1, "has_lse: the backward always reads L");
    }
    /* Caching never exceeds the kernels' register arrays. */
    if (constant_value(pass, MFA_FC_CACHE_PARALLEL, &found))
        CHECK(p->head_dim <= MFA_MAX_CACHED_HEAD, "cached D %lld", (long long)p->head_dim);
    if (constant_value(pass, MFA_FC_CACHE_PARALLEL2, &found))
        CHECK(p->head_dim_v <= MFA_MAX_CACHED_HEAD, "cached Dv %lld", (long long)p->head_dim_v);

    /* Bindings: exactly the operands the pass uses, each at its own index. */
    uint32_t want;
    uint32_t writes;
    switch (pass->kind) {
        case MFA_PASS_FORWARD:
            want = 1u << MFA_OPERAND_Q | 1u << MFA_OPERAND_K | 1u << MFA_OPERAND_V |
                   1u << MFA_OPERAND_O | (p->lse.data ? 1u << MFA_OPERAND_L : 0);
            writes = 1u << MFA_OPERAND_O | (p->lse.data ? 1u << MFA_OPERAND_L : 0);
            break;
        case MFA_PASS_BACKWARD_QUERY:
            want = 1u << MFA_OPERAND_Q | 1u << MFA_OPERAND_K | 1u << MFA_OPERAND_V |
                   1u << MFA_OPERAND_O | 1u << MFA_OPERAND_L | 1u << MFA_OPERAND_DELTA |
                   1u << MFA_OPERAND_DOUT | 1u << MFA_OPERAND_DQ;
            writes = 1u << MFA_OPERAND_DELTA | 1u << MFA_OPERAND_DQ;
            break;
        default:
            want = 1u << MFA_OPERAND_Q | 1u << MFA_OPERAND_K | 1u << MFA_OPERAND_V |
                   1u << MFA_OPERAND_L | 1u << MFA_OPERAND_DELTA | 1u << MFA_OPERAND_DOUT |
                   1u << MFA_OPERAND_DK | 1u << MFA_OPERAND_DV;
            writes = 1u << MFA_OPERAND_DK | 1u << MFA_OPERAND_DV;
            break;
    }
    uint32_t seen_ops = 0, seen_index = 0;
    for (uint32_t i = 0; i < pass->num_bindings; ++i) {
        const mfa_buffer_binding* b = &pass->bindings[i];
        CHECK(!(seen_ops & (1u << b->operand)), "operand %s bound twice",
              mfa_operand_name(b->operand));
        CHECK(!(seen_index & (1u << b->index)), "index %u bound twice", b->index);
        CHECK(b->index != pass->params_index, "binding at the params index");
        CHECK(b->index < 31, "index %u", b->index);
        seen_ops |= 1u << b->operand;
        seen_index |= 1u << b->index;
        CHECK(!!b->writable == !!(writes & (1u << b->operand)), "%s writable=%d",
              mfa_operand_name(b->operand), b->writable);
    }
    CHECK(seen_ops == want, "bound operands 0x%x, expected 0x%x", seen_ops, want);
}

/* Grid coverage: decode every threadgroup as the kernels do and count each output element.
 * A forward that packs a GQA group's heads into its rows covers (query head, query) pairs of
 * one key/value head per grid row. */
static void check_coverage(const mfa_problem* p, const mfa_pass_plan* pass) {
    const int kv = pass->kind == MFA_PASS_BACKWARD_KEY_VALUE;
    int found;
    const uint32_t pack_group = constant_value(pass, MFA_FC_PACK_GROUP, &found);
    const int packed = pass->kind == MFA_PASS_FORWARD && pack_group != 0;
    CHECK(pass->kind != MFA_PASS_FORWARD || found == 1, "pack_group constant in forward");
    CHECK(pass->kind == MFA_PASS_FORWARD || found == 0, "pack_group only in forward");
    const int64_t seq = kv ? p->seq_k : p->seq_q;        /* rows per output head */
    const int64_t heads = kv ? p->heads_kv : p->heads_q; /* output heads */
    const int64_t grid_heads = kv || packed ? p->heads_kv : p->heads_q;
    const int64_t grid_rows = packed ? p->group * seq : seq;
    const int64_t width = pass->kind == MFA_PASS_FORWARD ? p->head_dim_v
                          : pass->kind == MFA_PASS_BACKWARD_QUERY
                              ? p->head_dim
                              : (p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v);
    const int64_t total = p->batch * heads * seq * width;
    unsigned char* count = calloc((size_t)(total ? total : 1), 1);
    CHECK(pass->threadgroups[1] == (uint64_t)grid_heads, "grid y %llu",
          (unsigned long long)pass->threadgroups[1]);
    CHECK(pass->threadgroups[2] == (uint64_t)p->batch, "grid z");
    const uint32_t out_blocks = (uint32_t)pass->params.out_blocks;
    CHECK(out_blocks >= 1 && pass->threadgroups[0] % out_blocks == 0, "out blocks %u", out_blocks);
    for (uint64_t z = 0; z < pass->threadgroups[2]; ++z)
        for (uint64_t y = 0; y < pass->threadgroups[1]; ++y)
            for (uint64_t x = 0; x < pass->threadgroups[0]; ++x) {
                const int64_t row_block = (int64_t)(x / out_blocks);
                const int64_t out_block = (int64_t)(x % out_blocks);
                int64_t any_row = 0;
                for (int64_t r = row_block * pass->block_parallel;
                     r < (row_block + 1) * pass->block_parallel && r < grid_rows; ++r, ++any_row) {
                    const int64_t head = packed ? (int64_t)y * p->group + r / seq : (int64_t)y;
                    const int64_t s = packed ? r % seq : r;
                    for (int64_t c = out_block * pass->block_out;
                         c < (out_block + 1) * pass->block_out && c < width; ++c)
                        ++count[(((int64_t)z * heads + head) * seq + s) * width + c];
                }
                CHECK(any_row > 0, "threadgroup x=%llu has no rows", (unsigned long long)x);
            }
    int64_t wrong = 0;
    for (int64_t i = 0; i < total; ++i) wrong += count[i] != 1;
    CHECK(wrong == 0, "%lld of %lld output elements not covered exactly once (%s)",
          (long long)wrong, (long long)total, pass->kernel_name);
    free(count);
}

static void test_table_rows(void) {
    for (size_t f = 0; f < 3; ++f)
        for (int precision = 0; precision < 2; ++precision)
            for (int kind = 0; kind < 3; ++kind) {
                mfa_block_table t = mfa_block_table_for(families[f], (mfa_precision_class)precision,
                                                        (mfa_pass_kind)kind);
                CHECK(t.num_rows > 0, "empty table");
                for (uint32_t i = 0; i < t.num_rows; ++i) {
                    const mfa_block_row* r = &t.rows[i];
                    CHECK(i == 0 || r->max_head_dim > t.rows[i - 1].max_head_dim, "unsorted");
                    CHECK(r->block_parallel % 8 == 0 && r->block_parallel <= MFA_MAX_BLOCK_PARALLEL,
                          "P");
                    CHECK(r->block_traversal % 8 == 0 &&
                              r->block_traversal <= MFA_MAX_BLOCK_TRAVERSAL,
                          "T");
                    CHECK(r->block_head % 8 == 0 && r->block_head <= MFA_MAX_BLOCK_HEAD, "head");
                    /* The most a row can need: f32, staged, with per-row vectors. */
                    uint32_t bytes = mfa_staging_bytes(r->block_parallel, r->block_traversal,
                                                       r->block_traversal, r->block_head, 4, 2);
                    CHECK(bytes <= MFA_PLAN_THREADGROUP_MEMORY_LIMIT,
                          "row %u of table (%zu,%d,%d) needs %u bytes", i, f, precision, kind,
                          bytes);
                }
            }
}

/* Every family x dtype x head dims up to the maximum plans within limits. */
static void test_all_head_dims(void) {
    static const int64_t dims[] = {1,   2,   3,   7,   8,   9,   15,  16,  17,  24,
                                   31,  32,  33,  40,  48,  56,  63,  64,  65,  72,
                                   80,  96,  100, 127, 128, 129, 144, 160, 192, 224,
                                   255, 256, 257, 320, 384, 385, 512, 640, 777, 1024};
    const size_t n = sizeof dims / sizeof dims[0];
    for (size_t f = 0; f < 3; ++f)
        for (size_t t = 0; t < 3; ++t)
            for (size_t i = 0; i < n; ++i)
                for (size_t j = 0; j < n; j += 3) {
                    mfa_problem p = make_problem(dtypes[t], 1, 2, 1, 5, 7, dims[i], dims[j], 1);
                    mfa_plan plan;
                    mfa_status s = mfa_plan_forward(&p, families[f], 1024, &plan);
                    CHECK(s == MFA_OK, "forward D=%lld: %s", (long long)dims[i], mfa_last_error());
                    if (s == MFA_OK) check_pass(&p, &plan.passes[0], 1024);
                    s = mfa_plan_backward(&p, families[f], 1024, &plan);
                    CHECK(s == MFA_OK, "backward D=%lld: %s", (long long)dims[i], mfa_last_error());
                    if (s == MFA_OK) {
                        CHECK(plan.num_passes == 2, "passes");
                        CHECK(plan.passes[0].kind == MFA_PASS_BACKWARD_QUERY &&
                                  plan.passes[1].kind == MFA_PASS_BACKWARD_KEY_VALUE,
                              "pass order: D before dK/dV");
                        CHECK(plan.scratch_bytes == 1 * 2 * 5 * 4, "scratch %lld",
                              (long long)plan.scratch_bytes);
                        check_pass(&p, &plan.passes[0], 1024);
                        check_pass(&p, &plan.passes[1], 1024);
                    }
                }
}

static void test_coverage(void) {
    static const int64_t shapes[][7] = {
        /* b, hq, hkv, nq, nk, d, dv */
        {1, 1, 1, 1, 1, 1, 1},       {2, 4, 2, 33, 17, 64, 64},
        {3, 6, 1, 100, 129, 40, 24}, {1, 2, 2, 31, 64, 300, 520},
        {2, 3, 3, 17, 5, 129, 8},    {2, 8, 2, 1, 40, 64, 64}, /* decode with GQA: packed forward */
        {1, 6, 1, 5, 9, 16, 200}, /* packed rows spanning heads, split output columns */
    };
    for (size_t f = 0; f < 3; ++f)
        for (size_t t = 0; t < 3; ++t)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
                const int64_t* x = shapes[s];
                mfa_problem p =
                    make_problem(dtypes[t], x[0], x[1], x[2], x[3], x[4], x[5], x[6], 0);
                mfa_plan plan;
                if (mfa_plan_forward(&p, families[f], 1024, &plan) == MFA_OK)
                    check_coverage(&p, &plan.passes[0]);
                else
                    CHECK(0, "forward: %s", mfa_last_error());
                if (mfa_plan_backward(&p, families[f], 1024, &plan) == MFA_OK) {
                    check_coverage(&p, &plan.passes[0]);
                    check_coverage(&p, &plan.passes[1]);
                } else {
                    CHECK(0, "backward: %s", mfa_last_error());
                }
            }
}

/* Whether two plans ask the GPU for the same work: the same passes, kernels, constants, grids,
 * memory, bindings and parameters. */
static int same_plans(const mfa_plan* a, const mfa_plan* b) {
    if (a->num_passes != b->num_passes || a->splits != b->splits ||
        a->scratch_bytes != b->scratch_bytes)
        return 0;
    for (uint32_t i = 0; i < a->num_passes; ++i) {
        const mfa_pass_plan* x = &a->passes[i];
        const mfa_pass_plan* y = &b->passes[i];
        if (x->kind != y->kind || strcmp(x->kernel_name, y->kernel_name) != 0 ||
            x->block_parallel != y->block_parallel || x->block_traversal != y->block_traversal ||
            x->block_head != y->block_head || x->block_out != y->block_out ||
            x->cached_operands != y->cached_operands || x->num_constants != y->num_constants ||
            memcmp(x->constants, y->constants, x->num_constants * sizeof x->constants[0]) != 0 ||
            memcmp(x->threadgroups, y->threadgroups, sizeof x->threadgroups) != 0 ||
            x->threads_per_threadgroup != y->threads_per_threadgroup ||
            x->threadgroup_memory_length != y->threadgroup_memory_length ||
            x->num_bindings != y->num_bindings || x->params_index != y->params_index ||
            memcmp(&x->params, &y->params, sizeof x->params) != 0)
            return 0;
        for (uint32_t j = 0; j < x->num_bindings; ++j) {
            const mfa_buffer_binding* s = &x->bindings[j];
            const mfa_buffer_binding* t = &y->bindings[j];
            if (s->index != t->index || s->operand != t->operand || s->writable != t->writable ||
                s->byte_offset != t->byte_offset || s->byte_length != t->byte_length)
                return 0;
        }
    }
    return 1;
}

/* Apple8 plans exactly as Apple7 does (MFA publishes one table for both). The Python suite runs
 * metal-sim as Apple7 and Apple9 only, on the strength of this test: should the families' plans
 * ever differ, it fails, and Apple8 belongs in that suite again. */
static void test_apple8_plans_as_apple7(void) {
    static const int64_t shapes[][7] = {
        /* b, hq, hkv, nq, nk, d, dv */
        {1, 1, 1, 1, 1, 1, 1},         {2, 4, 2, 33, 17, 64, 64},
        {3, 6, 1, 100, 129, 40, 24},   {1, 2, 2, 31, 64, 300, 520},
        {2, 3, 3, 17, 5, 129, 8},      {2, 8, 2, 1, 40, 64, 64},
        {1, 6, 1, 5, 9, 16, 200},      {1, 8, 1, 1, 8192, 128, 128},
        {1, 2, 1, 1000, 129, 512, 64}, {1, 1, 1, 256, 256, 1024, 1024},
    };
    int compared = 0;
    for (size_t t = 0; t < 3; ++t)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
            for (int backward = 0; backward < 2; ++backward) {
                const int64_t* x = shapes[s];
                const mfa_problem p =
                    make_problem(dtypes[t], x[0], x[1], x[2], x[3], x[4], x[5], x[6], 1);
                mfa_plan apple7, apple8;
                memset(&apple7, 0, sizeof apple7);
                memset(&apple8, 0, sizeof apple8);
                const mfa_status s7 =
                    backward ? mfa_plan_backward(&p, MFA_GPU_FAMILY_APPLE7, 1024, &apple7)
                             : mfa_plan_forward(&p, MFA_GPU_FAMILY_APPLE7, 1024, &apple7);
                const mfa_status s8 =
                    backward ? mfa_plan_backward(&p, MFA_GPU_FAMILY_APPLE8, 1024, &apple8)
                             : mfa_plan_forward(&p, MFA_GPU_FAMILY_APPLE8, 1024, &apple8);
                CHECK(s7 == s8, "status %d against %d", (int)s7, (int)s8);
                if (s7 != MFA_OK || s8 != MFA_OK) continue;
                CHECK(same_plans(&apple7, &apple8), "%s plans differ: D=%lld Dv=%lld Nq=%lld",
                      backward ? "backward" : "forward", (long long)x[5], (long long)x[6],
                      (long long)x[3]);
                ++compared;
            }
    CHECK(compared >= 50, "only %d plans compared", compared);
}

/* The kernels' band test (i + band_lo <= j <= i + band_hi) against backend.h's rule. */
static void test_band(void) {
    static const int64_t windows[] = {-1, 0, 1, 2, 5, 40, INT64_MAX / 2};
    const size_t nw = sizeof windows / sizeof windows[0];
    for (int64_t nq = 1; nq <= 9; nq += 4)
        for (int64_t nk = 1; nk <= 11; nk += 5)
            for (int align = 0; align < 2; ++align)
                for (size_t a = 0; a < nw; ++a)
                    for (size_t b = 0; b < nw; ++b) {
                        mfa_problem p = make_problem(MFA_DTYPE_F32, 1, 1, 1, nq, nk, 8, 8, 1);
                        const int64_t diag_offset = align ? 0 : nk - nq;
                        const int64_t window_left = windows[a], window_right = windows[b];
                        mfa_visibility_band(nq, nk, diag_offset, window_left, window_right,
                                            &p.band_lo, &p.band_hi);
                        mfa_plan plan;
                        if (mfa_plan_forward(&p, MFA_GPU_FAMILY_APPLE9, 1024, &plan) != MFA_OK) {
                            CHECK(0, "%s", mfa_last_error());
                            continue;
                        }
                        const mfa_kernel_params* k = &plan.passes[0].params;
                        CHECK(k->band_lo >= -nq && k->band_lo <= nk, "band_lo %d", k->band_lo);
                        CHECK(k->band_hi >= -nq && k->band_hi <= nk, "band_hi %d", k->band_hi);
                        for (int64_t i = 0; i < nq; ++i)
                            for (int64_t j = 0; j < nk; ++j) {
                                /* backend.h, in 128-bit-safe form: lo/hi may be huge. */
                                int lo_ok =
                                    window_left < 0 ||
                                    (double)j >= (double)(i + diag_offset) - (double)window_left;
                                int hi_ok =
                                    window_right < 0 ||
                                    (double)j <= (double)(i + diag_offset) + (double)window_right;
                                int expected = lo_ok && hi_ok;
                                int got = i + k->band_lo <= j && j <= i + k->band_hi;
                                CHECK(expected == got,
                                      "nq=%lld nk=%lld wl=%lld wr=%lld i=%lld j=%lld",
                                      (long long)nq, (long long)nk, (long long)window_left,
                                      (long long)window_right, (long long)i, (long long)j);
                            }
                    }
}

/* Negative and broadcast (zero) strides bind the lowest reachable byte and the exact extent. */
static void test_strided_bindings(void) {
    static char memory[1 << 16];
    mfa_problem p = make_problem(MFA_DTYPE_F16, 2, 3, 3, 5, 6, 4, 4, 1);
    p.q.data = memory + 40000;
    p.q.stride[0] = -3 * 5 * 4;
    p.q.stride[1] = 4; /* bshd */
    p.q.stride[2] = -3 * 4;
    p.q.stride[3] = 1;
    p.k.stride[0] = 0; /* broadcast over batch */
    mfa_plan plan;
    CHECK(mfa_plan_forward(&p, MFA_GPU_FAMILY_APPLE7, 1024, &plan) == MFA_OK, "%s",
          mfa_last_error());
    const mfa_pass_plan* pass = &plan.passes[0];
    for (uint32_t i = 0; i < pass->num_bindings; ++i) {
        const mfa_buffer_binding* b = &pass->bindings[i];
        if (b->operand == MFA_OPERAND_Q) {
            const int64_t lowest = -60 * 1 + -12 * 4; /* b=1, s=4 */
            const int64_t highest = 4 * 2 + 3;        /* h=2, d=3 */
            CHECK(b->byte_offset == lowest * 2, "q offset %lld", (long long)b->byte_offset);
            CHECK(b->byte_length == (highest - lowest + 1) * 2, "q length %lld",
                  (long long)b->byte_length);
            CHECK(pass->params.q.origin == -lowest, "q origin %lld",
                  (long long)pass->params.q.origin);
        }
        if (b->operand == MFA_OPERAND_K)
            CHECK(b->byte_length == 3 * 6 * 4 * 2 && b->byte_offset == 0, "k extent %lld",
                  (long long)b->byte_length);
        if (b->operand == MFA_OPERAND_L)
            CHECK(b->byte_length == 2 * 3 * 5 * 4, "lse extent %lld", (long long)b->byte_length);
    }
}

/* Which operands' rows the kernels may read four elements at a time: contiguous features, the
 * origin and the strides of axes longer than 1 a multiple of 4 elements, and element 0 at an
 * address that is one too. */
static void test_vector_operands(void) {
    static _Alignas(16) char memory[1 << 16];
    mfa_problem p = make_problem(MFA_DTYPE_F16, 2, 2, 1, 16, 16, 8, 8, 1);
    p.q.data = memory;     /* aligned, contiguous */
    p.k.data = memory + 8; /* 4 f16 elements in: aligned */
    p.v.data = memory + 2; /* 1 element in */
    p.dout.data = memory;  /* rows of 10 elements */
    p.dout.stride[2] = 10;
    p.dout.stride[1] = 16 * 10;
    p.dout.stride[0] = 2 * 16 * 10;
    p.out.data = memory; /* features strided */
    p.out.stride[3] = 2;
    p.out.stride[2] = 16;
    p.out.stride[1] = 16 * 16;
    p.out.stride[0] = 2 * 16 * 16;
    p.dq.data = memory; /* a batch stride of 6, but one batch: never used */
    p.dq.stride[0] = 6;
    p.batch = 1;
    p.k.stride[0] = p.v.stride[0] = 0;
    p.k.stride[1] = p.v.stride[1] = 0;
    mfa_plan plan;
    CHECK(mfa_plan_backward(&p, MFA_GPU_FAMILY_APPLE7, 1024, &plan) == MFA_OK, "%s",
          mfa_last_error());
    const uint32_t expected = 1u << MFA_OPERAND_Q | 1u << MFA_OPERAND_K | 1u << MFA_OPERAND_DQ;
    const uint32_t checked =
        expected | 1u << MFA_OPERAND_V | 1u << MFA_OPERAND_DOUT | 1u << MFA_OPERAND_O;
    for (uint32_t i = 0; i < plan.num_passes; ++i) {
        const uint32_t bits = plan.passes[i].params.vector_operands;
        uint32_t bound = 0;
        for (uint32_t j = 0; j < plan.passes[i].num_bindings; ++j)
            bound |= 1u << plan.passes[i].bindings[j].operand;
        CHECK((bits & checked & bound) == (expected & bound), "pass %u: vector_operands %#x", i,
              bits);
    }
}

static void test_limits_and_errors(void) {
    mfa_problem p = make_problem(MFA_DTYPE_F32, 1, 1, 1, 64, 64, 64, 64, 0);
    mfa_plan plan;
    CHECK(mfa_plan_forward(&p, MFA_GPU_FAMILY_APPLE7, 64, &plan) == MFA_OK, "%s", mfa_last_error());
    CHECK(plan.passes[0].threads_per_threadgroup <= 64 && plan.passes[0].block_parallel == 16,
          "P %u under a 64-thread pipeline", plan.passes[0].block_parallel);
    check_coverage(&p, &plan.passes[0]);
    CHECK(mfa_plan_backward(&p, MFA_GPU_FAMILY_APPLE8, 96, &plan) == MFA_OK, "%s",
          mfa_last_error());
    for (uint32_t i = 0; i < plan.num_passes; ++i) {
        CHECK(plan.passes[i].block_parallel == 24, "P %u under a 96-thread pipeline",
              plan.passes[i].block_parallel);
        check_pass(&p, &plan.passes[i], 96);
        check_coverage(&p, &plan.passes[i]);
    }
    CHECK_ERROR("max threads below a simdgroup",
                mfa_plan_forward(&p, MFA_GPU_FAMILY_APPLE9, 16, &plan), MFA_ERROR_INVALID_ARGUMENT,
                "max_threads_per_threadgroup 16 is below one simdgroup");
    CHECK_ERROR("family NONE", mfa_plan_forward(&p, MFA_GPU_FAMILY_NONE, 1024, &plan),
                MFA_ERROR_INVALID_ARGUMENT, "gpu family 0 is not Apple7, Apple8 or Apple9");
    CHECK_ERROR("family 10", mfa_plan_forward(&p, (mfa_gpu_family)10, 1024, &plan),
                MFA_ERROR_INVALID_ARGUMENT, "gpu family 10 is not Apple7, Apple8 or Apple9");
    p.head_dim = MFA_PLAN_MAX_HEAD_DIM + 1;
    CHECK_ERROR("D too large", mfa_plan_backward(&p, MFA_GPU_FAMILY_APPLE9, 1024, &plan),
                MFA_ERROR_UNSUPPORTED, "head dims");
    p.head_dim = 64;
    p.seq_q = (INT64_C(1) << 30) + 1;
    CHECK_ERROR("Nq too large", mfa_plan_forward(&p, MFA_GPU_FAMILY_APPLE9, 1024, &plan),
                MFA_ERROR_UNSUPPORTED, "sequence lengths Nq=1073741825 Nk=64 exceed 2^30");
}

/* Split keys: decoding against a long cache splits the keys (and a combine pass follows, binding
 * the partial results exactly as the forward does); a grid that fills the GPU does not; an
 * initial state over rows shared by output blocks goes through the combine from one split. The
 * backward's sink gradient and a paged cache's appends are passes of their own. */
static const mfa_buffer_binding* binding_of(const mfa_pass_plan* pass, mfa_operand operand) {
    for (uint32_t i = 0; i < pass->num_bindings; ++i)
        if (pass->bindings[i].operand == operand) return &pass->bindings[i];
    return NULL;
}

static void test_split_keys_and_row_passes(void) {
    char* base = planner_problem_base;
    mfa_plan plan;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; ++f) {
        mfa_problem p = make_problem(MFA_DTYPE_F32, 1, 8, 2, 1, 4096, 64, 64, 1);
        CHECK(mfa_plan_forward(&p, families[f], 1024, &plan) == MFA_OK, "%s", mfa_last_error());
        const mfa_pass_plan* forward = &plan.passes[0];
        const mfa_pass_plan* combine = &plan.passes[1];
        CHECK(plan.num_passes == 2 && combine->kind == MFA_PASS_COMBINE && plan.splits > 1,
              "decode: %u passes, %u splits", plan.num_passes, plan.splits);
        if (plan.num_passes != 2) continue;
        const int64_t keys = forward->params.split_keys;
        CHECK(keys % forward->block_traversal == 0 && keys * plan.splits >= 4096 &&
                  keys * (plan.splits - 1) < 4096,
              "%u splits of %lld keys", plan.splits, (long long)keys);
        CHECK(forward->threadgroups[0] % plan.splits == 0, "a threadgroup per split");
        CHECK(binding_of(forward, MFA_OPERAND_L) == NULL && binding_of(combine, MFA_OPERAND_L),
              "the combine, not the forward, stores L");
        for (mfa_operand op = MFA_OPERAND_PARTIAL_O; op <= MFA_OPERAND_PARTIAL_L; ++op) {
            const mfa_buffer_binding *a = binding_of(forward, op), *b = binding_of(combine, op);
            CHECK(a && b && a->byte_length == b->byte_length && a->byte_offset == 0,
                  "%s bound alike", mfa_operand_name(op));
        }
        CHECK(plan.scratch_bytes == (int64_t)plan.splits * 8 * (64 + 1) * 4, "scratch %lld",
              (long long)plan.scratch_bytes);
        CHECK(combine->params.split_stride_o == 8 * 64 && combine->params.split_stride_l == 8,
              "split strides %lld %lld", (long long)combine->params.split_stride_o,
              (long long)combine->params.split_stride_l);

        p = make_problem(MFA_DTYPE_F16, 4, 16, 16, 1024, 1024, 64, 64, 1);
        CHECK(mfa_plan_forward(&p, families[f], 1024, &plan) == MFA_OK && plan.num_passes == 1 &&
                  plan.splits == 0,
              "prefill splits %u", plan.splits);

        p = make_problem(MFA_DTYPE_BF16, 1, 2, 2, 40, 70, 32, 200, 1);
        p.initial_state = 1;
        CHECK(mfa_plan_forward(&p, families[f], 1024, &plan) == MFA_OK && plan.num_passes == 2 &&
                  plan.splits == 1,
              "wide initial state: %u passes, %u splits", plan.num_passes, plan.splits);
        p.head_dim_v = 64;
        contiguous(&p.v, base + 3, 2, 70, 64);
        contiguous(&p.out, base + 4, 2, 40, 64);
        CHECK(mfa_plan_forward(&p, families[f], 1024, &plan) == MFA_OK && plan.num_passes == 1,
              "narrow initial state: %u passes", plan.num_passes);

        p = make_problem(MFA_DTYPE_F32, 2, 4, 2, 30, 30, 16, 16, 1);
        contiguous(&p.sinks, base + 10, 4, 1, 1);
        contiguous(&p.dsinks, base + 11, 4, 1, 1);
        CHECK(mfa_plan_backward(&p, families[f], 1024, &plan) == MFA_OK && plan.num_passes == 3 &&
                  plan.passes[2].kind == MFA_PASS_SINK_GRADIENT &&
                  plan.passes[2].threadgroups[0] == 4 &&
                  binding_of(&plan.passes[2], MFA_OPERAND_DELTA)->byte_length ==
                      binding_of(&plan.passes[0], MFA_OPERAND_DELTA)->byte_length,
              "sink gradient after the backward: %u passes", plan.num_passes);
    }
}

int main(void) {
    test_table_rows();
    test_all_head_dims();
    test_coverage();
    test_band();
    test_strided_bindings();
    test_vector_operands();
    test_limits_and_errors();
    test_split_keys_and_row_passes();
    test_apple8_plans_as_apple7();
    return test_finish("planner tests");
}
