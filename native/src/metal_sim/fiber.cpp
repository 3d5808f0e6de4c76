#include "metal_sim/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <new>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MFA_SIM_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define MFA_SIM_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MFA_SIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define MFA_SIM_TSAN 1
#endif
#if MFA_SIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if MFA_SIM_TSAN
#include <sanitizer/tsan_interface.h>
#endif

// The raw switch: push the callee-saved registers on the current stack, store the stack pointer
// in *save, load new_sp, pop the registers saved there, return into that context. A new fiber's
// stack is laid out by fiber_prepare so that this "returns" into the trampoline, which calls
// entry(argument) from the two registers it was given.
extern "C" void mfa_sim_switch_raw(void** save, void* new_sp);
extern "C" void mfa_sim_fiber_trampoline();

#if defined(__x86_64__)
extern "C" __attribute__((naked, noinline)) void mfa_sim_switch_raw(void**, void*) {
    asm volatile("pushq %rbp\n"
                 "pushq %rbx\n"
                 "pushq %r12\n"
                 "pushq %r13\n"
                 "pushq %r14\n"
                 "pushq %r15\n"
                 "movq %rsp, (%rdi)\n"
                 "movq %rsi, %rsp\n"
                 "popq %r15\n"
                 "popq %r14\n"
                 "popq %r13\n"
                 "popq %r12\n"
                 "popq %rbx\n"
                 "popq %rbp\n"
                 "retq\n");
}
// r12 = argument, r13 = entry.
extern "C" __attribute__((naked, noinline)) void mfa_sim_fiber_trampoline() {
    asm volatile("movq %r12, %rdi\n"
                 "callq *%r13\n"
                 "ud2\n");
}
#elif defined(__aarch64__)
extern "C" __attribute__((naked, noinline)) void mfa_sim_switch_raw(void**, void*) {
    asm volatile("sub sp, sp, #160\n"
                 "stp x19, x20, [sp, #0]\n"
                 "stp x21, x22, [sp, #16]\n"
                 "stp x23, x24, [sp, #32]\n"
                 "stp x25, x26, [sp, #48]\n"
                 "stp x27, x28, [sp, #64]\n"
                 "stp x29, x30, [sp, #80]\n"
                 "stp d8, d9, [sp, #96]\n"
                 "stp d10, d11, [sp, #112]\n"
                 "stp d12, d13, [sp, #128]\n"
                 "stp d14, d15, [sp, #144]\n"
                 "mov x9, sp\n"
                 "str x9, [x0]\n"
                 "mov sp, x1\n"
                 "ldp x19, x20, [sp, #0]\n"
                 "ldp x21, x22, [sp, #16]\n"
                 "ldp x23, x24, [sp, #32]\n"
                 "ldp x25, x26, [sp, #48]\n"
                 "ldp x27, x28, [sp, #64]\n"
                 "ldp x29, x30, [sp, #80]\n"
                 "ldp d8, d9, [sp, #96]\n"
                 "ldp d10, d11, [sp, #112]\n"
                 "ldp d12, d13, [sp, #128]\n"
                 "ldp d14, d15, [sp, #144]\n"
                 "add sp, sp, #160\n"
                 "ret\n");
}
// x19 = argument, x20 = entry.
extern "C" __attribute__((naked, noinline)) void mfa_sim_fiber_trampoline() {
    asm volatile("mov x0, x19\n"
                 "blr x20\n"
                 "brk #0\n");
}
#else
#error "metal-sim fibers support x86-64 and AArch64 only"
#endif

namespace mfa::sim {

FiberStack::FiberStack(size_t usable_bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    usable_bytes_ = (usable_bytes + page - 1) / page * page;
    mapping_bytes_ = usable_bytes_ + page;
    void* mapping = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) return;
    if (mprotect(mapping, page, PROT_NONE) != 0) {
        munmap(mapping, mapping_bytes_);
        return;
    }
    mapping_ = mapping;
    usable_ = static_cast<char*>(mapping) + page;
}

