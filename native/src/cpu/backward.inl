/*
 * Backward pass (MFA's scheme): row_dot = rowsum(dO * O) first, then blocks of query rows
 * accumulate dQ and, independently, blocks of key rows accumulate dK and dV over every query
 * head of their group. Each output element has one owner: no atomics, no N x N buffer.
 *
 * With scores in base 2 (s = q.k * scale * log2 e): P = 2^(s - lse * log2 e),
 * dS = P * (dO.v - row_dot), dQ = scale * dS K, dK = scale * dS^T Q, dV = P^T dO.
 */

template <class Storage>
static void row_dot_task(const mfa_cpu_plan* plan, int64_t task, float* slot)
{
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const int64_t qb = task % plan->q_blocks;
    const int64_t bh = task / plan->q_blocks;
    const int64_t i0 = qb * plan->block_q;
    const int64_t rows = p->seq_q - i0 < plan->block_q ? p->seq_q - i0 : plan->block_q;
    const int64_t dv = p->head_dim_v;
    const int64_t b = bh / p->heads_q, h = bh % p->heads_q;
    const strided_rows out = rows_of(p->out, es, b, h, i0);
    const strided_rows dout = rows_of(p->dout, es, b, h, i0);
    float* o = slot;
    float* dO = slot + mfa_cpu_round_up(dv, 16);
    for (int64_t r = 0; r < rows; ++r) {
        load_row<Storage>(out.row(r), out.elem_step, dv, 1.0f, o, 1);
        load_row<Storage>(dout.row(r), dout.elem_step, dv, 1.0f, dO, 1);
        float dot = 0.0f;
        for (int64_t x = 0; x < dv; ++x)
            dot += o[x] * dO[x];
        plan->row_dot[bh * p->seq_q + i0 + r] = dot;
    }
}

/* Base-2 log-sum-exp and row_dot of query rows i0 .. i0+count, padded to padded_count. A row
 * that sees no key has lse -inf; storing +inf instead makes its P = 2^(s - inf) = 0 whether its
 * (masked) s is finite or -inf, so no special case reaches the products. */
static void load_row_stats(const mfa_cpu_plan* plan, int64_t b, int64_t h, int64_t i0,
                           int64_t count, int64_t padded_count, float* lse2, float* row_dot)
{
    const mfa_problem* p = plan->problem;
    const strided_rows lse = rows_of(p->lse, sizeof(float), b, h, i0);
    const float* dots = plan->row_dot + (b * p->heads_q + h) * p->seq_q + i0;
    for (int64_t c = 0; c < padded_count; ++c) {
        const float l = c < count ? f32_storage::load(lse.row(c)) : -__builtin_inff();
        lse2[c] = l == -__builtin_inff() ? __builtin_inff() : l * kLog2e;
        row_dot[c] = c < count ? dots[c] : 0.0f;
    }
}

/* dS = P * (dP - row_dot) in place of P, where row_dot varies along rows (dQ) ... */
static void softmax_grad_rows(float* s, const float* dp, int64_t rows, int64_t ld,
                              const float* row_dot)
{
    for (int64_t r = 0; r < rows; ++r) {
        const vf dot = vsplat(row_dot[r]);
        for (int64_t c = 0; c < ld; c += W)
            vstore(s + r * ld + c, vload(s + r * ld + c) * (vload(dp + r * ld + c) - dot));
    }
}

/* ... or along columns (dK/dV, where the tile is transposed). */
static void softmax_grad_cols(float* s, const float* dp, int64_t rows, int64_t ld,
                              const float* col_dot)
{
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < ld; c += W)
            vstore(s + r * ld + c,
                   vload(s + r * ld + c) * (vload(dp + r * ld + c) - vload(col_dot + c)));
}

template <class Storage>
static void query_grad_task(const mfa_cpu_plan* plan, int64_t task, float* slot)
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
    const int64_t d_pad = mfa_cpu_round_up(d, NR);

    mfa_cpu_backward_tiles t;
    mfa_cpu_backward_tiles_carve(plan, slot, &t);
    pack_rows<Storage>(rows_of(p->q, es, b, h, i0), rows, d, plan->score_scale, t.rows, d);
    pack_rows<Storage>(rows_of(p->dout, es, b, h, i0), rows, dv, 1.0f, t.rows_out_grad, dv);
    load_row_stats(plan, b, h, i0, rows, rows, t.lse, t.row_dot);
    for (int64_t i = 0; i < rows * d_pad; ++i)
        t.acc[i] = 0.0f;

    const int64_t key_lo = mfa_cpu_key_begin(plan, i0);
    const int64_t key_hi = mfa_cpu_key_end(plan, i0 + rows - 1);
    for (int64_t j0 = key_lo; j0 < key_hi; j0 += plan->block_k) {
        const int64_t n = key_hi - j0 < plan->block_k ? key_hi - j0 : plan->block_k;
        const int64_t n_pad = mfa_cpu_round_up(n, NR);
        const strided_rows k = rows_of(p->k, es, b, kv_head, j0);
        pack_panels_transposed<Storage>(k, n, d, 1.0f, t.cols_t);
        pack_panels<Storage>(k, n, d, 1.0f, t.cols);
        pack_panels_transposed<Storage>(rows_of(p->v, es, b, kv_head, j0), n, dv, 1.0f,
                                        t.cols_out_grad_t);

        gemm_packed(rows, n, d, t.rows, d, t.cols_t, t.s, n_pad, false);
        mask_query_rows(plan, i0, rows, j0, n, t.s, n_pad);
        for (int64_t r = 0; r < rows; ++r)
            exp2_shifted_sum(t.s + r * n_pad, n_pad, t.lse[r]);
        gemm_packed(rows, n, dv, t.rows_out_grad, dv, t.cols_out_grad_t, t.dp, n_pad, false);
        softmax_grad_rows(t.s, t.dp, rows, n_pad, t.row_dot);
        gemm_packed(rows, d, n, t.s, n_pad, t.cols, t.acc, d_pad, true);
    }
    store_rows<Storage>(rows_of(p->dq, es, b, h, i0), rows, d, t.acc, d_pad, p->scale);
}

