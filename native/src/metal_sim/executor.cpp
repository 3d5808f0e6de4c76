// The simulator's executor: kernel lookup, dispatch validation, and the per-threadgroup
// scheduler that runs kernel threads as fibers and implements barriers and SIMD-group
// rendezvous.
//
// One threadgroup runs on one worker OS thread. Its threads are fibers; a thread runs until it
// reaches a rendezvous (threadgroup_barrier, a SIMD-group function, a simdgroup_matrix operation)
// or returns, and the scheduler then resumes another runnable thread: in index order, or in a
// seeded random order. The last thread to reach a rendezvous completes it (checking that every
// participant is at the same call site) and makes the others runnable again. When nothing is
// runnable but some threads have not returned, the threadgroup is stuck: a barrier or SIMD-group
// function that only part of its group reached. That is reported, naming who waits where.
#include "metal_sim/sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "metal_sim/fiber.h"
#include "mfa_sim_abi.h"

namespace mfa::sim {
namespace {

using mfa_sim_abi::ArgumentTable;
using mfa_sim_abi::BufferView;
using mfa_sim_abi::ConstantTable;
using mfa_sim_abi::ConstantValue;
using mfa_sim_abi::KernelRecord;
using mfa_sim_abi::Site;
using mfa_sim_abi::ThreadInfo;

static_assert(static_cast<int>(ConstantType::Float) == mfa_sim_abi::Float &&
                  static_cast<int>(ConstantType::Bool) == mfa_sim_abi::Bool,
              "mfa::sim::ConstantType and mfa_sim_abi::ConstantType must agree");

// ---- Kernels -------------------------------------------------------------------------------

// The kernel of this name in the binary's generated table (mfa_sim_abi::kernels), or nullptr.
// The table is built, names checked unique, with the binary; a few kernels need no index.
const KernelRecord* find_kernel(const char* name) {
    for (unsigned i = 0; i < mfa_sim_abi::kernel_count; ++i)
        if (std::strcmp(mfa_sim_abi::kernels[i].name, name) == 0) return &mfa_sim_abi::kernels[i];
    return nullptr;
}

// ---- Deterministic randomness for schedules and garbage ------------------------------------

uint64_t splitmix64(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// ---- Dispatch state ------------------------------------------------------------------------

struct Worker;

enum class ThreadState : uint8_t { Runnable, AtSimd, AtBarrier, Finished };

struct SimdGroup {
    unsigned first_thread = 0;
    unsigned lanes = 0;
    unsigned arrived = 0;
    unsigned leader = 0;
    void* records[kSimdWidth] = {};
    const Site* sites[kSimdWidth] = {}; // where each lane waits, kept together for the check
};

struct KernelThread {
    FiberContext context;
    ThreadInfo info = {};
    Worker* worker = nullptr;
    SimdGroup* simd = nullptr;
    const Site* waiting_at = nullptr;
    // The last rendezvous it passed, for race reports: a copy, because a Site lives on the
    // stack of the call that passed it (its strings are literals).
    Site last_site{nullptr, nullptr, 0};
    unsigned acting_for = 0;    // the thread its memory accesses count for
    uintptr_t stack_bottom = 0; // its fiber stack, whose accesses are not traced
    size_t stack_size = 0;
    ThreadState state = ThreadState::Runnable;
    bool started = false; // has run on its fiber in the current threadgroup
};

// ---- Shadow memory of the race detector ----------------------------------------------------

// A shadow entry, one per 2-byte granule: writer thread (10 bits) and whether there is one,
// reader thread (10 bits) and how many distinct readers (0, 1, several), and the phase the
// accesses belong to (an entry of another phase is empty). Phase 0 is never used, so fresh
// (zero) shadow memory is empty.
namespace shadow {
constexpr uint64_t kThreadMask = 0x3FF;
constexpr int kWriterValid = 10, kReaderShift = 11, kReadersShift = 21, kPhaseShift = 23;
constexpr uint64_t kPhaseMask = (uint64_t{1} << (64 - kPhaseShift)) - 1;
inline uint64_t phase(uint64_t e) { return e >> kPhaseShift; }
inline bool has_writer(uint64_t e) { return (e >> kWriterValid) & 1; }
inline unsigned writer(uint64_t e) { return static_cast<unsigned>(e & kThreadMask); }
inline unsigned readers(uint64_t e) { return static_cast<unsigned>((e >> kReadersShift) & 3); }
inline unsigned reader(uint64_t e) {
    return static_cast<unsigned>((e >> kReaderShift) & kThreadMask);
}
inline uint64_t with_writer(uint64_t e, unsigned t) {
    return (e & ~(kThreadMask | (uint64_t{1} << kWriterValid))) | t | (uint64_t{1} << kWriterValid);
}
inline uint64_t with_reader(uint64_t e, unsigned t, unsigned count) {
    return (e & ~((kThreadMask << kReaderShift) | (uint64_t{3} << kReadersShift))) |
           (uint64_t{t} << kReaderShift) | (uint64_t{count} << kReadersShift);
}
} // namespace shadow

// Anonymous memory, zero until touched, for the shadow of a memory range.
class ShadowMemory {
  public:
    ShadowMemory() = default;
    ShadowMemory(const ShadowMemory&) = delete;
    ShadowMemory& operator=(const ShadowMemory&) = delete;
    ShadowMemory(ShadowMemory&& other) noexcept : data_(other.data_), size_(other.size_) {
        other.data_ = nullptr;
        other.size_ = 0;
    }
    ~ShadowMemory() {
        if (data_) munmap(data_, size_);
    }
    void allocate(size_t bytes) {
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        data_ = p;
        size_ = bytes;
    }
    void* data() const { return data_; }

  private:
    void* data_ = nullptr;
    size_t size_ = 0;
};

// Threadgroup memory of one binding, or device memory of one or more overlapping buffers.
struct TrackedRange {
    uintptr_t begin = 0, end = 0;
    uint64_t* entries = nullptr; // a shadow entry per granule
    uintptr_t* code = nullptr;   // per granule: where its writer and its reader accessed it
    bool device = false;         // device entries are shared by all workers: relaxed atomics
    int binding = 0;             // the [[threadgroup(i)]] binding (threadgroup memory)
};

// The census of one worker, summed over the workers when a dispatch ends.
struct Census {
    uint64_t threadgroup_read = 0, threadgroup_written = 0;
    uint64_t device_read = 0, device_written = 0;
    // Loads and stores, whatever their width: a vector access is one operation.
    uint64_t threadgroup_accesses = 0, device_accesses = 0;
    uint64_t barriers = 0;
    uint64_t multiplies[3][3] = {}; // [a type][b type], mfa_sim_abi::MatrixType

    void add(const Census& o) {
        threadgroup_read += o.threadgroup_read;
        threadgroup_written += o.threadgroup_written;
        device_read += o.device_read;
        device_written += o.device_written;
        threadgroup_accesses += o.threadgroup_accesses;
        device_accesses += o.device_accesses;
        barriers += o.barriers;
        for (int a = 0; a < 3; ++a)
            for (int b = 0; b < 3; ++b) multiplies[a][b] += o.multiplies[a][b];
    }
};

// What all workers of one dispatch share.
struct DispatchRun {
    const Dispatch* dispatch = nullptr;
    KernelRecord kernel = {};
    ConstantTable constants = {};
    BufferView buffers[kMaxBufferBindings] = {};
    uint64_t threadgroup_count = 0;
    unsigned threads_per_group = 0;
    std::atomic<uint64_t> next_threadgroup{0};
    bool check_races = false;
    bool take_census = false;
    std::vector<TrackedRange> device_ranges; // merged bound buffers, sorted by address
    std::vector<ShadowMemory> device_shadow;
    std::atomic<bool> failed{false};
    std::mutex failure_mutex;
    mfa_status failure_status = MFA_OK;
    std::string failure_message;

    void fail(mfa_status status, std::string message) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (failure_status == MFA_OK) {
            failure_status = status;
            failure_message = std::move(message);
        }
        failed.store(true, std::memory_order_relaxed);
    }
};

thread_local KernelThread* t_current = nullptr;

std::string describe_site(const Site* site) {
    if (!site) return "?";
    return std::string(site->operation) + " at " + site->file + ":" + std::to_string(site->line);
}

inline bool same_site(const Site* a, const Site* b) {
    return a->line == b->line &&
           (a->operation == b->operation || std::strcmp(a->operation, b->operation) == 0) &&
           (a->file == b->file || std::strcmp(a->file, b->file) == 0);
}

// "0-31, 64" style list of thread indices.
std::string format_ranges(const std::vector<unsigned>& indices) {
    std::string out;
    for (size_t i = 0; i < indices.size();) {
        size_t j = i;
        while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
        if (!out.empty()) out += ", ";
        out += std::to_string(indices[i]);
        if (j > i) out += "-" + std::to_string(indices[j]);
        i = j + 1;
    }
    return out;
}

// One OS thread's share of a dispatch: the fibers and threadgroup memory of the threadgroup it
// is running, reused for each threadgroup it takes.
struct Worker {
    DispatchRun* run = nullptr;
    std::vector<KernelThread> threads;
    std::vector<SimdGroup> simd_groups;
    const FiberStackReservation* stacks = nullptr; // this worker's set is stacks->stack(set, i)
    size_t stack_set = 0;
    std::vector<std::vector<unsigned char>> threadgroup_memory; // exact lengths, for ASan
    char* threadgroup_memory_pointers[kMaxThreadgroupMemoryBindings] = {};
    ArgumentTable arguments = {};
    FiberContext scheduler;
    std::vector<unsigned> runnable; // ring buffer of thread indices, power-of-two capacity
    size_t runnable_mask = 0;
    size_t runnable_head = 0;
    size_t runnable_size = 0;
    static constexpr unsigned kNoThread = ~0u;
    unsigned start_next = kNoThread; // popped by a yielding thread for the scheduler to start
    uint64_t rng = 0;                // the current threadgroup's schedule
    uint64_t garbage = 0;            // the current threadgroup's garbage stream
    unsigned barrier_arrived = 0;
    unsigned group_position[3] = {};
    bool group_failed = false;
    // The race detector and the census (tracking when either is on).
    bool tracking = false;
    unsigned worker_id = 0;
    uint64_t threadgroup_phase = 0;
    uint64_t device_phase = 0;
    std::vector<TrackedRange> ranges; // threadgroup memory first, then the dispatch's buffers
    std::vector<ShadowMemory> threadgroup_shadow;
    // The last two pages an access found no range in and no range reaches into. Most traced
    // accesses off the thread's stack are to the function constants and the argument block,
    // which no range holds: without this each of them scanned every range (a quarter of the
    // kernel suite's time).
    static constexpr uintptr_t kPageBytes = 4096, kNoPage = ~uintptr_t{0};
    uintptr_t untracked_pages[2] = {kNoPage, kNoPage};
    unsigned next_untracked_page = 0;
    Census census;

