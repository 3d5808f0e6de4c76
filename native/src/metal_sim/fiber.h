// Cooperative fibers for the simulator's kernel threads: a context switch that saves only the
// callee-saved registers (a few nanoseconds, versus a system call for swapcontext), stacks with
// a guard page, and the AddressSanitizer annotations that make stack switching visible to it.
//
// Fibers never migrate between OS threads, and share their OS thread's floating-point
// environment (MXCSR / FPCR are not switched: kernels cannot change them).
#ifndef MFA_METAL_SIM_FIBER_H
#define MFA_METAL_SIM_FIBER_H

#include <cstddef>

namespace mfa::sim {

// An mmap'ed stack with a PROT_NONE guard page below it, so an overflow faults instead of
// silently corrupting a neighbour.
class FiberStack {
  public:
    explicit FiberStack(size_t usable_bytes);
    ~FiberStack();
    FiberStack(const FiberStack&) = delete;
    FiberStack& operator=(const FiberStack&) = delete;

    bool valid() const { return mapping_ != nullptr; }
    char* bottom() const { return usable_; } // lowest usable address
    size_t size() const { return usable_bytes_; }

    // AddressSanitizer's fake stack (for use-after-return detection) of the fibers that run
    // here. It lives as long as the stack, so fibers reuse it instead of having the sanitizer
    // map and unmap one per fiber.
    void* sanitizer_fake_stack = nullptr;

  private:
    void* mapping_ = nullptr;
    size_t mapping_bytes_ = 0;
    char* usable_ = nullptr;
    size_t usable_bytes_ = 0;
};

// Where a suspended context's registers are saved: its stack pointer.
struct FiberContext {
    void* stack_pointer = nullptr;
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
// may be prepared for another fiber.
[[noreturn]] void fiber_exit_to(FiberContext* from, FiberContext* to);

// Must be the first call in a fiber's entry function (completes the sanitizer's switch).
void fiber_started(FiberContext* self, FiberContext* from);

} // namespace mfa::sim

#endif // MFA_METAL_SIM_FIBER_H
