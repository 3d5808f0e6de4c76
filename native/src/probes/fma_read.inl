/*
 * The FMA and read probes of one instruction set, written once: a kernels_<isa>.c defines its
 * instructions, then includes this file, which makes the two kernels (chains.inl, read.inl) and
 * their descriptors. It defines, before including it:
 *   ACCUMULATOR, LANES, BROADCAST(value)   the f32 vector type, its lanes, a splat
 *   STEP(acc, x, y), STORE(lanes, acc)     the FMA timed (acc * x + y) and a store of the lanes
 *   FMA_CHAINS                             accumulators in flight (the file says why)
 *   WORDS_VECTOR, WORDS, ZERO_WORDS(), LOAD(p), ADD(a, b), STORE_WORDS(w, v)   as read.inl
 *   ISA, FMA_METHOD, READ_METHOD           the strings of the results
 *   FMA_GETTER, READ_GETTER                the names of the descriptor functions (kernels.h)
 */
enum { fma_lanes = FMA_CHAINS * LANES };
#define OPERAND       ACCUMULATOR
#define CHAINS        FMA_CHAINS
#define ZERO()        BROADCAST(0.0f)
#define CHAINS_KERNEL fma_chains
#include "probes/chains.inl"

#define READ_KERNEL read_u64
#include "probes/read.inl"

static double fma_f32(uint64_t iterations, uint32_t multiplier, uint32_t addend) {
    return fma_chains(iterations, BROADCAST(probe_f32(multiplier)), BROADCAST(probe_f32(addend)));
}

const probe_compute* FMA_GETTER(void) {
    static const probe_compute probe = {ISA, fma_f32, fma_lanes, 2, FMA_METHOD};
    return &probe;
}

const probe_read* READ_GETTER(void) {
    static const probe_read probe = {ISA, read_u64, READ_METHOD};
    return &probe;
}