    void push_runnable(unsigned index) {
        threads[index].state = ThreadState::Runnable;
        runnable[(runnable_head + runnable_size) & runnable_mask] = index;
        ++runnable_size;
    }

    unsigned pop_runnable() {
        if (run->dispatch->schedule_seed != 0 && runnable_size > 1) {
            const size_t pick = splitmix64(&rng) % runnable_size;
            std::swap(runnable[runnable_head], runnable[(runnable_head + pick) & runnable_mask]);
        }
        const unsigned index = runnable[runnable_head];
        runnable_head = (runnable_head + 1) & runnable_mask;
        --runnable_size;
        return index;
    }

    std::string where() const {
        return "metal-sim: kernel '" + std::string(run->kernel.name) + "' (" + run->kernel.source +
               "), threadgroup (" + std::to_string(group_position[0]) + ", " +
               std::to_string(group_position[1]) + ", " + std::to_string(group_position[2]) + ")";
    }

    // Records a kernel thread's failure. The caller then calls abandon(), in a later statement
    // so that the temporaries of the message are destroyed first (abandon never returns).
    void record_failure(const KernelThread* thread, const std::string& message) {
        run->fail(MFA_ERROR_DEVICE, where() + ", thread " +
                                        std::to_string(thread->info.thread_index_in_threadgroup) +
                                        ": " + message);
        group_failed = true;
    }