template <class Storage>
static void key_value_grad_task(const mfa_cpu_plan* plan, int64_t task, float* slot)
{
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const int64_t kb = task % plan->k_blocks;
    const int64_t kv_head = task / plan->k_blocks % p->heads_kv;
    const int64_t b = task / plan->k_blocks / p->heads_kv;
    const int64_t j0 = kb * plan->block_k;
    const int64_t rows = p->seq_k - j0 < plan->block_k ? p->seq_k - j0 : plan->block_k;
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t d_pad = mfa_cpu_round_up(d, NR), dv_pad = mfa_cpu_round_up(dv, NR);

    mfa_cpu_backward_tiles t;
    mfa_cpu_backward_tiles_carve(plan, slot, &t);
    pack_rows<Storage>(rows_of(p->k, es, b, kv_head, j0), rows, d, 1.0f, t.rows, d);
    pack_rows<Storage>(rows_of(p->v, es, b, kv_head, j0), rows, dv, 1.0f, t.rows_out_grad, dv);
    for (int64_t i = 0; i < rows * d_pad; ++i)
        t.acc[i] = 0.0f;
    for (int64_t i = 0; i < rows * dv_pad; ++i)
        t.acc_v[i] = 0.0f;

    const int64_t query_lo = mfa_cpu_query_begin(plan, j0);
    const int64_t query_hi = mfa_cpu_query_end(plan, j0 + rows - 1);
    for (int64_t h = kv_head * p->group; h < (kv_head + 1) * p->group; ++h) {
        for (int64_t i0 = query_lo; i0 < query_hi; i0 += plan->block_q) {
            const int64_t n = query_hi - i0 < plan->block_q ? query_hi - i0 : plan->block_q;
            const int64_t n_pad = mfa_cpu_round_up(n, NR);
            const strided_rows q = rows_of(p->q, es, b, h, i0);
            const strided_rows dout = rows_of(p->dout, es, b, h, i0);
            pack_panels_transposed<Storage>(q, n, d, plan->score_scale, t.cols_t);
            pack_panels<Storage>(q, n, d, 1.0f, t.cols);
            pack_panels_transposed<Storage>(dout, n, dv, 1.0f, t.cols_out_grad_t);
            pack_panels<Storage>(dout, n, dv, 1.0f, t.cols_out_grad);
            load_row_stats(plan, b, h, i0, n, n_pad, t.lse, t.row_dot);

            gemm_packed(rows, n, d, t.rows, d, t.cols_t, t.s, n_pad, false);
            mask_key_rows(plan, j0, rows, i0, n, t.s, n_pad);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t c = 0; c < n_pad; c += W)
                    vstore(t.s + r * n_pad + c,
                           vexp2(vload(t.s + r * n_pad + c) - vload(t.lse + c)));
            gemm_packed(rows, dv, n, t.s, n_pad, t.cols_out_grad, t.acc_v, dv_pad, true);
            gemm_packed(rows, n, dv, t.rows_out_grad, dv, t.cols_out_grad_t, t.dp, n_pad, false);
            softmax_grad_cols(t.s, t.dp, rows, n_pad, t.row_dot);
            gemm_packed(rows, d, n, t.s, n_pad, t.cols, t.acc, d_pad, true);
        }
    }
    store_rows<Storage>(rows_of(p->dk, es, b, kv_head, j0), rows, d, t.acc, d_pad, p->scale);
    store_rows<Storage>(rows_of(p->dv, es, b, kv_head, j0), rows, dv, t.acc_v, dv_pad, 1.0f);
}

template <class Storage>
static void backward_task(const mfa_cpu_plan* plan, int64_t task, float* slot)
{
    const mfa_problem* p = plan->problem;
    const int64_t query_tasks = p->batch * p->heads_q * plan->q_blocks;
    if (task < query_tasks)
        query_grad_task<Storage>(plan, task, slot);
    else
        key_value_grad_task<Storage>(plan, task - query_tasks, slot);
}
