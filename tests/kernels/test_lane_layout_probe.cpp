// Runs metal/lane_layout_probe.metal and checks the simdgroup_matrix lane layout the attention
// kernels assume (metal/attention/fragment.h) against the table Metal FlashAttention documents,
// for plain loads, transposed loads and stores. Here it runs on metal-sim; the same kernel and
// checks are meant for a real device, where the layout is the hardware's, not ours.
#include <cstring>

#include "check.h"
#include "metal_sim/sim.h"

namespace {

// Owner lane of each element pair of an 8x8 fragment, row by row (MFA's published table).
const int kOwner[8][4] = {{0, 1, 8, 9},     {2, 3, 10, 11},   {4, 5, 12, 13},   {6, 7, 14, 15},
                          {16, 17, 24, 25}, {18, 19, 26, 27}, {20, 21, 28, 29}, {22, 23, 30, 31}};

} // namespace

int main() {
    float matrix[64];
    for (int i = 0; i < 64; ++i) matrix[i] = float(i);
    float out[256];
    std::memset(out, 0xff, sizeof out); // NaN: unwritten elements cannot pass

    mfa::sim::Dispatch d;
    d.kernel = "kernel_lane_layout_probe";
    d.buffers[0].base = matrix;
    d.buffers[0].length = sizeof matrix;
    d.buffers[1].base = out;
    d.buffers[1].length = sizeof out;
    d.threads_per_threadgroup.x = 32;
    d.schedule_seed = 5;
    const mfa_status status = mfa::sim::dispatch(d);
    CHECK(status == MFA_OK, "dispatch failed: %s", mfa_last_error());
    if (status != MFA_OK) return test_finish("lane layout probe");

    int owner_seen[64] = {};
    for (int row = 0; row < 8; ++row)
        for (int pair = 0; pair < 4; ++pair)
            for (int e = 0; e < 2; ++e) {
                const int lane = kOwner[row][pair];
                const int position = row * 8 + pair * 2 + e;
                ++owner_seen[2 * lane + e];
                CHECK(out[64 + 2 * lane + e] == float(position),
                      "fragment.h coordinates: lane %d element %d: got %g, expected %g", lane, e,
                      out[64 + 2 * lane + e], float(position));
                CHECK(out[2 * lane + e] == matrix[position],
                      "plain load: lane %d element %d: got %g, expected %g", lane, e,
                      out[2 * lane + e], matrix[position]);
                CHECK(out[128 + position] == float(2 * lane + e),
                      "store: lane %d element %d: got %g, expected %g", lane, e,
                      out[128 + position], float(2 * lane + e));
                const int col = pair * 2 + e;
                CHECK(out[192 + 2 * lane + e] == matrix[col * 8 + row],
                      "transposed load: lane %d element %d: got %g, expected %g", lane, e,
                      out[192 + 2 * lane + e], matrix[col * 8 + row]);
            }
    for (int i = 0; i < 64; ++i)
        CHECK(owner_seen[i] == 1, "the table is not a bijection: lane %d element %d owned %d times",
              i / 2, i % 2, owner_seen[i]);
    return test_finish("lane layout probe");
}
