// The register-residency check's own test: what it must report, and what it must not.
// tests/metal_sim/residency_findings.cmake expects a finding in each kernel but the
// resident_fragments ones.
#include <metal_stdlib>
using namespace metal;

constant uint tile_count [[function_constant(0)]];

// Fragments indexed only by unrolled loop counters and constants: all of them in registers.
kernel void resident_fragments(device const float* a [[buffer(0)]], device float* c [[buffer(1)]]) {
    simdgroup_float8x8 tiles[4];
#pragma unroll
    for (uint t = 0; t < 4; ++t) simdgroup_load(tiles[t], a + t * 64);
    simdgroup_float8x8 sum(0.0f);
#pragma unroll
    for (uint t = 0; t < 4; ++t) simdgroup_multiply_accumulate(sum, tiles[t], tiles[3 - t], sum);
    simdgroup_store(sum, c);
}

// The same with the count a function constant, folded in as the planner's variants are.
kernel void resident_fragments_constant_count(device const float* a [[buffer(0)]],
                                              device float* c [[buffer(1)]]) {
    simdgroup_float8x8 tiles[8];
#pragma unroll
    for (uint t = 0; t < tile_count; ++t) simdgroup_load(tiles[t], a + t * 64);
    simdgroup_float8x8 sum(0.0f);
#pragma unroll
    for (uint t = 0; t < tile_count; ++t)
        simdgroup_multiply_accumulate(sum, tiles[t], tiles[t], sum);
    simdgroup_store(sum, c);
}

// A fragment chosen by a value known only at run time: the array must live in memory.
kernel void fragments_dynamic_index(device const float* a [[buffer(0)]],
                                    device float* c [[buffer(1)]],
                                    constant uint& pick [[buffer(2)]]) {
    simdgroup_float8x8 tiles[4];
#pragma unroll
    for (uint t = 0; t < 4; ++t) simdgroup_load(tiles[t], a + t * 64);
    simdgroup_store(tiles[pick % 4], c);
}

// A loop of matrix operations unrolled by 4 whose count has no bound before run time: the
// compiler unrolls it with a remainder loop, code a GPU kernel must not carry.
kernel void matrix_loop_runtime_count(device const float* a [[buffer(0)]],
                                      device float* c [[buffer(1)]],
                                      constant uint& count [[buffer(2)]]) {
    simdgroup_float8x8 sum(0.0f);
#pragma unroll 4
    for (uint t = 0; t < count; ++t) {
        simdgroup_float8x8 tile;
        simdgroup_load(tile, a + t * 64);
        simdgroup_multiply_accumulate(sum, tile, tile, sum);
    }
    simdgroup_store(sum, c);
}
