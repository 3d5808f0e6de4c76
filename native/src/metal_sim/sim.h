// metal-sim: runs the project's .metal kernels on the CPU with the execution semantics of an
// Apple GPU. This header is the interface for the libmfa backend glue (backend.cpp) and for the
// simulator's own tests. It mirrors one Metal compute dispatch:
//
//   [encoder setComputePipelineState:pipeline(kernel, function constants)]
//   [encoder setBuffer:base offset:offset atIndex:i]                  -> Dispatch::buffers[i]
//   [encoder setThreadgroupMemoryLength:n atIndex:i]                  -> Dispatch::threadgroup_memory_lengths[i]
//   [encoder dispatchThreadgroups:grid threadsPerThreadgroup:group]   -> Dispatch::threadgroups, threads_per_threadgroup
//
// How kernels get here. Every metal/*.metal file is preprocessed with the compatibility headers
// in native/src/metal_sim/include (metal_stdlib & co.), rewritten by metal_sim_codegen.py (which
// strips Metal's attributes and generates the argument-binding glue from each kernel signature)
// and compiled as C++ into libmfa. One more generated file, the kernel table, lists every kernel
// of the binary by name with its entry point; dispatch() looks kernels up there, and a name
// defined twice fails the build. The simulator's tests link the executor statically with their
// own .metal files, compiled the same way by the CMake function mfa_sim_add_kernels(); nothing
// of the simulator is exported.
//
// Supported kernel forms: the ones the project's kernels use. Anything else with a Metal meaning
// (template kernels, [[host_name]], the [[kernel]] spelling, kernels or function constants in a
// namespace, threadgroup variables declared in a function body, attributes the simulator does
// not model, ...) is a build error from the code generator naming the construct and its line,
// never a silently unbound argument.
//   kernel void name(...) { ... }                                   at global scope; host name = name
// Supported kernel parameters:
//   device T* / device const T* / constant T* x [[buffer(i)]]       T: scalars, vectors, structs
//   constant S& / device S& / device const S& x [[buffer(i)]]       bound buffer must hold sizeof(S)
//   threadgroup T* x [[threadgroup(i)]]                             length from the dispatch
//   built-ins, as uint/ushort/int or 2-/3-component vectors of them:
//     thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid,
//     threads_per_threadgroup, threadgroups_per_grid, threads_per_grid,
//     thread_index_in_threadgroup, thread_index_in_simdgroup, simdgroup_index_in_threadgroup,
//     threads_per_simdgroup, simdgroups_per_threadgroup
//   [[buffer(i), function_constant(c)]]: optional buffer; a null pointer when c is false and
//     the buffer is unbound.
// Function constants, at global scope: `constant T name [[function_constant(i)]];` (T a scalar
// type), and derived constants `constant T name = <expression using function constants>;`.
// Both are per dispatch (thread-local in the simulator), so concurrent dispatches with different
// constants do not interfere. is_function_constant_defined(name) works on either.
//
// Rejected at build time, as Metal rejects them: size_t and ptrdiff_t kernel arguments, double,
// exceptions, RTTI, virtual functions, dynamic allocation, the C++ standard library, recursion
// and calls through function pointers. Address-space mismatches of pointers (a threadgroup
// pointer where a device or thread pointer is expected) fail the build through a type-checking
// pass; it leaves references, objects and bfloat pointers unchecked, and rejects copying a whole
// struct out of a device/constant/threadgroup pointer (MSL allows it; read the fields or bind
// the struct by reference). See MetalSimKernels.cmake and include/mfa_sim_language.h.
//
// Differences from Apple's compiler to keep in mind (details in include/metal_types and
// include/metal_math):
//   - float2(a, b)-style constructors are macros over metal::make_vec; `(float4)int4_value` is a
//     bit cast here, so convert with float4(int4_value).
//   - half is _Float16 (1.5h works); bfloat is a struct (bfloat(1.5f); no `bf` literal), its
//     vectors convert and index but have no arithmetic; there are no bool vectors: comparisons
//     of vectors give int/short masks, which select(), all() and any() accept.
//   - fast:: and precise:: math compute the same precise results; denormals are not flushed.
//
// Execution semantics (what a dispatch guarantees and checks):
//   - Each threadgroup runs its threads as fibers on one worker; threadgroups are spread over
//     num_workers OS threads. threadgroup_barrier, simdgroup_barrier, every simd_* function and
//     every simdgroup_matrix operation is a real rendezvous of the threadgroup / SIMD-group.
//   - SIMD-groups are 32 consecutive thread_index_in_threadgroup values, as on Apple GPUs.
//   - A barrier or SIMD-group function reached by only part of its group (divergence, an early
//     return, different call sites) fails the dispatch with a message naming the kernel, the
//     threadgroup and the call sites; it never hangs.
//   - Threadgroup memory is per threadgroup and starts as garbage (never zeros); more than
//     32 KB in total, or a length that is not a multiple of 16, fails the dispatch.
//   - schedule_seed != 0 shuffles the order in which runnable threads run between rendezvous,
//     so a missing barrier shows up as wrong results; 0 runs them in index order.
//   - Data races between threads of a threadgroup, in threadgroup memory and in the bound
//     buffers (those spanning at most 64 MiB), fail the dispatch on any schedule (read-after-write, write-after-read,
//     write-after-write with no threadgroup_barrier between them whose mem_flags name that
//     memory), naming both threads and both accesses: the race detector of executor.cpp,
//     which also takes the census. Dispatch::check_races or MFA_SIM_CHECK_RACES=0 turns it off.
//   - dispatch() is thread-safe: many threads may dispatch at once, with any kernels.
//   - Kernel threads run on 256 KB stacks (1 MB under AddressSanitizer) with a guard page:
//     a kernel that overflows its stack crashes rather than corrupting its neighbours. The
//     stacks come from a FiberStackPool (fiber.h) owned by the caller, reserved for a whole
//     sequence of dispatches by reserve() before the first runs; a dispatch given no
//     reservation maps its own and unmaps them when it ends.
//   - Out-of-bounds buffer accesses are caught in the checked build (MFA_SANITIZE=ON, exactly
//     sized allocations), where AddressSanitizer aborts with a report; the normal build does
//     not check them. A kernel thread that loops forever without reaching a rendezvous hangs
//     its dispatch: there is no watchdog.
#ifndef MFA_METAL_SIM_SIM_H
#define MFA_METAL_SIM_SIM_H

