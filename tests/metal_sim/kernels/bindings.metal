// Argument binding: built-ins in every shape, function constants, optional buffers and structs.
#include <metal_stdlib>
using namespace metal;

// 12 values per thread, at its linear index in the grid.
kernel void builtins_3d(
    device uint* out [[buffer(0)]], uint3 gid [[thread_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]], uint3 group [[threadgroup_position_in_grid]],
    uint3 group_size [[threads_per_threadgroup]], uint3 groups [[threadgroups_per_grid]],
    uint3 grid [[threads_per_grid]], uint flat [[thread_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]], ushort simd [[simdgroup_index_in_threadgroup]],
    ushort simds [[simdgroups_per_threadgroup]], ushort2 lid2 [[thread_position_in_threadgroup]],
    uint width [[threads_per_simdgroup]]) {
    const uint linear = (gid.z * grid.y + gid.y) * grid.x + gid.x;
    device uint* o = out + linear * 12;
    o[0] = gid.x;
    o[1] = gid.y;
    o[2] = gid.z;
    o[3] = lid.x + 100 * lid.y + 10000 * lid.z;
    o[4] = group.x + 100 * group.y + 10000 * group.z;
    o[5] = group_size.x + 100 * group_size.y + 10000 * group_size.z;
    o[6] = groups.x + 100 * groups.y + 10000 * groups.z;
    o[7] = flat;
    o[8] = lane + 100 * simd;
    o[9] = simds;
    o[10] = lid2.x + 100 * lid2.y;
    o[11] = width;
}

constant bool fc_flag [[function_constant(0)]];
constant int fc_count [[function_constant(1)]];
constant float fc_scale [[function_constant(2)]];
constant half fc_half [[function_constant(3)]];
constant uint fc_unset [[function_constant(4)]];
constant int fc_derived = fc_count * 2 + (fc_flag ? 1 : 0);
constant bool fc_has_unset = is_function_constant_defined(fc_unset);
constant float kQuarter = 0.25f;

kernel void function_constants(device float* out [[buffer(0)]],
                               device float* optional [[buffer(1), function_constant(fc_flag)]],
                               uint tid [[thread_index_in_threadgroup]]) {
    if (tid != 0) return;
    out[0] = fc_flag ? 1.0f : 0.0f;
    out[1] = float(fc_count);
    out[2] = fc_scale;
    out[3] = float(fc_half);
    out[4] = float(fc_derived);
    out[5] = fc_has_unset ? 1.0f : 0.0f;
    out[6] = is_function_constant_defined(fc_count) ? 1.0f : 0.0f;
    out[7] = kQuarter;
    out[8] = optional ? 1.0f : 0.0f;
    if (fc_flag) optional[0] = 42.0f;
}

struct ScaleParams {
    uint count;
    float scale;
};

kernel void struct_argument(constant ScaleParams& p [[buffer(0)]], device float* out [[buffer(1)]],
                            uint i [[thread_position_in_grid]]) {
    if (i < p.count) out[i] = p.scale * float(i);
}
