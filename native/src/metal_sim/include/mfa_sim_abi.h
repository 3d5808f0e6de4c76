// The boundary between kernels compiled for the simulator and its executor (executor.cpp).
//
// Kernel translation units include it through <metal_stdlib>; the executor includes it as plain
// C++. It therefore uses only built-in types: kernels are compiled without any system header.
// Kernels and the executor are linked into the same binary (libmfa, or a simulator test), so
// nothing here is exported from libmfa.
#ifndef MFA_SIM_ABI_H
#define MFA_SIM_ABI_H

namespace mfa_sim_abi {

// The built-in values of one kernel thread, in the order Metal names them.
struct ThreadInfo {
    unsigned threadgroup_position_in_grid[3];
    unsigned thread_position_in_threadgroup[3];
    unsigned thread_position_in_grid[3];
    unsigned threads_per_threadgroup[3];
    unsigned threadgroups_per_grid[3];
    unsigned threads_per_grid[3];
    unsigned thread_index_in_threadgroup;
    unsigned thread_index_in_simdgroup;
    unsigned simdgroup_index_in_threadgroup;
    unsigned simdgroups_per_threadgroup;
    unsigned threads_per_simdgroup;
};

// A bound buffer as the kernel sees it: base + offset, and the bytes left from there.
struct BufferView {
    char* data; // nullptr when unbound
    unsigned long long size;
};

// What a kernel thread's argument glue reads: the dispatch's bindings and the memory of the
// thread's own threadgroup.
struct ArgumentTable {
    const BufferView* buffers;       // [31]
    char* const* threadgroup_memory; // [31], nullptr where the length is 0
    const unsigned* threadgroup_memory_lengths;
};

// Element types of simdgroup_matrix operands, for the census.
enum MatrixType : unsigned { FloatMatrix, HalfMatrix, BfloatMatrix };

// Must match mfa::sim::ConstantType.
enum ConstantType : unsigned char { Bool, Char, UChar, Short, UShort, Int, UInt, Half, Float };

struct ConstantValue {
    unsigned short index;
    ConstantType type;
    union {
        bool b;
        int i;
        unsigned u;
        float f;
    } value;
};

struct ConstantTable {
    const ConstantValue* values;
    unsigned long count;
};

// Runs one kernel thread to completion.
using KernelEntry = void (*)(const ThreadInfo& thread, const ArgumentTable& arguments);
// Sets the calling OS thread's copy of a translation unit's function constants (and recomputes
// the constants derived from them). Returns nullptr, or a message when a value's type does not
// match its declaration.
using ConstantSetup = const char* (*)(const ConstantTable& constants);

struct KernelRecord {
    const char* name;   // host name
    const char* source; // the .metal file, for messages
    KernelEntry entry;
    ConstantSetup setup_constants;
};

// Every kernel compiled into the binary, sorted by name: the table metal_sim_codegen.py
// generates from the binary's .metal files (mfa_sim_add_kernels), where the executor finds them.
extern const KernelRecord kernels[];
extern const unsigned kernel_count;

// A call site of a rendezvous (barrier or SIMD-group function), for matching and messages.
struct Site {
    const char* operation; // "simd_sum", "threadgroup_barrier", ...
    const char* file;
    unsigned line;
};

// The leader of a SIMD-group rendezvous: the last lane to arrive. It sees every lane's record
// (records[lane], lanes = SIMD-group size), performs the operation for all of them, then calls
// mfa_sim_simd_release(). Every other lane gets records == nullptr and finds its result in its
// own record when it resumes.
struct SimdRendezvous {
    void* const* records;
    unsigned lanes;
};

} // namespace mfa_sim_abi

extern "C" {
// The calling kernel thread's built-ins.
const mfa_sim_abi::ThreadInfo* mfa_sim_current_thread(void);
// Ends the calling kernel thread and fails its dispatch with message (static storage).
[[noreturn]] void mfa_sim_fail(const char* message);
mfa_sim_abi::SimdRendezvous mfa_sim_simd_arrive(const mfa_sim_abi::Site* site, void* record);
void mfa_sim_simd_release(void);
// A threadgroup_barrier: a rendezvous of the threadgroup that orders the memory `flags` names
// (metal::mem_flags bits: 1 device, 2 threadgroup) for the race detector.
void mfa_sim_threadgroup_barrier(const mfa_sim_abi::Site* site, unsigned flags);
// Called by the leader of a SIMD-group rendezvous around each lane's share of a
// simdgroup_load or simdgroup_store: the race detector and the census then count the accesses
// as that lane's, not the leader's. ~0u: the leader acts for itself again.
void mfa_sim_act_as_lane(unsigned lane);
// Called by the leader of a simdgroup_multiply(_accumulate) rendezvous, for the census: the
// element types of a and b (mfa_sim_abi::MatrixType).
void mfa_sim_count_multiply(unsigned a_type, unsigned b_type);
}

#endif // MFA_SIM_ABI_H