    [[noreturn]] void abandon(KernelThread* thread) { fiber_exit_to(&thread->context, &scheduler); }

    // A thread that must wait hands its OS thread straight to the next runnable thread, which
    // halves the context switches per rendezvous. A thread that has not started yet is started
    // by the scheduler instead, on whose stack its fiber's first switch-in is set up.
    void yield(KernelThread* thread) {
        if (runnable_size > 0 && !group_failed) {
            const unsigned index = pop_runnable();
            KernelThread* next = &threads[index];
            if (next->started) {
                t_current = next;
                fiber_switch(&thread->context, &next->context);
                return;
            }
            start_next = index;
        }
        fiber_switch(&thread->context, &scheduler);
    }

    void fill_with_garbage(std::vector<unsigned char>* memory) {
        for (size_t i = 0; i < memory->size(); i += 8) {
            const uint64_t word = splitmix64(&garbage);
            std::memcpy(memory->data() + i, &word, std::min<size_t>(8, memory->size() - i));
        }
    }

    void prepare(const DispatchRun& dispatch_run);
    void run_threadgroup(uint64_t linear_index);
    std::string describe_stuck_threads() const;

    uint64_t phase_of(const TrackedRange& range) const {
        return range.device ? ((device_phase << 10) | worker_id) & shadow::kPhaseMask
                            : threadgroup_phase & shadow::kPhaseMask;
    }
    void access(KernelThread* thread, uintptr_t address, unsigned size, bool write, uintptr_t code);
    void track(KernelThread* thread, const TrackedRange& range, uintptr_t address, unsigned size,
               bool write, uintptr_t code);
    [[noreturn]] void report_race(KernelThread* thread, const TrackedRange& range,
                                  uintptr_t address, unsigned size, bool write, uintptr_t code,
                                  const char* kind, unsigned other, bool other_known,
                                  uintptr_t other_code);
};

// A fiber's entry, not instrumented (fiber.h): AddressSanitizer would call
// __asan_handle_no_return before the final switch, which makes it garbage-collect the whole
// fake stack of the next fiber on this stack (a fifth of a sanitized run's time), and
// ThreadSanitizer would keep this frame on the stack's call stack for every fiber run there
// until it overflows. The kernel it calls is instrumented as usual.
MFA_SIM_FIBER_ENTRY void thread_main(void* argument) {
    auto* thread = static_cast<KernelThread*>(argument);
    Worker* worker = thread->worker;
    fiber_started(&thread->context, &worker->scheduler);
    worker->run->kernel.entry(thread->info, worker->arguments);
    thread->state = ThreadState::Finished;
    fiber_exit_to(&thread->context, &worker->scheduler);
}

void Worker::prepare(const DispatchRun& dispatch_run) {
    const Dispatch& d = *dispatch_run.dispatch;
    const unsigned count = dispatch_run.threads_per_group;
    threads.assign(count, KernelThread{});
    simd_groups.assign((count + kSimdWidth - 1) / kSimdWidth, SimdGroup{});
    size_t capacity = 1;
    while (capacity < count) capacity *= 2;
    runnable.assign(capacity, 0);
    runnable_mask = capacity - 1;
    for (int i = 0; i < kMaxThreadgroupMemoryBindings; ++i) {
        threadgroup_memory.emplace_back(d.threadgroup_memory_lengths[i]);
        threadgroup_memory_pointers[i] = d.threadgroup_memory_lengths[i]
                                             ? reinterpret_cast<char*>(threadgroup_memory[i].data())
                                             : nullptr;
    }
    arguments.buffers = dispatch_run.buffers;
    arguments.threadgroup_memory = threadgroup_memory_pointers;
    arguments.threadgroup_memory_lengths = d.threadgroup_memory_lengths;

    tracking = dispatch_run.check_races || dispatch_run.take_census;
    if (tracking) {
        for (int i = 0; i < kMaxThreadgroupMemoryBindings; ++i) {
            const size_t length = d.threadgroup_memory_lengths[i];
            if (length == 0) continue;
            const size_t granules = length / 2; // lengths are multiples of 16
            ShadowMemory memory;
            memory.allocate(granules * (sizeof(uint64_t) + 2 * sizeof(uintptr_t)));
            TrackedRange range;
            range.begin = reinterpret_cast<uintptr_t>(threadgroup_memory_pointers[i]);
            range.end = range.begin + length;
            range.entries = static_cast<uint64_t*>(memory.data());
            range.code = reinterpret_cast<uintptr_t*>(range.entries + granules);
            range.binding = i;
            ranges.push_back(range);
            threadgroup_shadow.push_back(std::move(memory));
        }
        ranges.insert(ranges.end(), dispatch_run.device_ranges.begin(),
                      dispatch_run.device_ranges.end());
    }

    for (unsigned s = 0; s < simd_groups.size(); ++s) {
        simd_groups[s].first_thread = s * kSimdWidth;
        simd_groups[s].lanes = std::min(kSimdWidth, count - s * kSimdWidth);
    }
    const Size3 size = d.threads_per_threadgroup;
    for (unsigned i = 0; i < count; ++i) {
        KernelThread& t = threads[i];
        t.worker = this;
        t.simd = &simd_groups[i / kSimdWidth];
        ThreadInfo& info = t.info;
        info.thread_position_in_threadgroup[0] = i % size.x;
        info.thread_position_in_threadgroup[1] = i / size.x % size.y;
        info.thread_position_in_threadgroup[2] = i / (size.x * size.y);
        info.threads_per_threadgroup[0] = size.x;
        info.threads_per_threadgroup[1] = size.y;
        info.threads_per_threadgroup[2] = size.z;
        info.threadgroups_per_grid[0] = d.threadgroups.x;
        info.threadgroups_per_grid[1] = d.threadgroups.y;
        info.threadgroups_per_grid[2] = d.threadgroups.z;
        info.threads_per_grid[0] = d.threadgroups.x * size.x;
        info.threads_per_grid[1] = d.threadgroups.y * size.y;
        info.threads_per_grid[2] = d.threadgroups.z * size.z;
        info.thread_index_in_threadgroup = i;
        info.thread_index_in_simdgroup = i % kSimdWidth;
        info.simdgroup_index_in_threadgroup = i / kSimdWidth;
        info.simdgroups_per_threadgroup = static_cast<unsigned>(simd_groups.size());
        info.threads_per_simdgroup = kSimdWidth;
    }
}

std::string Worker::describe_stuck_threads() const {
    // Group the threads by what they are doing, in order of first appearance.
    struct Group {
        ThreadState state;
        const Site* site;
        std::vector<unsigned> threads;
    };
    std::vector<Group> groups;
    for (unsigned i = 0; i < threads.size(); ++i) {
        const KernelThread& t = threads[i];
        auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
            return g.state == t.state &&
                   (t.state == ThreadState::Finished || same_site(g.site, t.waiting_at));
        });
        if (it == groups.end()) {
            groups.push_back({t.state, t.waiting_at, {}});
            it = groups.end() - 1;
        }
        it->threads.push_back(i);
    }
    std::string out;
    for (const Group& g : groups) {
        out += "\n  threads " + format_ranges(g.threads) + ": ";
        if (g.state == ThreadState::Finished)
            out += "returned";
        else
            out += "waiting in " + describe_site(g.site);
    }
    return out;
}

