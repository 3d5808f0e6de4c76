/*
 * The loop the read probe times, written once: consecutive vector loads of the buffer added into
 * 8 independent 64-bit integer sums, so that neither the additions nor a dependency limit it and
 * it waits on memory only. Integer sums are exact in any order, so the self-check can compare
 * the result with numpy's. Reads 8 vectors per step: `bytes` is a multiple of
 * MFA_PROBE_READ_BLOCK (8 vectors of at most 64 bytes). A kernels_<isa>.c defines, before
 * including it:
 *   WORDS_VECTOR, WORDS  the vector of 64-bit words and its number of words
 *   ZERO_WORDS()         a vector of zeros
 *   LOAD(p)              the vector at p (aligned to its size)
 *   ADD(a, b)            the 64-bit sums of two vectors
 *   STORE_WORDS(w, v)    the vector's words into uint64_t[WORDS]
 *   READ_KERNEL          the name of the function
 */
static uint64_t READ_KERNEL(const void* data, size_t bytes) {
    const unsigned char* p = (const unsigned char*)data;
    WORDS_VECTOR sums[8];
    for (int k = 0; k < 8; ++k) sums[k] = ZERO_WORDS();
    for (size_t i = 0; i < bytes; i += 8 * sizeof(WORDS_VECTOR)) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) sums[k] = ADD(sums[k], LOAD(p + i + k * sizeof(WORDS_VECTOR)));
    }
    uint64_t sum = 0, words[WORDS];
    for (int k = 0; k < 8; ++k) {
        STORE_WORDS(words, sums[k]);
        for (int w = 0; w < WORDS; ++w) sum += words[w];
    }
    return sum;
}

#undef WORDS_VECTOR
#undef WORDS
#undef ZERO_WORDS
#undef LOAD
#undef ADD
#undef STORE_WORDS
#undef READ_KERNEL