#if MFA_SIM_ASAN
namespace {

// A fiber that only destroys its stack's fake stack: a fake stack is destroyed by leaving the
// fiber that uses it with a null save slot, so one last fiber enters it to leave that way.
struct FakeStackRetirement {
    FiberContext caller;
    FiberContext fiber;
};

void retire_fake_stack(void* argument) {
    auto* r = static_cast<FakeStackRetirement*>(argument);
    fiber_started(&r->fiber, &r->caller);
    __sanitizer_start_switch_fiber(nullptr, r->caller.stack_bottom, r->caller.stack_size);
    mfa_sim_switch_raw(&r->fiber.stack_pointer, r->caller.stack_pointer);
    __builtin_unreachable();
}

} // namespace
#endif

FiberStack::~FiberStack() {
#if MFA_SIM_TSAN
    if (thread_sanitizer_fiber) __tsan_destroy_fiber(thread_sanitizer_fiber);
#endif
#if MFA_SIM_ASAN
    if (sanitizer_fake_stack) {
        FakeStackRetirement retirement;
        fiber_prepare(&retirement.fiber, *this, &retire_fake_stack, &retirement);
        fiber_switch(&retirement.caller, &retirement.fiber);
    }
#endif
    if (mapping_) munmap(mapping_, mapping_bytes_);
}

// ---- Pools ---------------------------------------------------------------------------------

// Under AddressSanitizer a stack is four times the size, and each gets a fake stack (for
// stack-use-after-return detection) of eleven size classes of 1 MiB each, mapped and
// garbage-collected by the sanitizer; under ThreadSanitizer each stack's memory gets shadow
// and metadata mappings of its own. An eighth of the stacks keep such runs' cost in check.
#if MFA_SIM_ASAN
const size_t FiberStackPool::kStackBytes = size_t{1} << 20;
const size_t FiberStackPool::kMaxStacksPerPool = 1024;
const size_t FiberStackPool::kMaxStacksPerProcess = 2048;
#elif MFA_SIM_TSAN
const size_t FiberStackPool::kStackBytes = size_t{256} << 10;
const size_t FiberStackPool::kMaxStacksPerPool = 1024;
const size_t FiberStackPool::kMaxStacksPerProcess = 2048;
#else
const size_t FiberStackPool::kStackBytes = size_t{256} << 10;
const size_t FiberStackPool::kMaxStacksPerPool = 8192;
const size_t FiberStackPool::kMaxStacksPerProcess = 16384;
#endif

namespace {
std::atomic<size_t> process_stacks{0}; // stacks mapped by all pools
} // namespace

FiberStackPool::FiberStackPool() { mfa::ForkRegistry<FiberStackPool>::add(this); }

FiberStackPool::~FiberStackPool() {
    mfa::ForkRegistry<FiberStackPool>::remove(this);
    for (auto& set : sets_) unmap(set.get());
}

// Fresh objects over the locked ones (reusing their storage without running destructors is
// well defined); a condition variable must not keep the parent's waiters either.
void FiberStackPool::reset_in_fork_child() {
    for (auto& set : sets_) {
        set->reserved = false;
        // Fibers may have been mid-call on any of them: their frames stay poisoned for
        // AddressSanitizer, and ThreadSanitizer's contexts of the parent's fibers are
        // left to it (not destroyed: it knows them as the parent's).
        for (auto& stack : set->stacks) {
            stack->abandoned = true;
            stack->thread_sanitizer_fiber = nullptr;
        }
    }
    new (&given_back_) std::condition_variable;
    new (&mutex_) std::mutex;
}

bool FiberStackPool::grow(WorkerSet* set, size_t count, bool beyond_process_bound) {
    if (set->stacks.size() >= count) return true;
    const size_t extra = count - set->stacks.size();
    if (mapped_ + extra > kMaxStacksPerPool) return false;
    size_t before = process_stacks.load(std::memory_order_relaxed);
    do {
        if (!beyond_process_bound && before + extra > kMaxStacksPerProcess) return false;
    } while (!process_stacks.compare_exchange_weak(before, before + extra));
    const size_t had = set->stacks.size();
    bool mapped = true;
    try {
        while (set->stacks.size() < count) {
            auto stack = std::make_unique<FiberStack>(kStackBytes);
            if (!stack->valid()) {
                mapped = false;
                break;
            }
            set->stacks.push_back(std::move(stack));
        }
    } catch (const std::bad_alloc&) {
        mapped = false;
    }
    if (!mapped) {
        set->stacks.resize(had);
        process_stacks.fetch_sub(extra);
        return false;
    }
    mapped_ += extra;
    return true;
}