void Worker::run_threadgroup(uint64_t linear_index) {
    const Dispatch& d = *run->dispatch;
    group_position[0] = static_cast<unsigned>(linear_index % d.threadgroups.x);
    group_position[1] = static_cast<unsigned>(linear_index / d.threadgroups.x % d.threadgroups.y);
    group_position[2] =
        static_cast<unsigned>(linear_index / (uint64_t{d.threadgroups.x} * d.threadgroups.y));
    rng = d.schedule_seed ^ (linear_index * 0xD1B54A32D192ED03ull);

    // Threadgroup memory starts as garbage, as on a GPU: a kernel that reads before writing
    // must not get lucky zeros.
    garbage = rng ^ 0x6A09E667F3BCC909ull;
    for (auto& memory : threadgroup_memory) fill_with_garbage(&memory);

    runnable_head = 0;
    runnable_size = 0;
    barrier_arrived = 0;
    group_failed = false;
    ++threadgroup_phase;
    ++device_phase;
    for (SimdGroup& s : simd_groups) s.arrived = 0;
    for (unsigned i = 0; i < threads.size(); ++i) {
        KernelThread& t = threads[i];
        for (int axis = 0; axis < 3; ++axis) {
            t.info.threadgroup_position_in_grid[axis] = group_position[axis];
            t.info.thread_position_in_grid[axis] =
                group_position[axis] * t.info.threads_per_threadgroup[axis] +
                t.info.thread_position_in_threadgroup[axis];
        }
        t.waiting_at = nullptr;
        t.last_site = Site{nullptr, nullptr, 0};
        t.acting_for = i;
        t.started = false;
        FiberStack& stack = stacks->stack(stack_set, i);
        t.stack_bottom = reinterpret_cast<uintptr_t>(stack.bottom());
        t.stack_size = stack.size();
        fiber_prepare(&t.context, stack, &thread_main, &t);
        push_runnable(i);
    }

    start_next = kNoThread;
    while (!group_failed) {
        unsigned index;
        if (start_next != kNoThread) {
            index = start_next;
            start_next = kNoThread;
        } else if (runnable_size > 0) {
            index = pop_runnable();
        } else {
            break;
        }
        KernelThread* t = &threads[index];
        t->started = true;
        t_current = t;
        fiber_switch(&scheduler, &t->context);
        t_current = nullptr;
    }
    for (unsigned i = 0; i < threads.size(); ++i)
        if (threads[i].state != ThreadState::Finished) stacks->stack(stack_set, i).abandoned = true;
    if (group_failed) return;
    for (const KernelThread& t : threads) {
        if (t.state != ThreadState::Finished) {
            run->fail(MFA_ERROR_DEVICE,
                      where() +
                          ": stuck: a barrier or SIMD-group function was reached by only "
                          "part of its group (divergent control flow or an early return)" +
                          describe_stuck_threads());
            return;
        }
    }
}

// "kernel_name+0x1c (libmfa.so+0x4a1c)": where a kernel accessed memory.
std::string describe_code(uintptr_t code) {
    char text[64];
    Dl_info info;
    if (!dladdr(reinterpret_cast<void*>(code), &info) || !info.dli_fname) {
        std::snprintf(text, sizeof text, "0x%zx", static_cast<size_t>(code));
        return text;
    }
    const char* slash = std::strrchr(info.dli_fname, '/');
    std::string out;
    if (info.dli_sname) {
        std::snprintf(text, sizeof text, "+0x%zx",
                      static_cast<size_t>(code - reinterpret_cast<uintptr_t>(info.dli_saddr)));
        out = std::string(info.dli_sname) + text + " (";
    }
    std::snprintf(text, sizeof text, "+0x%zx",
                  static_cast<size_t>(code - reinterpret_cast<uintptr_t>(info.dli_fbase)));
    out += std::string(slash ? slash + 1 : info.dli_fname) + text;
    if (info.dli_sname) out += ")";
    return out;
}

void Worker::access(KernelThread* thread, uintptr_t address, unsigned size, bool write,
                    uintptr_t code) {
    const uintptr_t page = address / kPageBytes;
    if (page == untracked_pages[0] || page == untracked_pages[1]) return;
    const uintptr_t page_begin = page * kPageBytes, page_end = page_begin + kPageBytes;
    bool page_untracked = true;
    for (const TrackedRange& range : ranges) {
        if (address - range.begin < range.end - range.begin) {
            track(thread, range, address, size, write, code);
            return;
        }
        if (range.begin < page_end && page_begin < range.end) page_untracked = false;
    }
    if (page_untracked) {
        untracked_pages[next_untracked_page] = page;
        next_untracked_page ^= 1;
    }
}