#include <cstddef>
#include <cstdint>

#include "mfa.h"

namespace mfa::sim {

class FiberStackPool;        // fiber.h
class FiberStackReservation; // fiber.h

inline constexpr int kMaxBufferBindings = 31; // Metal's argument table size
inline constexpr int kMaxThreadgroupMemoryBindings = 31;
inline constexpr uint32_t kMaxThreadgroupMemoryBytes = 32768; // Apple4+ limit, all bindings
inline constexpr uint32_t kThreadgroupMemoryAlignment = 16;   // lengths must be multiples
inline constexpr uint32_t kMaxThreadsPerThreadgroup = 1024;
inline constexpr uint32_t kSimdWidth = 32;

// The Metal data types a function constant can have (MTLDataType, scalar subset).
enum class ConstantType : uint8_t { Bool, Char, UChar, Short, UShort, Int, UInt, Half, Float };

// One MTLFunctionConstantValues entry: setConstantValue:&value type:type atIndex:index.
// Build it with the helpers below; the type must match the kernel's declaration exactly, as
// Metal's pipeline creation requires.
struct FunctionConstant {
    uint16_t index = 0;
    ConstantType type = ConstantType::Int;
    union Value {
        bool b;
        int32_t i;  // Char, Short, Int (range-checked against the declared type)
        uint32_t u; // UChar, UShort, UInt
        float f;    // Half (rounded to nearest even when bound), Float
    } value = {};

