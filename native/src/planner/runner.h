/*
 * runner.h - one attention call on a GPU device: everything between the planner's mfa_plan and
 * the device's encoder calls, in portable C, shared by the Metal host and metal-sim.
 *
 * The runner owns the rules: which passes have work, the re-plan loop when a pipeline runs
 * fewer threads per threadgroup than planned, the checks of a plan's shape, which memory each
 * operand binds (one memory per operand for the whole call, so that a later pass reads what an
 * earlier one wrote), the placeholder for operands without elements, the scratch. A device
 * supplies only what needs its own objects, through mfa_gpu_device_ops: pipelines, memory,
 * encoding. Because metal-sim runs the same runner, every rule here runs in CI.
 *
 * A call has three steps, so that nothing is encoded, run or written by a call that fails:
 *   1. mfa_gpu_call_prepare(): plan, get every pipeline, check the plan against the device,
 *      allocate the scratch and resolve every operand's memory, bounds included: host memory
 *      wrapped or staged by the device, a device buffer bound in place at its byte offset after
 *      the byte range the binding reaches was checked against the length the buffer reports.
 *      Everything that can fail fails here, and then releases what it acquired.
 *   2. mfa_gpu_call_encode(): encode the passes that have work, in order, into commands of the
 *      device's (on metal a command buffer's compute encoder). Cannot fail.
 *   3. mfa_gpu_call_finish(): after the commands ran, or when they never will: copy staged
 *      outputs back if they completed, and release everything the call acquired.
 * mfa_gpu_run() is the synchronous call: prepare, the device's own commands (begin, encode,
 * commit and wait), finish. mfa_gpu_encode() encodes into a caller's command buffer instead and
 * finishes when that completes.
 *
 * All state of a call lives in its mfa_gpu_call, so calls on one device may run concurrently;
 * the device's operations must be thread-safe.
 */
#ifndef MFA_PLANNER_RUNNER_H
#define MFA_PLANNER_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/planner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Memory as a kernel argument binds it: the device's buffer at a byte offset. */
typedef struct mfa_gpu_memory {
    void* buffer;    /* the device's buffer: an id<MTLBuffer> on metal, host memory on metal-sim */
    uint64_t offset; /* of the binding's first byte within buffer */
    uint64_t length; /* bytes from offset that the binding may touch */
    void* owner;     /* what the call acquired for this memory (a wrapper, a staged copy, the
                        scratch), handed to ops->release when the call finishes; NULL when the
                        memory is only borrowed (the placeholder) */
} mfa_gpu_memory;

/* Caller memory that a binding reaches, for ops->wrap_host. */
typedef struct mfa_host_range {
    mfa_operand operand;
    char* first;         /* the lowest byte any element of the view occupies */
    uint64_t length;     /* bytes from first; > 0 */
    size_t element_size; /* elements in the range are aligned to it unless the caller's are not */
    bool writable;       /* some pass of the call writes it: a staged copy must go back */
    /* The view itself, to copy a staged output back element by element (bytes between a strided
     * view's elements may belong to someone else). Element (b, h, s, d) is at
     * data + element_size * (b*stride[0] + h*stride[1] + s*stride[2] + d*stride[3]). */
    char* data;
    int64_t shape[4];
    int64_t stride[4];
} mfa_host_range;

/* A pipeline as the runner needs to know it. */
typedef struct mfa_gpu_pipeline {
    void* pipeline; /* the device's compiled pipeline; the device keeps it alive (its cache) */
    uint32_t max_total_threads_per_threadgroup;
    uint64_t static_threadgroup_memory_length;
} mfa_gpu_pipeline;

/* One pass, resolved for the device's encode: set the pipeline, bind every buffer, set
 * pass->params at pass->params_index (bytes copied at encode time), the threadgroup memory and
 * dispatch pass->threadgroups of pass->threads_per_threadgroup threads. */
typedef struct mfa_gpu_dispatch {
    const mfa_pass_plan* pass;
    void* pipeline;
    uint32_t num_buffers;
    struct {
        uint32_t index; /* [[buffer(index)]] */
        const mfa_gpu_memory* memory;
    } buffers[MFA_PLAN_MAX_BINDINGS];
} mfa_gpu_dispatch;

/* What a device supplies. `device` is mfa_gpu_device.self. Failing operations report through
 * mfa_set_error and return its status. */