void Worker::track(KernelThread* thread, const TrackedRange& range, uintptr_t address,
                   unsigned size, bool write, uintptr_t code) {
    const uintptr_t end = std::min<uintptr_t>(address + size, range.end);
    if (range.device) {
        (write ? census.device_written : census.device_read) += end - address;
        ++census.device_accesses;
    } else {
        (write ? census.threadgroup_written : census.threadgroup_read) += end - address;
        ++census.threadgroup_accesses;
    }
    if (!run->check_races) return;
    const uint64_t phase = phase_of(range);
    const unsigned me = thread->acting_for;
    for (uintptr_t g = (address - range.begin) / 2; g <= (end - 1 - range.begin) / 2; ++g) {
        uint64_t* slot = &range.entries[g];
        const uint64_t stored = range.device ? __atomic_load_n(slot, __ATOMIC_RELAXED) : *slot;
        const uint64_t e = shadow::phase(stored) == phase ? stored : phase << shadow::kPhaseShift;
        uint64_t updated = e;
        int code_slot = -1; // 0: this access becomes the writer, 1: the reader
        if (write) {
            if (shadow::has_writer(e) && shadow::writer(e) != me)
                report_race(thread, range, address, size, write, code, "write-after-write",
                            shadow::writer(e), true, range.code[2 * g]);
            if (shadow::readers(e) != 0 && (shadow::readers(e) > 1 || shadow::reader(e) != me))
                report_race(thread, range, address, size, write, code, "write-after-read",
                            shadow::reader(e), shadow::reader(e) != me, range.code[2 * g + 1]);
            if (!shadow::has_writer(e)) {
                updated = shadow::with_writer(e, me);
                code_slot = 0;
            }
        } else {
            if (shadow::has_writer(e) && shadow::writer(e) != me)
                report_race(thread, range, address, size, write, code, "read-after-write",
                            shadow::writer(e), true, range.code[2 * g]);
            if (shadow::readers(e) == 0) {
                updated = shadow::with_reader(e, me, 1);
                code_slot = 1;
            } else if (shadow::reader(e) != me) {
                updated = shadow::with_reader(e, me, 2);
                code_slot = 1;
            }
        }
        if (updated == stored) continue;
        if (range.device) {
            __atomic_store_n(slot, updated, __ATOMIC_RELAXED);
            if (code_slot >= 0)
                __atomic_store_n(&range.code[2 * g + code_slot], code, __ATOMIC_RELAXED);
        } else {
            *slot = updated;
            if (code_slot >= 0) range.code[2 * g + code_slot] = code;
        }
    }
}

void Worker::report_race(KernelThread* thread, const TrackedRange& range, uintptr_t address,
                         unsigned size, bool write, uintptr_t code, const char* kind,
                         unsigned other, bool other_known, uintptr_t other_code) {
    {
        std::string memory;
        if (range.device) {
            memory = "device memory";
            for (int i = 0; i < kMaxBufferBindings; ++i) {
                const uintptr_t data = reinterpret_cast<uintptr_t>(run->buffers[i].data);
                if (data && address - data < run->buffers[i].size) {
                    memory += " buffer(" + std::to_string(i) + ") at byte offset " +
                              std::to_string(address - data);
                    break;
                }
            }
        } else {
            memory = "threadgroup memory [[threadgroup(" + std::to_string(range.binding) +
                     ")]] at byte offset " + std::to_string(address - range.begin);
        }
        const char* scope = range.device ? "mem_device" : "mem_threadgroup";
        const bool other_wrote = std::strcmp(kind, "read-after-write") == 0 ||
                                 std::strcmp(kind, "write-after-write") == 0;
        std::string message = "data race (" + std::string(kind) + ") on " + memory + ": thread " +
                              std::to_string(thread->acting_for) +
                              (write ? " writes " : " reads ") + std::to_string(size) +
                              " bytes there at " + describe_code(code);
        if (thread->last_site.operation) message += ", after " + describe_site(&thread->last_site);
        message += other_known ? ", and thread " + std::to_string(other) +
                                     (other_wrote ? " wrote" : " read") + " it at " +
                                     describe_code(other_code)
                               : ", and other threads read it";
        message += std::string(" with no threadgroup_barrier ordering ") + scope + " in between";
        record_failure(thread, message);
    }
    abandon(thread);
}

void run_worker(DispatchRun* run, Worker* worker) {
    if (const char* error = run->kernel.setup_constants(run->constants)) {
        run->fail(MFA_ERROR_INVALID_ARGUMENT,
                  std::string("metal-sim: kernel '") + run->kernel.name + "': " + error);
        return;
    }
    while (!run->failed.load(std::memory_order_relaxed)) {
        const uint64_t index = run->next_threadgroup.fetch_add(1, std::memory_order_relaxed);
        if (index >= run->threadgroup_count) break;
        worker->run_threadgroup(index);
    }
}

// ---- Validation ----------------------------------------------------------------------------

