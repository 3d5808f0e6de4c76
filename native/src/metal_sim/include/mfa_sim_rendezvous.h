// How a barrier, a SIMD-group function or a simdgroup_matrix operation meets the rest of its
// group in the executor (mfa_sim_abi.h). Every rendezvous records its call site: lanes of a
// SIMD-group (threads of a threadgroup) must all be in the same one, or the dispatch fails as
// divergent.
#ifndef MFA_SIM_RENDEZVOUS_H
#define MFA_SIM_RENDEZVOUS_H

#include <metal_types>

#include "mfa_sim_abi.h"

#define MFA_SIM_SITE_PARAMETERS                                                                    \
    const char *mfa_sim_file = __builtin_FILE(), uint mfa_sim_line = __builtin_LINE()

namespace metal {
namespace sim_detail {
// The leader's share of a rendezvous, run for the whole SIMD-group. What a simulated operation
// does in the simulator's own memory (the lanes' records, on their stacks) is no access of the
// kernel's: this is compiled without the race detector's load and store tracing, which would
// otherwise be most of the simulator's time. The operation is inlined into it (flatten): an
// operation left out of line, as the optimiser leaves a matrix product's, keeps its tracing.
template <class Record, class Operation>
__attribute__((noinline, flatten, no_sanitize("coverage"))) void
lead_untraced(Operation& operation, Record* const* records, uint lanes) {
    operation(records, lanes);
}

// Runs operation(records, lanes) once for the whole SIMD-group, in the last lane to arrive,
// after every lane has deposited its record. A `traced` operation's loads and stores are the
// kernel's accesses to device or threadgroup memory (simdgroup_load and simdgroup_store), seen
// by the race detector and the census.
template <bool traced = false, class Record, class Operation>
inline void simd_rendezvous(const char* name, const char* file, uint line, Record& mine,
                            Operation operation) {
    const mfa_sim_abi::Site site{name, file, line};
    const mfa_sim_abi::SimdRendezvous r = mfa_sim_simd_arrive(&site, &mine);
    if (r.records) {
        Record* const* records = reinterpret_cast<Record* const*>(r.records);
        if constexpr (traced)
            operation(records, r.lanes);
        else
            lead_untraced(operation, records, r.lanes);
        mfa_sim_simd_release();
    }
}
} // namespace sim_detail
} // namespace metal

#endif // MFA_SIM_RENDEZVOUS_H
