#include "metal_sim/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MFA_SIM_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MFA_SIM_ASAN 1
#endif
#if MFA_SIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
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

FiberStack::~FiberStack() {
    if (mapping_) munmap(mapping_, mapping_bytes_);
}

void fiber_prepare(FiberContext* fiber, FiberStack& stack, void (*entry)(void*), void* argument) {
#if MFA_SIM_ASAN
    // A previous fiber on this stack may have been abandoned mid-call, leaving its frames'
    // redzones poisoned.
    __asan_unpoison_memory_region(stack.bottom(), stack.size());
#endif
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

void fiber_switch(FiberContext* from, FiberContext* to) {
#if MFA_SIM_ASAN
    __sanitizer_start_switch_fiber(from->fake_stack, to->stack_bottom, to->stack_size);
#endif
    mfa_sim_switch_raw(&from->stack_pointer, to->stack_pointer);
#if MFA_SIM_ASAN
    __sanitizer_finish_switch_fiber(*from->fake_stack, nullptr, nullptr);
#endif
}

void fiber_exit_to(FiberContext* from, FiberContext* to) {
#if MFA_SIM_ASAN
    // Keep the fake stack for the next fiber on this stack (a null slot would destroy it).
    __sanitizer_start_switch_fiber(from->fake_stack, to->stack_bottom, to->stack_size);
#endif
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
