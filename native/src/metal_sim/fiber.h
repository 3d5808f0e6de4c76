// Cooperative fibers for the simulator's kernel threads: a context switch that saves only the
// callee-saved registers (a few nanoseconds, versus a system call for swapcontext), stacks with
// a guard page, the pools that own those stacks, and the AddressSanitizer and ThreadSanitizer
// annotations that make stack switching visible to them.
//
// Fibers never migrate between OS threads, and share their OS thread's floating-point
// environment (MXCSR / FPCR are not switched: kernels cannot change them).
#ifndef MFA_METAL_SIM_FIBER_H
#define MFA_METAL_SIM_FIBER_H

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "core/fork_registry.h"

namespace mfa::sim {

// An mmap'ed stack with a PROT_NONE guard page below it, so an overflow faults instead of
// silently corrupting a neighbour.
class FiberStack {
  public:
    explicit FiberStack(size_t usable_bytes);
    ~FiberStack(); // also frees the sanitizer's fake stack; no fiber may be running on it

    FiberStack(const FiberStack&) = delete;
    FiberStack& operator=(const FiberStack&) = delete;

    bool valid() const { return mapping_ != nullptr; }
    char* bottom() const { return usable_; } // lowest usable address
    size_t size() const { return usable_bytes_; }

    // AddressSanitizer's fake stack (for use-after-return detection) of the fibers that run
    // here. It lives as long as the stack, so fibers reuse it instead of having the sanitizer
    // map and unmap one per fiber.
    void* sanitizer_fake_stack = nullptr;
    // Set when a fiber left this stack without returning (abandoned mid-call, or running in the
    // parent of a fork): its frames' redzones may still be poisoned for AddressSanitizer at any
    // depth, so the next fiber_prepare unpoisons the whole stack instead of only its top, and
    // gives ThreadSanitizer a fresh context for it.
    bool abandoned = false;

    // ThreadSanitizer's context for the fibers that run here (their shadow call stack and
    // clock), created on first use and kept with the stack; nullptr without ThreadSanitizer.
    void* thread_sanitizer_fiber = nullptr;

  private:
    void* mapping_ = nullptr;
    size_t mapping_bytes_ = 0;
    char* usable_ = nullptr;
    size_t usable_bytes_ = 0;
};

class FiberStackReservation;

// The fiber stacks of one owner (a metal-sim context): mapped when a call first needs them,
// kept for its later calls, unmapped with the pool. Each worker of a dispatch runs one
// threadgroup at a time and needs one stack per kernel thread of it: a "worker set".
//
// A call reserves every worker set its dispatches will use before the first of them runs
// (reserve), so running out of mappings fails the call before it writes anything, never between
// two of its passes. Bounds, so that concurrent calls cannot exhaust the process's memory
// mappings (two per stack: the stack and its guard page; Linux allows 65530 by default):
//   - a pool maps at most kMaxStacksPerPool stacks, and all pools of the process together at
//     most kMaxStacksPerProcess (an eighth of that under a sanitizer, which maps more for
//     every stack), except that a reservation that would otherwise get nothing and has
//     nothing to wait for is always granted one worker set;
//   - a reservation gets as many worker sets as it asks for and those bounds allow, at least
//     one; when every set that could serve it is held by other calls of the same pool, it
//     waits for one to be given back instead of failing.
// A pool survives fork(): the child may use it, and sets that calls of the parent's other
// threads held (threads that do not exist in the child) are free there.
class FiberStackPool {
  public:
    static const size_t kMaxStacksPerPool;    // 8192 (1024 under a sanitizer)
    static const size_t kMaxStacksPerProcess; // 16384 (2048 under a sanitizer)

    FiberStackPool();
    ~FiberStackPool(); // every reservation must have been given back
    FiberStackPool(const FiberStackPool&) = delete;
    FiberStackPool& operator=(const FiberStackPool&) = delete;

    // Usable bytes of every stack: 256 KiB, 1 MiB under AddressSanitizer (redzones and fake
    // frames need room).
    static const size_t kStackBytes;

