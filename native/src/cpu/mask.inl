/*
 * Applying the visibility window to a score tile. Only the parts of each row outside the row's
 * visible range are touched, so an unmasked tile costs one range check per row. Padding columns
 * (past the tile's real width) are masked too: the softmax then needs no edge cases.
 */

static inline void mask_row(float* s, int64_t visible_begin, int64_t visible_end, int64_t width,
                            int64_t padded_width) {
    if (visible_end > width) visible_end = width;
    if (visible_begin > visible_end) visible_begin = visible_end;
    const float hidden = -__builtin_inff();
    for (int64_t c = 0; c < visible_begin; ++c) s[c] = hidden;
    for (int64_t c = visible_end < 0 ? 0 : visible_end; c < padded_width; ++c) s[c] = hidden;
}

/* Rows are queries i0 + r, columns keys j0 + c. */
static void mask_query_rows(const mfa_cpu_plan* plan, int64_t i0, int64_t rows, int64_t j0,
                            int64_t width, float* s, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r)
        mask_row(s + r * ld, mfa_cpu_key_begin(plan, i0 + r) - j0,
                 mfa_cpu_key_end(plan, i0 + r) - j0, width, ld);
}

/* Rows are keys j0 + r, columns queries i0 + c. */
static void mask_key_rows(const mfa_cpu_plan* plan, int64_t j0, int64_t rows, int64_t i0,
                          int64_t width, float* s, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r)
        mask_row(s + r * ld, mfa_cpu_query_begin(plan, j0 + r) - i0,
                 mfa_cpu_query_end(plan, j0 + r) - i0, width, ld);
}
