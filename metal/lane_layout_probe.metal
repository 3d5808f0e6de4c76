// Probes the simdgroup_matrix lane layout the attention kernels assume (attention/fragment.h):
// the MSL spec leaves it unspecified, so a test runs this on every device it can reach.
#include <metal_stdlib>
using namespace metal;

#include "attention/fragment.h"

// matrix: 64 floats, row-major 8x8 with distinct values. Writes four 64-float sections of out:
//   [0, 64)    what each lane holds after a plain load: out[2 * lane + e] = thread_elements()[e]
//   [64, 128)  where fragment.h says it should be: row * 8 + col + e
//   [128, 192) a store of lane-written elements (element e of lane L set to 2 * L + e)
//   [192, 256) what each lane holds after a transposed load
kernel void kernel_lane_layout_probe(device const float* matrix [[buffer(0)]],
                                     device float* out [[buffer(1)]],
                                     ushort lane [[thread_index_in_simdgroup]]) {
    simd_fragment loaded;
    simdgroup_load(loaded, matrix, 8, ulong2(0, 0), false);
    simd_fragment transposed;
    simdgroup_load(transposed, matrix, 8, ulong2(0, 0), true);
    simd_fragment written = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (ushort e = 0; e < 2; ++e) {
        out[2 * lane + e] = loaded.thread_elements()[e];
        out[64 + 2 * lane + e] = float(fragment_row(lane) * 8 + fragment_col(lane) + e);
        written.thread_elements()[e] = float(2 * lane + e);
        out[192 + 2 * lane + e] = transposed.thread_elements()[e];
    }
    simdgroup_store(written, out + 128, 8, ulong2(0, 0), false);
}
