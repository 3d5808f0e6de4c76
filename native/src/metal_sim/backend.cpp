// The metal-sim backend: the plan runner (planner/runner.h), the same one the Metal host uses,
// drives the simulator as its device, so the kernels, the configuration and the host-side rules
// it tests are exactly those a Mac would run. What is left here is the simulator's side of the
// device: caller memory is used in place (host arrays, and the contents of the device buffers
// of command_buffer.h), the scratch comes from a pool of the context, and the commands of a call
// are recorded dispatches that run when committed: at once for a synchronous call, with the
// caller's command buffer for mfa_attention_encode. Everything a call needs is reserved before
// its first pass runs (the scratch at prepare, the fiber stacks of every pass when it runs), so
// a call that fails for lack of resources has written nothing.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define MFA_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MFA_SIM_ASAN 1
#endif
#endif
#ifdef MFA_SIM_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "core/backend.h"
#include "core/fork_registry.h"
#include "metal_sim/command_buffer.h"
#include "metal_sim/fiber.h"
#include "metal_sim/sim.h"
#include "planner/runner.h"

namespace {

// The context's scratch: blocks given back by finished calls are kept for later ones (up to
// kPooledBytes in all), as the frameworks' allocators keep GPU memory, so that encoded calls do
// not allocate per call. A block kept in the pool is poisoned under AddressSanitizer, so a pass
// that touched scratch after its call gave it back would be reported. A context is shared by
// the threads that call on it, and a fork() may come while one of them is inside take() or
// give_back(): the pool is in the process's fork registry, so that the child gets it consistent
// and unlocked (a block an unfinished call of the parent held is simply not the child's).
class ScratchPool {
  public:
    static constexpr size_t kPooledBytes = size_t(64) << 20;
    static constexpr size_t kPoolSlots = 64;

    ScratchPool() { mfa::ForkRegistry<ScratchPool>::add(this); }
    ScratchPool(const ScratchPool&) = delete;
    ScratchPool& operator=(const ScratchPool&) = delete;
    ~ScratchPool() {
        mfa::ForkRegistry<ScratchPool>::remove(this);
        for (Block* block : free_) release(block);
    }

    // Room for kPoolSlots kept blocks, so that giving one back never allocates.
    void reserve_slots() { free_.reserve(kPoolSlots); }

    // The smallest kept block of at least `bytes` (and at most twice that, so that a small call
    // does not hold a large block), else a new one; nullptr when memory runs out.
    void* take(size_t bytes) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            size_t best = free_.size();
            for (size_t i = 0; i < free_.size(); ++i) {
                const size_t size = free_[i]->bytes;
                if (size >= bytes && size / 2 <= bytes &&
                    (best == free_.size() || size < free_[best]->bytes))
                    best = i;
            }
            if (best != free_.size()) {
                Block* block = free_[best];
                free_[best] = free_.back();
                free_.pop_back();
                pooled_ -= block->bytes;
                set_poisoned(block, false);
                return block->payload();
            }
        }
        if (bytes > SIZE_MAX - 2 * sizeof(Block)) return nullptr;
        const size_t total =
            (sizeof(Block) + bytes + sizeof(Block) - 1) / sizeof(Block) * sizeof(Block);
        auto* block = static_cast<Block*>(std::aligned_alloc(alignof(Block), total));
        if (!block) return nullptr;
        block->bytes = bytes;
        return block->payload();
    }

    // Back from a finished call: kept while the pool has room, else freed.
    void give_back(void* memory) {
        Block* block = reinterpret_cast<Block*>(static_cast<char*>(memory) - sizeof(Block));
        std::lock_guard<std::mutex> lock(mutex_);
        if (pooled_ + block->bytes <= kPooledBytes && free_.size() < free_.capacity()) {
            set_poisoned(block, true);
            free_.push_back(block);
            pooled_ += block->bytes;
        } else {
            std::free(block);
        }
    }

  private:
    friend class mfa::ForkRegistry<ScratchPool>;

    // A fresh mutex over the one the prepare handler locked (its storage reused, as the
    // registry allows); the kept blocks stay the child's.
    void reset_in_fork_child() { new (&mutex_) std::mutex; }

    // A block's size, then its bytes: a 64-byte header, so the payload is 64-byte aligned.
    struct alignas(64) Block {
        size_t bytes;
        void* payload() { return reinterpret_cast<char*>(this) + sizeof(Block); }
    };
    // A pooled block's payload is poisoned for AddressSanitizer until it is handed out again.
    static void set_poisoned(Block* block, bool poisoned) {
#ifdef MFA_SIM_ASAN
        if (poisoned)
            ASAN_POISON_MEMORY_REGION(block->payload(), block->bytes);
        else
            ASAN_UNPOISON_MEMORY_REGION(block->payload(), block->bytes);
#else
        (void)block;
        (void)poisoned;
#endif
    }
    static void release(Block* block) {
        set_poisoned(block, false);
        std::free(block);
    }
    std::mutex mutex_;
    std::vector<Block*> free_; // kept, poisoned; capacity reserved at creation
    size_t pooled_ = 0;
    ScratchPool* next_ = nullptr; // in the process's list of pools, for fork()
    ScratchPool* prev_ = nullptr;
};