mfa_status validate(const Dispatch& d, KernelRecord* kernel) {
    if (!d.kernel) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "metal-sim: no kernel name");
    const KernelRecord* record = find_kernel(d.kernel);
    if (!record)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: no kernel named '%s' is compiled into this process",
                             d.kernel);
    *kernel = *record;
    const Size3 g = d.threadgroups, t = d.threads_per_threadgroup;
    if (g.x == 0 || g.y == 0 || g.z == 0)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: kernel '%s': empty grid of threadgroups (%u, %u, %u)",
                             d.kernel, g.x, g.y, g.z);
    const uint64_t threads = uint64_t{t.x} * t.y * t.z;
    if (threads == 0 || threads > kMaxThreadsPerThreadgroup)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: kernel '%s': %u x %u x %u threads per threadgroup; must "
                             "be 1 to %u",
                             d.kernel, t.x, t.y, t.z, kMaxThreadsPerThreadgroup);
    if (uint64_t{g.x} * t.x > UINT32_MAX || uint64_t{g.y} * t.y > UINT32_MAX ||
        uint64_t{g.z} * t.z > UINT32_MAX)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: kernel '%s': the grid has more than 2^32 threads along "
                             "an axis",
                             d.kernel);
    uint64_t threadgroup_bytes = 0;
    for (int i = 0; i < kMaxThreadgroupMemoryBindings; ++i) {
        const uint32_t length = d.threadgroup_memory_lengths[i];
        if (length % kThreadgroupMemoryAlignment != 0)
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "metal-sim: kernel '%s': threadgroup memory [[threadgroup(%d)]] "
                                 "length %u is not a multiple of %u bytes",
                                 d.kernel, i, length, kThreadgroupMemoryAlignment);
        threadgroup_bytes += length;
    }
    if (threadgroup_bytes > kMaxThreadgroupMemoryBytes)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: kernel '%s': %llu bytes of threadgroup memory exceed the "
                             "%u-byte limit",
                             d.kernel, static_cast<unsigned long long>(threadgroup_bytes),
                             kMaxThreadgroupMemoryBytes);
    for (int i = 0; i < kMaxBufferBindings; ++i) {
        const BufferBinding& b = d.buffers[i];
        if (b.base && b.offset > b.length)
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "metal-sim: kernel '%s': buffer(%d) offset %zu is past its "
                                 "length %zu",
                                 d.kernel, i, b.offset, b.length);
    }
    if (d.num_constants > 0 && !d.constants)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: kernel '%s': %zu function constants but no array",
                             d.kernel, d.num_constants);
    for (size_t i = 0; i < d.num_constants; ++i) {
        if (static_cast<unsigned>(d.constants[i].type) > static_cast<unsigned>(ConstantType::Float))
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "metal-sim: kernel '%s': function constant %u has an unknown type",
                                 d.kernel, d.constants[i].index);
        for (size_t j = 0; j < i; ++j)
            if (d.constants[j].index == d.constants[i].index)
                return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                     "metal-sim: kernel '%s': function constant %u is set twice",
                                     d.kernel, d.constants[i].index);
    }
    if (d.num_workers < 0)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: kernel '%s': num_workers %d is negative", d.kernel,
                             d.num_workers);
    return MFA_OK;
}

// OS threads a dispatch asks for: its own setting, else one per core, never more than it has
// threadgroups.
uint64_t workers_wanted(const Dispatch& d) {
    const uint64_t asked = d.num_workers > 0 ? static_cast<uint64_t>(d.num_workers)
                                             : std::max(1u, std::thread::hardware_concurrency());
    return std::min(asked, uint64_t{d.threadgroups.x} * d.threadgroups.y * d.threadgroups.z);
}

uint32_t threads_per_group(const Dispatch& d) {
    return d.threads_per_threadgroup.x * d.threads_per_threadgroup.y * d.threads_per_threadgroup.z;
}

mfa_status reservation_error(const char* kernel, size_t threads) {
    return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                         "metal-sim: kernel '%s': cannot map fiber stacks for a threadgroup of %zu "
                         "threads",
                         kernel, threads);
}

// MFA_SIM_CHECK_RACES=0 turns the race detector off for the whole process (benchmarks).
bool races_checked_in_this_process() {
    static const bool checked = [] {
        const char* value = std::getenv("MFA_SIM_CHECK_RACES");
        return !(value && std::strcmp(value, "0") == 0);
    }();
    return checked;
}

// Device ranges longer than this are not tracked: their shadow (12 bytes per byte) would not fit
// beside them. The views of the project's tests that span more (offsets beyond 2^31) go unchecked
// for device-memory races; threadgroup memory, where the kernels' barriers matter, is always
// tracked.
constexpr uintptr_t kMaxTrackedDeviceBytes = uintptr_t{64} << 20;

// The shadow of the dispatch's buffers: one range for each set of overlapping bindings, so that
// two bindings of one allocation share their entries.
void track_device_memory(DispatchRun* run) {
    std::vector<std::pair<uintptr_t, uintptr_t>> spans;
    for (const BufferView& b : run->buffers) {
        if (!b.data || b.size == 0) continue;
        const uintptr_t begin = reinterpret_cast<uintptr_t>(b.data) & ~uintptr_t{1};
        spans.emplace_back(begin, reinterpret_cast<uintptr_t>(b.data) + b.size);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 0; i < spans.size();) {
        uintptr_t begin = spans[i].first, end = spans[i].second;
        for (++i; i < spans.size() && spans[i].first < end; ++i)
            end = std::max(end, spans[i].second);
        if (end - begin > kMaxTrackedDeviceBytes) continue;
        const size_t granules = (end - begin + 1) / 2;
        ShadowMemory memory;
        memory.allocate(granules * (sizeof(uint64_t) + 2 * sizeof(uintptr_t)));
        TrackedRange range;
        range.begin = begin;
        range.end = end;
        range.entries = static_cast<uint64_t*>(memory.data());
        range.code = reinterpret_cast<uintptr_t*>(range.entries + granules);
        range.device = true;
        run->device_ranges.push_back(range);
        run->device_shadow.push_back(std::move(memory));
    }
}