    // Reserves between 1 and max_workers worker sets of threads_per_worker stacks each (1 to
    // 1024), replacing whatever *out held. Returns false, with nothing reserved, only when the
    // stacks cannot be mapped.
    bool reserve(size_t max_workers, size_t threads_per_worker, FiberStackReservation* out);

  private:
    friend class FiberStackReservation;
    friend class mfa::ForkRegistry<FiberStackPool>;
    struct WorkerSet {
        std::vector<std::unique_ptr<FiberStack>> stacks;
        bool reserved = false;
    };

    void give_back(const std::vector<WorkerSet*>& sets);
    // Maps stacks onto `set` until it has `count`, within the bounds (or past the process-wide
    // one when `beyond_process_bound`); false, with `set` unchanged, when a bound or the
    // mapping says no.
    bool grow(WorkerSet* set, size_t count, bool beyond_process_bound);
    void unmap(WorkerSet* set);
    // In a fork child: every set free (the calls that held sets ran on threads that do not
    // exist there) and no waiter (ditto).
    void reset_in_fork_child();

    std::mutex mutex_;
    std::condition_variable given_back_;
    std::vector<std::unique_ptr<WorkerSet>> sets_;
    size_t mapped_ = 0;              // stacks of this pool
    FiberStackPool* next_ = nullptr; // in the process's list of pools, for fork()
    FiberStackPool* prev_ = nullptr;
};

// Worker sets held by one call for all its dispatches; given back when destroyed or reused.
class FiberStackReservation {
  public:
    FiberStackReservation() = default;
    ~FiberStackReservation() { release(); }
    FiberStackReservation(const FiberStackReservation&) = delete;
    FiberStackReservation& operator=(const FiberStackReservation&) = delete;

    size_t workers() const { return sets_.size(); }
    size_t threads_per_worker() const { return threads_; }
    // Stack `thread` (< threads_per_worker()) of worker set `worker` (< workers()).
    FiberStack& stack(size_t worker, size_t thread) const { return *sets_[worker]->stacks[thread]; }
    void release();

  private:
    friend class FiberStackPool;
    FiberStackPool* pool_ = nullptr;
    std::vector<FiberStackPool::WorkerSet*> sets_;
    size_t threads_ = 0;
};

// Where a suspended context's registers are saved: its stack pointer.
struct FiberContext {
    void* stack_pointer = nullptr;
    // ThreadSanitizer's context (unused without it): the fiber's FiberStack's, or, for an OS
    // thread's own stack, the thread's, taken when it first switches away.
    void* thread_sanitizer_fiber = nullptr;
    // AddressSanitizer bookkeeping (unused without it): the fake stack's home (the fiber's
    // FiberStack, or own_fake_stack for an OS thread's own stack) and the stack's bounds.
    void* own_fake_stack = nullptr;
    void** fake_stack = &own_fake_stack;
    const void* stack_bottom = nullptr;
    size_t stack_size = 0;
};

// Prepares `fiber` to run entry(argument) on `stack` the first time it is switched to. entry
// must never return: it ends by switching away with fiber_exit_to.
void fiber_prepare(FiberContext* fiber, FiberStack& stack, void (*entry)(void*), void* argument);

// Suspends `from` and resumes `to`. Returns when something switches back to `from`.
void fiber_switch(FiberContext* from, FiberContext* to);

// Leaves the current fiber for good (it finished or was abandoned) and resumes `to`; its stack
// may be prepared for another fiber. A fiber's entry function must not be instrumented by a
// sanitizer (MFA_SIM_FIBER_ENTRY): its frame never returns, and the sanitizers would account
// for it on every fiber run on the stack.
[[noreturn]] void fiber_exit_to(FiberContext* from, FiberContext* to);
#define MFA_SIM_FIBER_ENTRY __attribute__((disable_sanitizer_instrumentation))

// Must be the first call in a fiber's entry function (completes the sanitizer's switch).
void fiber_started(FiberContext* self, FiberContext* from);

} // namespace mfa::sim

#endif // MFA_METAL_SIM_FIBER_H