struct SimState {
    mfa_gpu_family family;
    uint64_t schedule_seed;
    int workers;
    char device_name[64];
    mfa_gpu_device device;
    mfa::sim::FiberStackPool stacks; // the context's: reused by its calls, unmapped with it
    ScratchPool scratch;
};

// Bound where a pass has nothing to bind; the kernels never touch it.
char placeholder_bytes[16];

// A call's commands: its passes, recorded with everything they refer to, run by commit (of the
// synchronous path, or of the caller's command buffer they were encoded into).
struct SimCommands final : mfa::sim::EncodedWork {
    SimState* state = nullptr;
    uint32_t count = 0;
    mfa::sim::Dispatch dispatches[MFA_PLAN_MAX_PASSES];
    mfa::sim::FunctionConstant constants[MFA_PLAN_MAX_PASSES][MFA_PLAN_MAX_CONSTANTS];
    mfa_kernel_params params[MFA_PLAN_MAX_PASSES];
    // Encoded into a caller's command buffer: where the runner learns that the call is over.
    mfa::sim::CommandBuffer* command_buffer = nullptr;
    void (*on_completed)(void* arg, bool ran) = nullptr;
    void* on_completed_arg = nullptr;

    // The fiber stacks every recorded dispatch needs are reserved first, so that a call that
    // cannot get them fails before its first pass writes anything; then the dispatches run in
    // order, each to completion before the next, as one serial compute encoder runs them.
    mfa_status run() override {
        mfa::sim::FiberStackReservation stacks;
        mfa_status status = mfa::sim::reserve(state->stacks, dispatches, count, &stacks);
        for (uint32_t i = 0; i < count && status == MFA_OK; ++i) {
            dispatches[i].stacks = &stacks;
            status = mfa::sim::dispatch(dispatches[i]);
        }
        return status;
    }

    void completed(bool ran) override {
        if (on_completed) on_completed(on_completed_arg, ran);
    }
};

mfa_status sim_pipeline(void* device, const mfa_pass_plan* pass, mfa_gpu_pipeline* out) {
    (void)device;
    if (!mfa::sim::has_kernel(pass->kernel_name))
        return mfa_set_error(MFA_ERROR_INTERNAL, "metal-sim: kernel %s is not compiled in",
                             pass->kernel_name);
    // Function constants are bound per dispatch: there is nothing to compile ahead.
    out->pipeline = nullptr;
    out->max_total_threads_per_threadgroup = mfa::sim::kMaxThreadsPerThreadgroup;
    out->static_threadgroup_memory_length = 0;
    return MFA_OK;
}

mfa_status sim_wrap_host(void* device, const mfa_host_range* range, mfa_gpu_memory* out) {
    (void)device;
    out->buffer = range->first; // host memory is the simulator's device memory
    out->offset = 0;
    out->length = range->length;
    out->owner = nullptr;
    return MFA_OK;
}

