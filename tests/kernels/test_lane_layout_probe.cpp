// Runs metal/lane_layout_probe.metal and checks the simdgroup_matrix lane layout the attention
// kernels assume (metal/attention/fragment.h) against the table Metal FlashAttention documents,
// for plain loads, transposed loads and stores. Here it runs on metal-sim; the same kernel and
// checks are meant for a real device, where the layout is the hardware's, not ours.
#include <cstdio>
#include <cstring>

#include "metal_sim/sim.h"

namespace {

int failures = 0;

void check(bool ok, const char* what, int lane, int e, float got, float expected) {
    if (ok) return;
    if (failures < 10)
        std::fprintf(stderr, "%s: lane %d element %d: got %g, expected %g\n", what, lane, e, got,
                     expected);
    ++failures;
}

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
    d.kernel = "mfa_lane_layout_probe";
    d.buffers[0].base = matrix;
    d.buffers[0].length = sizeof matrix;
    d.buffers[1].base = out;
    d.buffers[1].length = sizeof out;
    d.threads_per_threadgroup.x = 32;
    d.schedule_seed = 5;
    if (mfa::sim::dispatch(d) != MFA_OK) {
        std::fprintf(stderr, "dispatch failed: %s\n", mfa_last_error());
        return 1;
    }

    int owner_seen[64] = {};
    for (int row = 0; row < 8; ++row)
        for (int pair = 0; pair < 4; ++pair)
            for (int e = 0; e < 2; ++e) {
                const int lane = kOwner[row][pair];
                const int position = row * 8 + pair * 2 + e;
                ++owner_seen[2 * lane + e];
                check(out[64 + 2 * lane + e] == float(position), "fragment.h coordinates", lane, e,
                      out[64 + 2 * lane + e], float(position));
                check(out[2 * lane + e] == matrix[position], "plain load", lane, e,
                      out[2 * lane + e], matrix[position]);
                check(out[128 + position] == float(2 * lane + e), "store", lane, e,
                      out[128 + position], float(2 * lane + e));
                const int col = pair * 2 + e;
                check(out[192 + 2 * lane + e] == matrix[col * 8 + row], "transposed load", lane, e,
                      out[192 + 2 * lane + e], matrix[col * 8 + row]);
            }
    for (int i = 0; i < 64; ++i)
        check(owner_seen[i] == 1, "table is a bijection", i / 2, i % 2, float(owner_seen[i]), 1);

    if (failures) {
        std::fprintf(stderr, "lane layout probe: %d check(s) failed\n", failures);
        return 1;
    }
    std::printf("lane layout probe: the layout matches fragment.h\n");
    return 0;
}
