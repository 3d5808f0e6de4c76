/*
 * The bf16 dot-product probe of one instruction set, written once: a kernels_<isa>.c defines
 * chains.inl's macros for its dot-product instruction, BROADCAST_PAIR(pair) (a vector of bf16
 * pairs, each the 32-bit `pair`), ISA, DOT_METHOD and DOT_GETTER (the descriptor function's
 * name, kernels.h), then includes this file.
 */
enum { dot_lanes = CHAINS * LANES };
#define CHAINS_KERNEL dot_chains
#include "probes/chains.inl"

static double dot_bf16(uint64_t iterations, uint32_t a_pair, uint32_t b_pair) {
    return dot_chains(iterations, BROADCAST_PAIR(a_pair), BROADCAST_PAIR(b_pair));
}

const probe_compute* DOT_GETTER(void) {
    static const probe_compute probe = {ISA, dot_bf16, dot_lanes, 4, DOT_METHOD};
    return &probe;
}
