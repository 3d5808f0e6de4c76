// The passes around the attention kernels that work row by row, MFA_ROW_PASS_THREADS threads
// each: appending new keys to a paged cache, combining the partial results of split keys, and
// the gradient of the sinks.
#ifndef MFA_ATTENTION_ROW_PASSES_H
#define MFA_ATTENTION_ROW_PASSES_H

#include "memory.h"
#include "softmax.h"

// Row n of k_new / v_new of sequence b (group.z) and kv head group.y, n = group.x, into the
// cache row that key cache_seqlens[b] + n of the sequence maps to. The core checked that every
// such row is inside the cache and written once, so no two threadgroups write the same bytes.
inline void attention_append(device const uchar* k_new, device const uchar* v_new, device uchar* k,
                             device uchar* v, device const int* block_table,
                             device const int* cache_seqlens, constant mfa_kernel_params& p,
                             uint3 group, ushort thread_index) {
    const uint n = group.x, kv_head = group.y, batch = group.z;
    const int key = load_int(cache_seqlens, p.cache_seqlens, batch, 0) + int(n);
    const int block = load_int(block_table, p.block_table, batch, key / p.block_size);
    const int row = key % p.block_size;
    const operand_slice k_src = slice_of(p.k_new, batch, kv_head);
    const operand_slice v_src = slice_of(p.v_new, batch, kv_head);
    const operand_slice k_dst = slice_of(p.k, uint(block), kv_head);
    const operand_slice v_dst = slice_of(p.v, uint(block), kv_head);
    for (uint d = thread_index; d < fc_head_dim; d += MFA_ROW_PASS_THREADS)
        store_element(k, k_dst.at(row, d), load_element(k_new, k_src.at(int(n), d)));
    for (uint d = thread_index; d < fc_head_dim_v; d += MFA_ROW_PASS_THREADS)
        store_element(v, v_dst.at(row, d), load_element(v_new, v_src.at(int(n), d)));
}

// Row group.x of query head group.y, batch group.z (packed rows: batch 0 and the packed row):
// the splits' partial results merged through their log-sum-exps, with the sink and the initial
// state (out, lse) as further terms, into O and L. Every thread derives the row's weights
// itself; each then owns the columns thread_index + k * MFA_ROW_PASS_THREADS. A term whose lse
// is -inf saw no key and its output is not read (lse_is_empty); a row with no term left gets
// O = 0 and L = -inf.
inline void attention_combine(device const float* partial_o, device const float* partial_l,
                              device const float* sinks, device uchar* o, device float* l,
                              constant mfa_kernel_params& p, uint3 group, ushort thread_index) {
    const int row = int(group.x);
    const uint head = group.y, batch = group.z;
    const operand_slice part_o = slice_of(p.partial_o, batch, head);
    const long part_l = slice_of(p.partial_l, batch, head).at(row, 0);
    const operand_slice o_slice = slice_of(p.o, batch, head);
    const long l_at = slice_of(p.l, batch, head).at(row, 0);

    const float sink = fc_has_sinks ? sinks[p.sinks.origin + long(head) * p.sinks.stride[1]]
                                    : as_type<float>(kEmptyRowLogSumExpBits);
    const float entry = fc_initial_state ? l[l_at] : as_type<float>(kEmptyRowLogSumExpBits);
    softmax_row stats = softmax_row_start();
    for (int s = 0; s < p.splits; ++s) {
        const float lse = partial_l[long(s) * p.split_stride_l + part_l];
        if (!lse_is_empty(lse)) stats.max_score = max(stats.max_score, lse);
    }
    if (!lse_is_empty(sink)) stats.max_score = max(stats.max_score, sink);
    if (!lse_is_empty(entry)) stats.max_score = max(stats.max_score, entry);
    for (int s = 0; s < p.splits; ++s) {
        const float lse = partial_l[long(s) * p.split_stride_l + part_l];
        if (!lse_is_empty(lse)) stats.sum += exp_of_difference(lse - stats.max_score);
    }
    if (!lse_is_empty(sink)) stats.sum += exp_of_difference(sink - stats.max_score);
    const float entry_weight =
        lse_is_empty(entry) ? 0.0f : exp_of_difference(entry - stats.max_score);
    stats.sum += entry_weight;
    const float normalizer = softmax_row_normalizer(stats);

    for (uint d = thread_index; d < fc_head_dim_v; d += MFA_ROW_PASS_THREADS) {
        float acc = 0.0f;
        for (int s = 0; s < p.splits; ++s) {
            const float lse = partial_l[long(s) * p.split_stride_l + part_l];
            if (lse_is_empty(lse)) continue;
            acc += exp_of_difference(lse - stats.max_score) *
                   partial_o[long(s) * p.split_stride_o + part_o.at(row, d)];
        }
        if (!lse_is_empty(entry)) acc += entry_weight * load_element(o, o_slice.at(row, d));
        store_element(o, o_slice.at(row, d), acc * normalizer);
    }
    if (!fc_has_lse) return;
    // Every thread has read the entry lse before the first one overwrites it.
    threadgroup_barrier(mem_flags::mem_device);
    if (thread_index == 0) l[l_at] = softmax_row_log_sum_exp(stats);
}

// dsinks[h] = -sum over the rows of head h (group.x) of exp(t_h - L) * delta: the sink's
// probability in each row times the row's delta (mfa.h). Rows whose L is -inf saw no key and
// take nothing (a selected 0, as their probabilities are). Each thread sums a strided share of
// the rows, then the simdgroups' sums meet in threadgroup memory (one float per simdgroup).
inline void attention_sink_gradient(device const float* l, device const float* delta,
                                    device const float* sinks, device float* dsinks,
                                    constant mfa_kernel_params& p, threadgroup float* staging,
                                    uint head, ushort thread_index, ushort simd_index,
                                    ushort lane) {
    const float sink = sinks[p.sinks.origin + long(head) * p.sinks.stride[1]];
    float sum = 0.0f;
    const long rows = long(p.batch) * long(p.rows_per_batch);
    for (long r = thread_index; r < rows; r += MFA_ROW_PASS_THREADS) {
        const uint batch = uint(r / p.rows_per_batch);
        const int row = int(r % p.rows_per_batch);
        const float lse = l[slice_of(p.l, batch, head).at(row, 0)];
        const float d = delta[slice_of(p.delta, batch, head).at(row, 0)];
        const float term = exp_of_difference(sink - (lse_is_empty(lse) ? 0.0f : lse)) * d;
        sum += lse_is_empty(lse) ? 0.0f : term;
    }
    sum = simd_sum(sum);
    if (lane == 0) staging[simd_index] = sum;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (thread_index != 0) return;
    float total = 0.0f;
    for (uint s = 0; s < MFA_ROW_PASS_THREADS / 32; ++s) total += staging[s];
    dsinks[p.dsinks.origin + long(head) * p.dsinks.stride[1]] = -total;
}

#endif