typedef struct mfa_gpu_device_ops {
    /* The pipeline of a planned pass: kernel_name specialised with its function constants. */
    mfa_status (*pipeline)(void* device, const mfa_pass_plan* pass, mfa_gpu_pipeline* out);
    /* Caller memory as device memory, wrapped in place or staged (copied in). */
    mfa_status (*wrap_host)(void* device, const mfa_host_range* range, mfa_gpu_memory* out);
    /* `bytes` of memory that only the call's passes read and write. */
    mfa_status (*scratch)(void* device, uint64_t bytes, mfa_gpu_memory* out);
    /* Give back an owner from wrap_host or scratch. completed: the call's commands ran to
     * completion, so a staged output goes back to the caller first. */
    void (*release)(void* device, void* owner, bool completed);
    /* Encode one pass into commands (from begin, or in future a caller's command buffer). */
    void (*encode)(void* device, void* commands, const mfa_gpu_dispatch* dispatch);
    /* The synchronous path: new commands of the device's own, labelled for its tools... */
    mfa_status (*begin)(void* device, const char* label, void** commands);
    /* ...then run them, wait, and free them; the status of the run (MFA_ERROR_DEVICE or
     * MFA_ERROR_OUT_OF_MEMORY when the device failed while running). `what` names the call in
     * messages. */
    mfa_status (*commit_and_wait)(void* device, void* commands, const char* what);

    /* Device memory (problems in MFA_MEMORY_DEVICE); NULL where the device has none. */
    /* A caller's device buffer as a whole: the object the encoder binds (metal: the
     * id<MTLBuffer> itself; metal-sim: its contents), offset 0, and the length in bytes the
     * buffer reports. Borrowed (owner NULL): the caller keeps the buffer alive. */
    mfa_status (*device_buffer)(void* device, void* buffer, mfa_gpu_memory* out);

    /* Encoding into a caller's command buffer (mfa_gpu_encode); NULL where the device has
     * none. begin_encode: commands of the device's that encode into command_buffer; on
     * failure (e.g. a command buffer already committed) nothing is encoded... */
    mfa_status (*begin_encode)(void* device, void* command_buffer, const char* label,
                               void** commands);
    /* ...then, after the passes were encoded into commands, hand them to command_buffer and
     * arrange for completed(arg, ran) to be called exactly once: when command_buffer has
     * completed (ran: without error) or is dropped without running (ran false). On failure
     * nothing of commands reached command_buffer, commands are freed and completed is never
     * called. */
    mfa_status (*end_encode)(void* device, void* commands, void (*completed)(void* arg, bool ran),
                             void* arg);
} mfa_gpu_device_ops;

/* A device as the runner drives it; each GPU backend keeps one per context. */
typedef struct mfa_gpu_device {
    const mfa_gpu_device_ops* ops;
    void* self;
    const char* backend; /* "metal" or "metal-sim": begins the runner's messages */
    const char* name;    /* the device, for messages */
    mfa_gpu_family family;
    uint32_t max_threads_per_threadgroup; /* the device's bound, before any pipeline's */
    uint64_t max_threadgroup_memory_length;
    uint64_t max_buffer_length;
    /* Bound where a pass binds an operand without elements: the kernel never touches it, but
     * every argument index needs a buffer. Borrowed (owner NULL), at least 16 bytes. */
    mfa_gpu_memory placeholder;
} mfa_gpu_device;

/* One call, from prepare to finish. Plain data owned by the caller (the stack, or the heap while
 * encoded commands are in flight); its fields are for the runner. Only prepare reads the
 * problem: encode and finish work from the plan and the resolved memory, so a call may outlive
 * the problem (and the public call) it was prepared for. */
typedef struct mfa_gpu_call {
    const mfa_gpu_device* device;
    const mfa_problem* problem;
    const char* what; /* "forward" or "backward" */
    mfa_plan plan;
    void* pipelines[MFA_PLAN_MAX_PASSES];     /* NULL for passes without work */
    mfa_gpu_memory memory[MFA_OPERAND_COUNT]; /* per operand; valid where `resolved` has its bit */
    uint32_t resolved;                        /* bit (1u << operand) per operand with memory */
} mfa_gpu_call;

/* mfa_pass_has_work(): 0 when a pass dispatches no threadgroup; such a pass is neither
 * compiled, bound nor encoded. */
int mfa_pass_has_work(const mfa_pass_plan* pass);

/* mfa_gpu_call_prepare(): step 1 for a forward or backward call of problem on device. On
 * failure nothing is left acquired and *call needs no finish. */
mfa_status mfa_gpu_call_prepare(mfa_gpu_call* call, const mfa_gpu_device* device,
                                const mfa_problem* problem, bool backward);

/* mfa_gpu_call_has_work(): whether a prepared call encodes anything at all. */
int mfa_gpu_call_has_work(const mfa_gpu_call* call);

/* mfa_gpu_call_encode(): step 2, into the device's commands. */
void mfa_gpu_call_encode(const mfa_gpu_call* call, void* commands);

/* mfa_gpu_call_finish(): step 3. completed: the encoded commands ran to completion. */
void mfa_gpu_call_finish(mfa_gpu_call* call, bool completed);

/* mfa_gpu_run(): one synchronous call, as the public entry points make it. */
mfa_status mfa_gpu_run(const mfa_gpu_device* device, const mfa_problem* problem, bool backward);

/* mfa_gpu_encode(): one call encoded into a caller's command buffer (mfa_attention_encode):
 * prepare, begin_encode, encode, end_encode. The call lives on the heap until command_buffer
 * completes or is dropped, and is finished then (its scratch given back). On failure nothing
 * was encoded and nothing stays acquired. */
mfa_status mfa_gpu_encode(const mfa_gpu_device* device, void* command_buffer,
                          const mfa_problem* problem, bool backward);

#ifdef __cplusplus
}
#endif

#endif /* MFA_PLANNER_RUNNER_H */