mfa_status sim_scratch(void* device, uint64_t bytes, mfa_gpu_memory* out) {
    auto* s = static_cast<SimState*>(device);
    void* memory = bytes <= SIZE_MAX ? s->scratch.take((size_t)bytes) : nullptr;
    if (!memory)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal-sim: cannot allocate %llu bytes of scratch",
                             (unsigned long long)bytes);
    out->buffer = memory;
    out->offset = 0;
    out->length = bytes;
    out->owner = memory;
    return MFA_OK;
}

// The only owner a call acquires here is its scratch: caller memory is used in place.
void sim_release(void* device, void* owner, bool completed) {
    (void)completed; // nothing is staged: outputs were written in place
    static_cast<SimState*>(device)->scratch.give_back(owner);
}

mfa_status sim_begin(void* device, const char* label, void** commands) {
    (void)label;
    auto* recorded = new (std::nothrow) SimCommands;
    if (!recorded)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal-sim: cannot allocate commands");
    recorded->state = static_cast<SimState*>(device);
    *commands = recorded;
    return MFA_OK;
}

// The runner encodes at most one dispatch per pass of a plan, MFA_PLAN_MAX_PASSES in all.
void sim_encode(void* device, void* commands, const mfa_gpu_dispatch* dispatch) {
    const auto* s = static_cast<const SimState*>(device);
    auto* recorded = static_cast<SimCommands*>(commands);
    const uint32_t n = recorded->count++;
    const mfa_pass_plan& pass = *dispatch->pass;
    mfa::sim::FunctionConstant* constants = recorded->constants[n];
    for (uint32_t i = 0; i < pass.num_constants; ++i) {
        const mfa_function_constant& c = pass.constants[i];
        constants[i] = c.type == MFA_CONSTANT_TYPE_BOOL
                           ? mfa::sim::FunctionConstant::of_bool((uint16_t)c.index, c.value != 0)
                           : mfa::sim::FunctionConstant::of_uint((uint16_t)c.index, c.value);
    }
    mfa::sim::Dispatch& d = recorded->dispatches[n];
    d.kernel = pass.kernel_name;
    d.constants = constants;
    d.num_constants = pass.num_constants;
    for (uint32_t i = 0; i < dispatch->num_buffers; ++i) {
        const mfa_gpu_memory& memory = *dispatch->buffers[i].memory;
        mfa::sim::BufferBinding& slot = d.buffers[dispatch->buffers[i].index];
        slot.base = memory.buffer;
        slot.offset = (size_t)memory.offset;
        slot.length = (size_t)(memory.offset + memory.length);
    }
    // setBytes copies the arguments when encoding; so does this.
    std::memcpy(&recorded->params[n], &pass.params, sizeof pass.params);
    d.buffers[pass.params_index].base = &recorded->params[n];
    d.buffers[pass.params_index].length = sizeof pass.params;
    d.threadgroup_memory_lengths[MFA_THREADGROUP_STAGING] = pass.threadgroup_memory_length;
    d.threadgroups.x = (uint32_t)pass.threadgroups[0];
    d.threadgroups.y = (uint32_t)pass.threadgroups[1];
    d.threadgroups.z = (uint32_t)pass.threadgroups[2];
    d.threads_per_threadgroup.x = pass.threads_per_threadgroup;
    d.schedule_seed = s->schedule_seed;
    d.num_workers = s->workers;
}

mfa_status sim_commit_and_wait(void* device, void* commands, const char* what) {
    (void)device;
    (void)what; // the simulator's own message names the kernel and the fault
    auto* recorded = static_cast<SimCommands*>(commands);
    const mfa_status status = recorded->run();
    delete recorded;
    return status;
}

// A caller's device buffer: its contents are the memory the kernels see.
mfa_status sim_device_buffer(void* device, void* buffer, mfa_gpu_memory* out) {
    (void)device;
    mfa::sim::Buffer* b = mfa::sim::buffer_of(buffer);
    if (!b)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: a device array's buffer is not a live buffer of "
                             "mfa_buffer_create");
    out->buffer = b->contents;
    out->offset = 0;
    out->length = b->length;
    out->owner = nullptr;
    return MFA_OK;
}