void FiberStackPool::unmap(WorkerSet* set) {
    const size_t count = set->stacks.size();
    set->stacks.clear();
    mapped_ -= count;
    process_stacks.fetch_sub(count);
}

bool FiberStackPool::reserve(size_t max_workers, size_t threads_per_worker,
                             FiberStackReservation* out) {
    out->release();
    const size_t threads = std::max<size_t>(1, threads_per_worker);
    const size_t want = std::max<size_t>(1, std::min(max_workers, kMaxStacksPerPool / threads));
    std::vector<WorkerSet*> granted;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        auto take = [&granted](WorkerSet* set) {
            set->reserved = true;
            granted.push_back(set);
        };
        // Free sets large enough, then free smaller ones grown, then new ones, within bounds.
        for (auto& set : sets_)
            if (granted.size() < want && !set->reserved && set->stacks.size() >= threads)
                take(set.get());
        for (auto& set : sets_)
            if (granted.size() < want && !set->reserved && grow(set.get(), threads, false))
                take(set.get());
        while (granted.size() < want) {
            auto set = std::make_unique<WorkerSet>();
            if (!grow(set.get(), threads, false)) break;
            sets_.push_back(std::move(set));
            take(sets_.back().get());
        }
        if (!granted.empty()) break;

        bool any_free = false, any_reserved = false;
        for (auto& set : sets_) (set->reserved ? any_reserved : any_free) = true;
        if (any_free) {
            // Free sets too small to serve this call hold the bound: map them anew at this size.
            sets_.erase(std::remove_if(sets_.begin(), sets_.end(),
                                       [this](const std::unique_ptr<WorkerSet>& set) {
                                           if (set->reserved) return false;
                                           unmap(set.get());
                                           return true;
                                       }),
                        sets_.end());
            continue;
        }
        if (!any_reserved) {
            // Nothing of this pool to wait for: other pools hold the process-wide bound (or
            // mapping failed). One set past that bound keeps the call running.
            auto set = std::make_unique<WorkerSet>();
            if (!grow(set.get(), threads, true)) return false;
            sets_.push_back(std::move(set));
            take(sets_.back().get());
            break;
        }
        given_back_.wait(lock);
    }
    out->pool_ = this;
    out->sets_ = std::move(granted);
    out->threads_ = threads;
    return true;
}

void FiberStackPool::give_back(const std::vector<WorkerSet*>& sets) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (WorkerSet* set : sets) set->reserved = false;
    }
    given_back_.notify_all();
}

void FiberStackReservation::release() {
    if (pool_) pool_->give_back(sets_);
    pool_ = nullptr;
    sets_.clear();
    threads_ = 0;
}

