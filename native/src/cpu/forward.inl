/*
 * Forward pass for one block of query rows of one (batch, head): FlashAttention's online
 * softmax over the visible key blocks, all in f32, in base 2 (scale * log2(e) is folded into Q).
 */

template <class Storage>
static void forward_task(const mfa_cpu_plan* plan, int64_t task, float* slot)
{
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const int64_t qb = plan->q_blocks - 1 - task % plan->q_blocks; /* longest first when causal */
    const int64_t h = task / plan->q_blocks % p->heads_q;
    const int64_t b = task / plan->q_blocks / p->heads_q;
    const int64_t kv_head = h / p->group;
    const int64_t i0 = qb * plan->block_q;
    const int64_t rows = p->seq_q - i0 < plan->block_q ? p->seq_q - i0 : plan->block_q;
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t dv_pad = mfa_cpu_round_up(dv, NR);

    mfa_cpu_forward_tiles t;
    mfa_cpu_forward_tiles_carve(plan, slot, &t);

    pack_rows<Storage>(rows_of(p->q, es, b, h, i0), rows, d, plan->score_scale, t.q, d);
    for (int64_t i = 0; i < rows * dv_pad; ++i)
        t.o[i] = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
        t.row_max[r] = -__builtin_inff();
        t.row_sum[r] = 0.0f;
    }

    /* Visible ranges move monotonically with the row, so the block's keys are one interval. */
    const int64_t key_lo = mfa_cpu_key_begin(plan, i0);
    const int64_t key_hi = mfa_cpu_key_end(plan, i0 + rows - 1);
    for (int64_t j0 = key_lo; j0 < key_hi; j0 += plan->block_k) {
        const int64_t n = key_hi - j0 < plan->block_k ? key_hi - j0 : plan->block_k;
        const int64_t n_pad = mfa_cpu_round_up(n, NR);
        pack_panels_transposed<Storage>(rows_of(p->k, es, b, kv_head, j0), n, d, 1.0f, t.kt);
        gemm_packed(rows, n, d, t.q, d, t.kt, t.s, n_pad, false);
        mask_query_rows(plan, i0, rows, j0, n, t.s, n_pad);

        for (int64_t r = 0; r < rows; ++r) {
            float* s = t.s + r * n_pad;
            const float old_max = t.row_max[r];
            const float block_max = row_max(s, n_pad);
            const float new_max = block_max > old_max ? block_max : old_max;
            if (new_max == -__builtin_inff()) {
                /* Nothing visible to this row yet: its P is 0, not 2^(-inf - -inf). */
                for (int64_t c = 0; c < n_pad; ++c)
                    s[c] = 0.0f;
                continue;
            }
            const float block_sum = exp2_shifted_sum(s, n_pad, new_max);
            if (new_max != old_max) {
                const float correction = exp2f(old_max - new_max);
                t.row_sum[r] *= correction;
                scale_row(t.o + r * dv_pad, dv_pad, correction);
                t.row_max[r] = new_max;
            }
            t.row_sum[r] += block_sum;
        }
        pack_panels<Storage>(rows_of(p->v, es, b, kv_head, j0), n, dv, 1.0f, t.v);
        gemm_packed(rows, dv, n, t.s, n_pad, t.v, t.o, dv_pad, true);
    }

    /* A row that saw no key keeps max -inf and sum 0: out 0 (its accumulator is 0) and
     * lse -inf, never 0/0. */
    for (int64_t r = 0; r < rows; ++r) {
        const bool empty = t.row_sum[r] == 0.0f;
        scale_row(t.o + r * dv_pad, dv_pad, empty ? 0.0f : 1.0f / t.row_sum[r]);
        t.row_sum[r] = empty ? -__builtin_inff()
                             : (t.row_max[r] + log2f(t.row_sum[r])) * kLn2;
    }
    store_rows<Storage>(rows_of(p->out, es, b, h, i0), rows, dv, t.o, dv_pad, 1.0f);
    if (p->lse.data) {
        const strided_rows lse = rows_of(p->lse, sizeof(float), b, h, i0);
        for (int64_t r = 0; r < rows; ++r)
            f32_storage::store(lse.row(r), t.row_sum[r]);
    }
}