mfa_status sim_begin_encode(void* device, void* command_buffer, const char* label,
                            void** commands) {
    auto* target = static_cast<mfa::sim::CommandBuffer*>(command_buffer);
    mfa_status status = target->check_encoding("mfa_attention_encode");
    if (status == MFA_OK) status = sim_begin(device, label, commands);
    if (status == MFA_OK) static_cast<SimCommands*>(*commands)->command_buffer = target;
    return status;
}

mfa_status sim_end_encode(void* device, void* commands, void (*completed)(void* arg, bool ran),
                          void* arg) {
    (void)device;
    auto* recorded = static_cast<SimCommands*>(commands);
    recorded->on_completed = completed;
    recorded->on_completed_arg = arg;
    const mfa_status status = recorded->command_buffer->append(recorded, "mfa_attention_encode");
    if (status != MFA_OK) delete recorded;
    return status;
}

const mfa_gpu_device_ops device_ops = {
    sim_pipeline, sim_wrap_host,       sim_scratch,       sim_release,      sim_encode,
    sim_begin,    sim_commit_and_wait, sim_device_buffer, sim_begin_encode, sim_end_encode};

int available() {
    for (int kind = 0; kind < MFA_PASS_KIND_COUNT; ++kind)
        if (!mfa::sim::has_kernel(mfa_pass_kernel_name((mfa_pass_kind)kind))) return 0;
    return 1;
}

mfa_status create(const mfa_context_options* options, void** state) {
    const mfa_gpu_family family =
        options->gpu_family == MFA_GPU_FAMILY_NONE ? MFA_GPU_FAMILY_APPLE9 : options->gpu_family;
    if (family != MFA_GPU_FAMILY_APPLE7 && family != MFA_GPU_FAMILY_APPLE8 &&
        family != MFA_GPU_FAMILY_APPLE9)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: gpu_family %d is not Apple7, Apple8 or Apple9",
                             (int)options->gpu_family);
    SimState* s = nullptr;
    try {
        s = new SimState();
    } catch (const std::exception&) {}
    if (!s) return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal-sim: cannot allocate a context");
    s->family = family;
    s->schedule_seed = options->sim_schedule_seed;
    const unsigned cores = std::thread::hardware_concurrency();
    s->workers = options->num_threads > 0 ? options->num_threads : (cores ? (int)cores : 1);
    std::snprintf(s->device_name, sizeof s->device_name, "metal-sim (Apple%d tables)", (int)family);
    mfa_gpu_device& device = s->device;
    device.ops = &device_ops;
    device.self = s;
    device.backend = "metal-sim";
    device.name = s->device_name;
    device.family = family;
    device.max_threads_per_threadgroup = mfa::sim::kMaxThreadsPerThreadgroup;
    device.max_threadgroup_memory_length = mfa::sim::kMaxThreadgroupMemoryBytes;
    device.max_buffer_length = SIZE_MAX;
    device.placeholder.buffer = placeholder_bytes;
    device.placeholder.length = sizeof placeholder_bytes;
    try {
        s->scratch.reserve_slots();
    } catch (const std::bad_alloc&) {
        delete s;
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal-sim: cannot allocate a context");
    }
    *state = s;
    return MFA_OK;
}

void destroy(void* state) { delete static_cast<SimState*>(state); }

const char* device_name(void* state) { return static_cast<SimState*>(state)->device_name; }

void capabilities(void* state, mfa_capabilities* caps) {
    const auto* s = static_cast<SimState*>(state);
    caps->dtypes = 1u << MFA_DTYPE_F32 | 1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16;
    caps->features = MFA_PLAN_FEATURES | MFA_FEATURE_DEVICE_BUFFERS | MFA_FEATURE_ENCODE;
    caps->backward_features = MFA_PLAN_BACKWARD_FEATURES;
    caps->max_head_dim = MFA_PLAN_MAX_HEAD_DIM;
    caps->gpu_family = s->family;
    caps->num_threads = s->workers;
}

mfa_status forward(void* state, const mfa_problem* problem) {
    return mfa_gpu_run(&static_cast<SimState*>(state)->device, problem, false);
}

mfa_status backward(void* state, const mfa_problem* problem) {
    return mfa_gpu_run(&static_cast<SimState*>(state)->device, problem, true);
}

