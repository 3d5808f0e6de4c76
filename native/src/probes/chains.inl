/*
 * The loop every compute probe times, written once: CHAINS independent accumulators, each
 * updated by one instruction per iteration, with no memory access and no dependency between
 * chains, so that the loop runs at the instruction's throughput, not its latency. A
 * kernels_<isa>.c defines, before including it:
 *   ACCUMULATOR, LANES  the f32 vector type and its number of lanes
 *   OPERAND             the type of the two operands (f32 vectors; bf16 pairs for a dot product)
 *   CHAINS              how many accumulators: enough to cover the instruction's latency on every
 *                       core of the architecture, few enough to stay in the vector registers
 *   ZERO()              an accumulator of zeros
 *   STEP(acc, x, y)     the instruction timed, returning the new accumulator
 *   STORE(lanes, acc)   the accumulator's lanes into float[LANES]
 *   CHAINS_KERNEL       the name of the function
 * The function returns the sum of all lanes (the self-checks compare it with its closed form).
 */
static double CHAINS_KERNEL(uint64_t iterations, OPERAND x, OPERAND y) {
    ACCUMULATOR acc[CHAINS];
    for (int c = 0; c < CHAINS; ++c) acc[c] = ZERO();
    for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 32
        for (int c = 0; c < CHAINS; ++c) acc[c] = STEP(acc[c], x, y);
    }
    double sum = 0;
    float lanes[LANES];
    for (int c = 0; c < CHAINS; ++c) {
        STORE(lanes, acc[c]);
        for (int l = 0; l < LANES; ++l) sum += lanes[l];
    }
    return sum;
}

#undef ACCUMULATOR
#undef LANES
#undef OPERAND
#undef CHAINS
#undef ZERO
#undef STEP
#undef STORE
#undef CHAINS_KERNEL