void fiber_prepare(FiberContext* fiber, FiberStack& stack, void (*entry)(void*), void* argument) {
#if MFA_SIM_ASAN
    // Frames of the previous fiber on this stack may still be poisoned: only near the top when
    // it returned (every frame but its entry's was unwound), at any depth when it was abandoned
    // mid-call. Unpoisoning the whole stack every time would clear 128 KiB of shadow per
    // kernel thread per threadgroup.
    constexpr size_t kTopBytes = 16384;
    if (stack.abandoned || stack.size() <= kTopBytes)
        __asan_unpoison_memory_region(stack.bottom(), stack.size());
    else
        __asan_unpoison_memory_region(stack.bottom() + stack.size() - kTopBytes, kTopBytes);
#endif
#if MFA_SIM_TSAN
    // Each stack's fibers are one context for ThreadSanitizer, with a call stack of its own;
    // an abandoned fiber left frames on it that would never be popped, so it starts afresh.
    if (stack.abandoned && stack.thread_sanitizer_fiber) {
        __tsan_destroy_fiber(stack.thread_sanitizer_fiber);
        stack.thread_sanitizer_fiber = nullptr;
    }
    if (!stack.thread_sanitizer_fiber) stack.thread_sanitizer_fiber = __tsan_create_fiber(0);
    fiber->thread_sanitizer_fiber = stack.thread_sanitizer_fiber;
#endif
    stack.abandoned = false;
    const uintptr_t top =
        (reinterpret_cast<uintptr_t>(stack.bottom()) + stack.size()) & ~uintptr_t{15};
    void** frame;
#if defined(__x86_64__)
    // Seven slots popped by the switch (r15 r14 r13 r12 rbx rbp, return address); after the
    // return rsp is 16-byte aligned, as the trampoline's call requires.
    frame = reinterpret_cast<void**>(top - 72);
    frame[0] = nullptr;                                            // r15
    frame[1] = nullptr;                                            // r14
    frame[2] = reinterpret_cast<void*>(entry);                     // r13
    frame[3] = argument;                                           // r12
    frame[4] = nullptr;                                            // rbx
    frame[5] = nullptr;                                            // rbp
    frame[6] = reinterpret_cast<void*>(&mfa_sim_fiber_trampoline); // return address
#else
    frame = reinterpret_cast<void**>(top - 160);
    for (int i = 0; i < 20; ++i) frame[i] = nullptr;
    frame[0] = argument;                                            // x19
    frame[1] = reinterpret_cast<void*>(entry);                      // x20
    frame[11] = reinterpret_cast<void*>(&mfa_sim_fiber_trampoline); // x30
#endif
    fiber->stack_pointer = frame;
    fiber->fake_stack = &stack.sanitizer_fake_stack;
    fiber->stack_bottom = stack.bottom();
    fiber->stack_size = stack.size();
}

#if MFA_SIM_TSAN
// Tells ThreadSanitizer which context runs next. The switch synchronizes (no
// __tsan_switch_to_fiber_no_sync): the scheduler orders what the fibers of a threadgroup do.
// Always inlined: a function of its own would be entered on one fiber's call stack and left
// on the other's.
__attribute__((always_inline)) static inline void thread_sanitizer_switch(FiberContext* from,
                                                                          FiberContext* to) {
    if (!from->thread_sanitizer_fiber) from->thread_sanitizer_fiber = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(to->thread_sanitizer_fiber, 0);
}
#endif

// What every switch does before control leaves `from`: tell the sanitizers where it goes. The
// ASan fake stack of `from` is kept for the next fiber on this stack (a null slot would destroy
// it).
__attribute__((always_inline)) static inline void announce_switch(FiberContext* from,
                                                                  FiberContext* to) {
#if MFA_SIM_TSAN
    thread_sanitizer_switch(from, to);
#endif
#if MFA_SIM_ASAN
    __sanitizer_start_switch_fiber(from->fake_stack, to->stack_bottom, to->stack_size);
#endif
    (void)from;
    (void)to;
}

void fiber_switch(FiberContext* from, FiberContext* to) {
    announce_switch(from, to);
    mfa_sim_switch_raw(&from->stack_pointer, to->stack_pointer);
#if MFA_SIM_ASAN
    __sanitizer_finish_switch_fiber(*from->fake_stack, nullptr, nullptr);
#endif
}

MFA_SIM_FIBER_ENTRY void fiber_exit_to(FiberContext* from, FiberContext* to) {
    announce_switch(from, to);
    mfa_sim_switch_raw(&from->stack_pointer, to->stack_pointer);
    __builtin_unreachable();
}

void fiber_started(FiberContext* self, FiberContext* from) {
#if MFA_SIM_ASAN
    __sanitizer_finish_switch_fiber(*self->fake_stack, &from->stack_bottom, &from->stack_size);
#else
    (void)self;
    (void)from;
#endif
}

} // namespace mfa::sim
