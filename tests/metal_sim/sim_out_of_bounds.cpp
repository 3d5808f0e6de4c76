// Run under AddressSanitizer (MFA_SANITIZE=ON): 33 threads write to an exactly-sized buffer of
// 32 floats. ctest passes only if ASan reports the heap-buffer-overflow; if the write went
// unnoticed this program says so and fails.
#include "sim_test.h"

int main() {
    std::vector<float> output(32);
    mfa::sim::Dispatch d = sim_test::one_group("write_past_end", 33);
    d.buffers[0] = sim_test::bind(output);
    mfa::sim::dispatch(d);
    std::printf("sim_out_of_bounds: the out-of-bounds write was NOT detected\n");
    return 1;
}