// ---- mfa.h's device buffers and command buffers (mfa_device_ops) ----

mfa_status buffer_create(void* state, size_t length, void** buffer) {
    (void)state;
    mfa::sim::Buffer* b = nullptr;
    const mfa_status status = mfa::sim::buffer_create(length, &b);
    *buffer = b;
    return status;
}

void* buffer_contents(void* state, void* buffer) {
    (void)state;
    mfa::sim::Buffer* b = mfa::sim::buffer_of(buffer);
    return b ? b->contents : nullptr;
}

// 0 for a handle that is not a live buffer, so validation rejects every view in it.
size_t buffer_length(void* state, void* buffer) {
    (void)state;
    mfa::sim::Buffer* b = mfa::sim::buffer_of(buffer);
    return b ? b->length : 0;
}

void buffer_destroy(void* state, void* buffer) {
    (void)state;
    if (mfa::sim::Buffer* b = mfa::sim::buffer_of(buffer)) mfa::sim::buffer_destroy(b);
}

mfa_status encode(void* state, void* command_buffer, mfa_direction direction,
                  const mfa_problem* problem) {
    return mfa_gpu_encode(&static_cast<SimState*>(state)->device, command_buffer, problem,
                          direction == MFA_BACKWARD);
}

mfa_status command_buffer_create(void* state, void** command_buffer) {
    (void)state;
    *command_buffer = new (std::nothrow) mfa::sim::CommandBuffer;
    if (!*command_buffer)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal-sim: cannot allocate a command buffer");
    return MFA_OK;
}

mfa_status command_buffer_commit(void* state, void* command_buffer) {
    (void)state;
    return static_cast<mfa::sim::CommandBuffer*>(command_buffer)->commit();
}

mfa_status command_buffer_wait(void* state, void* command_buffer) {
    (void)state;
    return static_cast<mfa::sim::CommandBuffer*>(command_buffer)->wait();
}

void command_buffer_destroy(void* state, void* command_buffer) {
    (void)state;
    delete static_cast<mfa::sim::CommandBuffer*>(command_buffer);
}

// metal-sim's buffers are host memory: a merge in them is the core's host merge over their
// contents (commit runs a command buffer's work at once, so nothing is pending on them).
mfa_view contents_view(mfa_view view) {
    if (view.buffer != nullptr) {
        view.data = static_cast<char*>(buffer_contents(nullptr, view.buffer)) + view.byte_offset;
        view.buffer = nullptr;
        view.byte_offset = 0;
    }
    return view;
}

mfa_status merge(void* state, const mfa_merge_problem* problem) {
    (void)state;
    if (problem->memory == MFA_MEMORY_HOST) return mfa_core_merge_host(problem);
    std::vector<mfa_merge_part> parts;
    try {
        parts.assign(problem->parts, problem->parts + problem->count);
    } catch (const std::bad_alloc&) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal-sim: cannot allocate %d merge parts",
                             (int)problem->count);
    }
    for (mfa_merge_part& part : parts) {
        part.out = contents_view(part.out);
        part.lse = contents_view(part.lse);
    }
    mfa_merge_problem host = *problem;
    host.memory = MFA_MEMORY_HOST;
    host.parts = parts.data();
    host.out = contents_view(problem->out);
    host.lse = contents_view(problem->lse);
    return mfa_core_merge_host(&host);
}

const mfa_device_ops device_memory_ops = {buffer_create,
                                          buffer_contents,
                                          buffer_length,
                                          buffer_destroy,
                                          encode,
                                          command_buffer_create,
                                          command_buffer_commit,
                                          command_buffer_wait,
                                          command_buffer_destroy,
                                          merge,
                                          nullptr};

// No GPU timing: a simulated dispatch's time says nothing about a GPU's.
const mfa_backend_ops ops = {
    MFA_BACKEND_METAL_SIM, available, create,   destroy, device_name,
    capabilities,          forward,   backward, nullptr, &device_memory_ops};

} // namespace

extern "C" const mfa_backend_ops* mfa_metal_sim_backend_ops(void) { return &ops; }