// One JSON line per dispatch: what it ran and what its threads did to memory.
bool append_census(const char* path, const Dispatch& d, const Census& c) {
    std::string line = "{\"kernel\": \"" + std::string(d.kernel) + "\", \"constants\": {";
    for (size_t i = 0; i < d.num_constants; ++i) {
        const FunctionConstant& k = d.constants[i];
        if (i) line += ", ";
        line += "\"" + std::to_string(k.index) + "\": ";
        switch (k.type) {
            case ConstantType::Bool: line += k.value.b ? "true" : "false"; break;
            case ConstantType::Char:
            case ConstantType::Short:
            case ConstantType::Int: line += std::to_string(k.value.i); break;
            case ConstantType::UChar:
            case ConstantType::UShort:
            case ConstantType::UInt: line += std::to_string(k.value.u); break;
            case ConstantType::Half:
            case ConstantType::Float: {
                char text[32];
                std::snprintf(text, sizeof text, "%.9g", k.value.f);
                line += text;
                break;
            }
        }
    }
    auto triple = [](Size3 s) {
        return "[" + std::to_string(s.x) + ", " + std::to_string(s.y) + ", " + std::to_string(s.z) +
               "]";
    };
    line += "}, \"threadgroups\": " + triple(d.threadgroups) +
            ", \"threads_per_threadgroup\": " + triple(d.threads_per_threadgroup);
    auto field = [&](const char* name, uint64_t value) {
        line += ", \"" + std::string(name) + "\": " + std::to_string(value);
    };
    field("threadgroup_bytes_read", c.threadgroup_read);
    field("threadgroup_bytes_written", c.threadgroup_written);
    field("device_bytes_read", c.device_read);
    field("device_bytes_written", c.device_written);
    field("threadgroup_accesses", c.threadgroup_accesses);
    field("device_accesses", c.device_accesses);
    field("barriers", c.barriers);
    static const char* const type_names[3] = {"float", "half", "bfloat"};
    line += ", \"multiplies\": {";
    bool first = true;
    for (int a = 0; a < 3; ++a) {
        for (int b = 0; b < 3; ++b) {
            if (!c.multiplies[a][b]) continue;
            if (!first) line += ", ";
            first = false;
            line += "\"" + std::string(type_names[a]) + "*" + type_names[b] +
                    "\": " + std::to_string(c.multiplies[a][b]);
        }
    }
    line += "}}\n";
    static std::mutex file_mutex;
    std::lock_guard<std::mutex> lock(file_mutex);
    FILE* file = std::fopen(path, "a");
    if (!file) return false;
    const bool written = std::fwrite(line.data(), 1, line.size(), file) == line.size();
    return std::fclose(file) == 0 && written;
}

mfa_status run_dispatch(const Dispatch& d) {
    KernelRecord kernel;
    if (mfa_status status = validate(d, &kernel); status != MFA_OK) return status;

    // A dispatch run on its own maps its stacks for itself and unmaps them when it ends.
    std::unique_ptr<FiberStackPool> own_pool;
    FiberStackReservation own_stacks;
    const FiberStackReservation* stacks = d.stacks;
    if (!stacks) {
        own_pool = std::make_unique<FiberStackPool>();
        if (!own_pool->reserve(workers_wanted(d), threads_per_group(d), &own_stacks))
            return reservation_error(d.kernel, threads_per_group(d));
        stacks = &own_stacks;
    } else if (stacks->workers() == 0 || stacks->threads_per_worker() < threads_per_group(d)) {
        return mfa_set_error(MFA_ERROR_INTERNAL,
                             "metal-sim: kernel '%s': the reserved fiber stacks serve threadgroups "
                             "of %zu threads, not %u",
                             d.kernel, stacks->threads_per_worker(), threads_per_group(d));
    }

    DispatchRun run;
    run.dispatch = &d;
    run.kernel = kernel;
    run.threads_per_group = threads_per_group(d);
    run.threadgroup_count = uint64_t{d.threadgroups.x} * d.threadgroups.y * d.threadgroups.z;
    std::vector<ConstantValue> constants(d.num_constants);
    for (size_t i = 0; i < d.num_constants; ++i) {
        const FunctionConstant& c = d.constants[i];
        constants[i].index = c.index;
        constants[i].type = static_cast<mfa_sim_abi::ConstantType>(c.type);
        std::memcpy(&constants[i].value, &c.value, sizeof(c.value));
    }
    run.constants = {constants.data(), constants.size()};
    for (int i = 0; i < kMaxBufferBindings; ++i) {
        const BufferBinding& b = d.buffers[i];
        if (b.base) run.buffers[i] = {static_cast<char*>(b.base) + b.offset, b.length - b.offset};
    }
    run.check_races = d.check_races && races_checked_in_this_process();
    const char* census_file = std::getenv("MFA_SIM_CENSUS");
    run.take_census = census_file && *census_file;
    if (run.check_races || run.take_census) track_device_memory(&run);

    std::vector<Worker> workers(std::min<uint64_t>(workers_wanted(d), stacks->workers()));
    for (size_t i = 0; i < workers.size(); ++i) {
        workers[i].worker_id = static_cast<unsigned>(i);
        workers[i].run = &run;
        workers[i].stacks = stacks;
        workers[i].stack_set = i;
        workers[i].prepare(run);
    }
    std::vector<std::thread> helpers;
    for (size_t i = 1; i < workers.size(); ++i) {
        try {
            helpers.emplace_back(run_worker, &run, &workers[i]);
        } catch (const std::system_error&) {
            break; // fewer OS threads; the remaining workers take all threadgroups
        }
    }
    run_worker(&run, &workers[0]);
    for (std::thread& helper : helpers) helper.join();

    if (run.failure_status != MFA_OK)
        return mfa_set_error(run.failure_status, "%s", run.failure_message.c_str());
    if (run.take_census) {
        Census total;
        for (const Worker& w : workers) total.add(w.census);
        if (!append_census(census_file, d, total))
            return mfa_set_error(MFA_ERROR_DEVICE,
                                 "metal-sim: cannot append to MFA_SIM_CENSUS file '%s'",
                                 census_file);
    }
    return MFA_OK;
}

} // namespace

mfa_status dispatch(const Dispatch& d) {
    try {
        return run_dispatch(d);
    } catch (const std::bad_alloc&) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal-sim: out of memory running kernel '%s'",
                             d.kernel ? d.kernel : "?");
    }
}

mfa_status reserve(FiberStackPool& pool, const Dispatch* dispatches, size_t count,
                   FiberStackReservation* reservation) {
    reservation->release();
    uint64_t workers = 0;
    uint32_t threads = 0;
    const char* widest = nullptr;
    for (size_t i = 0; i < count; ++i) {
        KernelRecord kernel;
        if (mfa_status status = validate(dispatches[i], &kernel); status != MFA_OK) return status;
        workers = std::max(workers, workers_wanted(dispatches[i]));
        if (threads_per_group(dispatches[i]) > threads) {
            threads = threads_per_group(dispatches[i]);
            widest = dispatches[i].kernel;
        }
    }
    if (count == 0) return MFA_OK;
    try {
        if (!pool.reserve(workers, threads, reservation)) return reservation_error(widest, threads);
    } catch (const std::bad_alloc&) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal-sim: out of memory reserving fiber stacks");
    }
    return MFA_OK;
}