    static FunctionConstant of_bool(uint16_t index, bool v) {
        return typed(index, ConstantType::Bool, &Value::b, v);
    }
    static FunctionConstant of_int(uint16_t index, int32_t v) {
        return typed(index, ConstantType::Int, &Value::i, v);
    }
    static FunctionConstant of_uint(uint16_t index, uint32_t v) {
        return typed(index, ConstantType::UInt, &Value::u, v);
    }
    static FunctionConstant of_float(uint16_t index, float v) {
        return typed(index, ConstantType::Float, &Value::f, v);
    }
    static FunctionConstant of_half(uint16_t index, float v) {
        return typed(index, ConstantType::Half, &Value::f, v);
    }

  private:
    // The constant at index of the given type, with the value in the union member it reads.
    template <typename T>
    static FunctionConstant typed(uint16_t index, ConstantType type, T Value::*member, T v) {
        FunctionConstant c;
        c.index = index;
        c.type = type;
        c.value.*member = v;
        return c;
    }
};

// setBuffer:offset:atIndex:. The kernel sees base + offset. length is the size of the
// allocation at base (bytes), used to check struct arguments and offsets; run the tests under
// AddressSanitizer (MFA_SANITIZE=ON) with exactly-sized allocations to catch out-of-bounds
// element accesses. base is non-const because the kernel decides what it writes.
struct BufferBinding {
    void* base = nullptr; // nullptr = not bound
    size_t length = 0;
    size_t offset = 0;
};

struct Size3 {
    uint32_t x = 1, y = 1, z = 1;
};

struct Dispatch {
    const char* kernel = nullptr;                // host name of the kernel
    const FunctionConstant* constants = nullptr; // indices must be distinct
    size_t num_constants = 0;
    BufferBinding buffers[kMaxBufferBindings] = {};
    uint32_t threadgroup_memory_lengths[kMaxThreadgroupMemoryBindings] = {}; // bytes
    Size3 threadgroups;            // dispatchThreadgroups: grid
    Size3 threads_per_threadgroup; // threadsPerThreadgroup:
    uint64_t schedule_seed = 0;    // 0 = index order; else shuffled
    // The race detector (executor.cpp), unless MFA_SIM_CHECK_RACES=0 turns it off for the
    // process.
    bool check_races = true;
    int num_workers = 0; // OS threads; 0 = one per core
    // Fiber stacks reserved (reserve() below) for this dispatch among others; it then runs on
    // at most stacks->workers() OS threads. nullptr: the dispatch maps its own.
    const FiberStackReservation* stacks = nullptr;
};

// Checks each of `count` dispatches that are to run one after another (as dispatch() would,
// except that buffers are not read) and reserves from `pool` the fiber stacks all of them
// need, so that none can then fail for lack of stacks: the widest threadgroup's worth for as
// many workers as the busiest dispatch asks for and the pool's bounds allow (at least one).
// May wait for other reservations of the pool to be released, so a thread must not hold
// another reservation of the same pool while it reserves. On failure (a malformed
// dispatch, MFA_ERROR_OUT_OF_MEMORY when stacks cannot be mapped) nothing is reserved and the
// message is recorded with mfa_set_error.
mfa_status reserve(FiberStackPool& pool, const Dispatch* dispatches, size_t count,
                   FiberStackReservation* reservation);

// Runs the dispatch to completion. On failure returns an error status (MFA_ERROR_INVALID_ARGUMENT
// for a malformed dispatch or unknown kernel, MFA_ERROR_DEVICE for a fault while running: a
// divergent barrier, a partial SIMD-group operation, an unbound buffer the kernel uses, ...) and
// records the message with mfa_set_error on the calling thread. Buffers may be partly written
// when a dispatch fails, as on a GPU.
mfa_status dispatch(const Dispatch& dispatch);

// Whether a kernel with this host name is compiled into this binary.
bool has_kernel(const char* name);

} // namespace mfa::sim

#endif // MFA_METAL_SIM_SIM_H