bool has_kernel(const char* name) { return name && find_kernel(name); }

} // namespace mfa::sim

// ---- The kernel-side ABI -------------------------------------------------------------------

using mfa::sim::KernelThread;
using mfa::sim::t_current;
using mfa::sim::ThreadState;

extern "C" const mfa_sim_abi::ThreadInfo* mfa_sim_current_thread(void) { return &t_current->info; }

extern "C" void mfa_sim_fail(const char* message) {
    KernelThread* t = t_current;
    t->worker->record_failure(t, message);
    t->worker->abandon(t);
}

extern "C" mfa_sim_abi::SimdRendezvous mfa_sim_simd_arrive(const mfa_sim_abi::Site* site,
                                                           void* record) {
    KernelThread* t = t_current;
    mfa::sim::SimdGroup* simd = t->simd;
    const unsigned lane = t->info.thread_index_in_simdgroup;
    simd->records[lane] = record;
    simd->sites[lane] = site;
    t->waiting_at = site;
    if (site) t->last_site = *site;
    if (++simd->arrived < simd->lanes) {
        t->state = ThreadState::AtSimd;
        t->worker->yield(t);
        t->waiting_at = nullptr;
        return {nullptr, 0};
    }
    mfa::sim::Worker* w = t->worker;
    for (unsigned l = 0; l < simd->lanes; ++l) {
        if (l != lane && !mfa::sim::same_site(simd->sites[l], site)) {
            const KernelThread& other = w->threads[simd->first_thread + l];
            w->record_failure(t, "the lanes of SIMD-group " +
                                     std::to_string(t->info.simdgroup_index_in_threadgroup) +
                                     " are in different SIMD-group functions (divergent control "
                                     "flow): lane " +
                                     std::to_string(l) + " in " +
                                     mfa::sim::describe_site(other.waiting_at) + ", lane " +
                                     std::to_string(lane) + " in " + mfa::sim::describe_site(site));
            w->abandon(t);
        }
    }
    t->waiting_at = nullptr;
    simd->leader = lane;
    return {simd->records, simd->lanes};
}

extern "C" void mfa_sim_simd_release(void) {
    KernelThread* t = t_current;
    mfa::sim::SimdGroup* simd = t->simd;
    simd->arrived = 0;
    for (unsigned l = 0; l < simd->lanes; ++l)
        if (l != simd->leader) t->worker->push_runnable(simd->first_thread + l);
}

extern "C" void mfa_sim_threadgroup_barrier(const mfa_sim_abi::Site* site, unsigned flags) {
    KernelThread* t = t_current;
    mfa::sim::Worker* w = t->worker;
    t->waiting_at = site;
    if (site) t->last_site = *site;
    if (++w->barrier_arrived < w->threads.size()) {
        t->state = ThreadState::AtBarrier;
        w->yield(t);
        t->waiting_at = nullptr;
        return;
    }
    for (const KernelThread& other : w->threads) {
        if (&other != t && !mfa::sim::same_site(other.waiting_at, site)) {
            w->record_failure(t, "threads of the threadgroup wait at different barriers (divergent "
                                 "control flow): thread " +
                                     std::to_string(other.info.thread_index_in_threadgroup) +
                                     " in " + mfa::sim::describe_site(other.waiting_at) +
                                     ", thread " +
                                     std::to_string(t->info.thread_index_in_threadgroup) + " in " +
                                     mfa::sim::describe_site(site));
            w->abandon(t);
        }
    }
    t->waiting_at = nullptr;
    w->barrier_arrived = 0;
    // metal::mem_flags: mem_device = 1, mem_threadgroup = 2.
    if (flags & 1) ++w->device_phase;
    if (flags & 2) ++w->threadgroup_phase;
    ++w->census.barriers;
    for (unsigned i = 0; i < w->threads.size(); ++i)
        if (&w->threads[i] != t) w->push_runnable(i);
}

extern "C" void mfa_sim_act_as_lane(unsigned lane) {
    KernelThread* t = t_current;
    t->acting_for =
        lane == ~0u ? t->info.thread_index_in_threadgroup : t->simd->first_thread + lane;
}

extern "C" void mfa_sim_count_multiply(unsigned a_type, unsigned b_type) {
    ++t_current->worker->census.multiplies[a_type][b_type];
}

// SanitizerCoverage's load and store tracing, which the kernel translation units are compiled
// with: every access they make reaches the race detector and the census. Hidden, so that the
// empty defaults of a sanitizer runtime never take their place.
namespace {
// Most traced accesses are to the kernel thread's own stack (its private arrays): those are
// skipped first.
inline void trace_access(void* address, unsigned size, bool write, void* code) {
    KernelThread* t = t_current;
    if (!t || reinterpret_cast<uintptr_t>(address) - t->stack_bottom < t->stack_size) return;
    if (t->worker->tracking)
        t->worker->access(t, reinterpret_cast<uintptr_t>(address), size, write,
                          reinterpret_cast<uintptr_t>(code));
}
} // namespace

#define MFA_SIM_TRACE(size)                                                                        \
    extern "C" __attribute__((visibility("hidden"))) void __sanitizer_cov_load##size(void* p) {    \
        trace_access(p, size, false, __builtin_return_address(0));                                 \
    }                                                                                              \
    extern "C" __attribute__((visibility("hidden"))) void __sanitizer_cov_store##size(void* p) {   \
        trace_access(p, size, true, __builtin_return_address(0));                                  \
    }
MFA_SIM_TRACE(1)
MFA_SIM_TRACE(2)
MFA_SIM_TRACE(4)
MFA_SIM_TRACE(8)
MFA_SIM_TRACE(16)
#undef MFA_SIM_TRACE
