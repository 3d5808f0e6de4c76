/*
 * The plan runner: plan, pipelines, memory, encoding, finish (see runner.h).
 */
#include "planner/runner.h"

#include <stdlib.h>
#include <string.h>

int mfa_pass_has_work(const mfa_pass_plan* pass) {
    return pass->threadgroups[0] != 0 && pass->threadgroups[1] != 0 && pass->threadgroups[2] != 0;
}

int mfa_gpu_call_has_work(const mfa_gpu_call* call) {
    for (uint32_t i = 0; i < call->plan.num_passes; i++)
        if (mfa_pass_has_work(&call->plan.passes[i])) return 1;
    return 0;
}

/* The plan's counts index fixed arrays and its bindings index the operand table: a planner bug
 * must become an error, not an out-of-bounds access. */
static mfa_status check_plan_shape(const mfa_gpu_call* call) {
    const char* backend = call->device->backend;
    const mfa_plan* plan = &call->plan;
    if (plan->num_passes == 0 || plan->num_passes > MFA_PLAN_MAX_PASSES) {
        return mfa_set_error(MFA_ERROR_INTERNAL, "%s: the planner returned %u passes", backend,
                             plan->num_passes);
    }
    for (uint32_t i = 0; i < plan->num_passes; i++) {
        const mfa_pass_plan* pass = &plan->passes[i];
        if (pass->kernel_name == NULL || pass->num_bindings > MFA_PLAN_MAX_BINDINGS ||
            pass->num_constants > MFA_PLAN_MAX_CONSTANTS) {
            return mfa_set_error(MFA_ERROR_INTERNAL,
                                 "%s: pass %u of the plan has kernel %s, %u bindings and %u "
                                 "function constants",
                                 backend, i, pass->kernel_name ? pass->kernel_name : "(none)",
                                 pass->num_bindings, pass->num_constants);
        }
        /* setThreadgroupMemoryLength:atIndex: takes multiples of 16 bytes only. */
        if (pass->threadgroup_memory_length % 16 != 0) {
            return mfa_set_error(MFA_ERROR_INTERNAL,
                                 "%s: the plan of %s asks for %u bytes of threadgroup memory, not "
                                 "a multiple of 16",
                                 backend, pass->kernel_name, pass->threadgroup_memory_length);
        }
        for (uint32_t j = 0; j < pass->num_bindings; j++) {
            const mfa_buffer_binding* binding = &pass->bindings[j];
            if (binding->operand >= MFA_OPERAND_COUNT || binding->index == pass->params_index) {
                return mfa_set_error(MFA_ERROR_INTERNAL,
                                     "%s: %s binds operand %u at index %u (arguments at %u)",
                                     backend, pass->kernel_name, binding->operand, binding->index,
                                     pass->params_index);
            }
        }
    }
    return MFA_OK;
}

/* Plans until every pass's pipeline can run the planned threadgroup: a register-heavy pipeline
 * may report a maxTotalThreadsPerThreadgroup below the device's, and the planner must then pick
 * a configuration for that bound. The bound strictly shrinks, so this terminates. */
static mfa_status plan_with_pipelines(mfa_gpu_call* call, bool backward) {
    const mfa_gpu_device* device = call->device;
    const char* backend = device->backend;
    mfa_gpu_pipeline pipelines[MFA_PLAN_MAX_PASSES];
    uint32_t max_threads = device->max_threads_per_threadgroup;
    for (;;) {
        mfa_status status = (backward ? mfa_plan_backward : mfa_plan_forward)(
            call->problem, device->family, max_threads, &call->plan);
        if (status == MFA_OK) status = check_plan_shape(call);
        if (status != MFA_OK) return status;
        uint32_t lowest = max_threads;
        for (uint32_t i = 0; i < call->plan.num_passes; i++) {
            const mfa_pass_plan* pass = &call->plan.passes[i];
            memset(&pipelines[i], 0, sizeof pipelines[i]);
            if (!mfa_pass_has_work(pass)) continue;
            if (pass->threads_per_threadgroup == 0 || pass->threads_per_threadgroup > max_threads) {
                return mfa_set_error(MFA_ERROR_INTERNAL,
                                     "%s: the planner gave %s %u threads per threadgroup for a "
                                     "bound of %u",
                                     backend, pass->kernel_name, pass->threads_per_threadgroup,
                                     max_threads);
            }
            status = device->ops->pipeline(device->self, pass, &pipelines[i]);
            if (status != MFA_OK) return status;
            const uint32_t pipeline_max = pipelines[i].max_total_threads_per_threadgroup;
            if (pipeline_max < pass->threads_per_threadgroup && pipeline_max < lowest)
                lowest = pipeline_max;
        }
        if (lowest == max_threads) break;
        max_threads = lowest;
    }
    for (uint32_t i = 0; i < call->plan.num_passes; i++) {
        const mfa_pass_plan* pass = &call->plan.passes[i];
        call->pipelines[i] = pipelines[i].pipeline;
        if (!mfa_pass_has_work(pass)) continue;
        const uint64_t memory =
            pipelines[i].static_threadgroup_memory_length + pass->threadgroup_memory_length;
        if (memory > device->max_threadgroup_memory_length) {
            return mfa_set_error(
                MFA_ERROR_INTERNAL, "%s: %s needs %llu bytes of threadgroup memory; %s has %llu",
                backend, pass->kernel_name, (unsigned long long)memory, device->name,
                (unsigned long long)device->max_threadgroup_memory_length);
        }
    }
    return MFA_OK;
}

/* An operand in a caller's device buffer, bound in place at its byte offset. The bytes the
 * binding reaches, [view byte_offset + binding byte_offset, + byte_length), must lie inside the
 * length the buffer reports now: the core checked the view, and this checks the exact extent
 * the kernels bind, so that no disagreement between them can become a GPU access outside the
 * buffer. */
static mfa_status resolve_device_operand(const mfa_gpu_call* call,
                                         const mfa_buffer_binding* binding, const mfa_view* view,
                                         mfa_gpu_memory* out) {
    const mfa_gpu_device* device = call->device;
    const char* name = mfa_operand_name(binding->operand);
    if (device->ops->device_buffer == NULL) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "%s: operand %s is in a device buffer; %s binds host memory only",
                             device->backend, name, device->name);
    }
    mfa_gpu_memory whole;
    mfa_status status = device->ops->device_buffer(device->self, view->buffer, &whole);
    if (status != MFA_OK) return status;
    /* In 128 bits: a view's offsets were checked to fit 64, their sum need not. */
    const __int128 first = (__int128)view->byte_offset + binding->byte_offset;
    const __int128 end = first + binding->byte_length;
    if (first < 0 || end > (__int128)whole.length) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s: operand %s reaches bytes %lld to %lld of its device buffer "
                             "(byte_offset %lld), outside the buffer's %llu bytes",
                             device->backend, name, (long long)first, (long long)(end - 1),
                             (long long)view->byte_offset, (unsigned long long)whole.length);
    }
    out->buffer = whole.buffer;
    out->offset = whole.offset + (uint64_t)first;
    out->length = (uint64_t)binding->byte_length;
    out->owner = NULL;
    return MFA_OK;
}

/* The memory behind one operand for the whole call: the one place that maps an operand to
 * memory. Every operand is caller memory, in host address space (wrapped or staged by the
 * device) or in a device buffer (bound in place), except the scratch operands (delta, partial
 * results), memory of the call's own; a binding without bytes gets the placeholder. */
static mfa_status resolve_operand(const mfa_gpu_call* call, const mfa_buffer_binding* binding,
                                  bool writable, mfa_gpu_memory* out) {
    const mfa_gpu_device* device = call->device;
    const char* name = mfa_operand_name(binding->operand);
    if (binding->byte_length == 0) {
        *out = device->placeholder;
        return MFA_OK;
    }
    if (binding->byte_length < 0 || (uint64_t)binding->byte_length > device->max_buffer_length) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "%s: operand %s spans %lld bytes; %s's largest buffer is %llu bytes",
                             device->backend, name, (long long)binding->byte_length, device->name,
                             (unsigned long long)device->max_buffer_length);
    }
    if (mfa_operand_is_scratch(binding->operand)) {
        if (binding->byte_offset != 0) {
            return mfa_set_error(MFA_ERROR_INTERNAL,
                                 "%s: the plan binds scratch %s at byte %lld, not at its start",
                                 device->backend, name, (long long)binding->byte_offset);
        }
        return device->ops->scratch(device->self, (uint64_t)binding->byte_length, out);
    }
    mfa_operand_view view;
    if (!mfa_problem_operand(call->problem, binding->operand, &view) || view.view == NULL ||
        !mfa_view_present(view.view)) {
        return mfa_set_error(MFA_ERROR_INTERNAL, "%s: the plan binds %s, which the call lacks",
                             device->backend, name);
    }
    if (view.view->buffer != NULL) return resolve_device_operand(call, binding, view.view, out);
    mfa_host_range range;
    range.operand = binding->operand;
    range.first = view.view->data + binding->byte_offset;
    range.length = (uint64_t)binding->byte_length;
    range.element_size = (size_t)view.element_size;
    range.writable = writable;
    range.data = view.view->data;
    memcpy(range.shape, view.shape, sizeof range.shape);
    memcpy(range.stride, view.view->stride, sizeof range.stride);
    return device->ops->wrap_host(device->self, &range, out);
}

/* One memory per operand for the whole call, so a later pass reads what an earlier one wrote
 * (delta) and a staged output has a single copy; writable if any pass writes it. */
static mfa_status resolve_memory(mfa_gpu_call* call) {
    const mfa_buffer_binding* first[MFA_OPERAND_COUNT] = {NULL};
    bool writable[MFA_OPERAND_COUNT] = {false};
    for (uint32_t i = 0; i < call->plan.num_passes; i++) {
        const mfa_pass_plan* pass = &call->plan.passes[i];
        if (!mfa_pass_has_work(pass)) continue;
        for (uint32_t j = 0; j < pass->num_bindings; j++) {
            const mfa_buffer_binding* binding = &pass->bindings[j];
            const mfa_buffer_binding* earlier = first[binding->operand];
            if (earlier != NULL && (earlier->byte_offset != binding->byte_offset ||
                                    earlier->byte_length != binding->byte_length)) {
                return mfa_set_error(MFA_ERROR_INTERNAL,
                                     "%s: passes bind different extents of operand %s",
                                     call->device->backend, mfa_operand_name(binding->operand));
            }
            if (earlier == NULL) first[binding->operand] = binding;
            writable[binding->operand] = writable[binding->operand] || binding->writable;
        }
    }
    for (mfa_operand operand = 0; operand < MFA_OPERAND_COUNT; operand++) {
        if (first[operand] == NULL) continue;
        mfa_status status =
            resolve_operand(call, first[operand], writable[operand], &call->memory[operand]);
        if (status != MFA_OK) return status;
        call->resolved |= 1u << operand;
    }
    return MFA_OK;
}

mfa_status mfa_gpu_call_prepare(mfa_gpu_call* call, const mfa_gpu_device* device,
                                const mfa_problem* problem, bool backward) {
    memset(call, 0, sizeof *call);
    call->device = device;
    call->problem = problem;
    call->what = backward ? "backward" : "forward";
    mfa_status status = plan_with_pipelines(call, backward);
    if (status == MFA_OK) status = resolve_memory(call);
    if (status != MFA_OK) mfa_gpu_call_finish(call, false);
    return status;
}

void mfa_gpu_call_encode(const mfa_gpu_call* call, void* commands) {
    const mfa_gpu_device* device = call->device;
    for (uint32_t i = 0; i < call->plan.num_passes; i++) {
        const mfa_pass_plan* pass = &call->plan.passes[i];
        if (!mfa_pass_has_work(pass)) continue;
        mfa_gpu_dispatch dispatch;
        dispatch.pass = pass;
        dispatch.pipeline = call->pipelines[i];
        dispatch.num_buffers = pass->num_bindings;
        for (uint32_t j = 0; j < pass->num_bindings; j++) {
            dispatch.buffers[j].index = pass->bindings[j].index;
            dispatch.buffers[j].memory = &call->memory[pass->bindings[j].operand];
        }
        device->ops->encode(device->self, commands, &dispatch);
    }
}

void mfa_gpu_call_finish(mfa_gpu_call* call, bool completed) {
    const mfa_gpu_device* device = call->device;
    for (mfa_operand operand = 0; operand < MFA_OPERAND_COUNT; operand++) {
        if (!(call->resolved & (1u << operand)) || call->memory[operand].owner == NULL) continue;
        device->ops->release(device->self, call->memory[operand].owner, completed);
        call->memory[operand].owner = NULL;
    }
    call->resolved = 0;
}

mfa_status mfa_gpu_run(const mfa_gpu_device* device, const mfa_problem* problem, bool backward) {
    mfa_gpu_call call;
    mfa_status status = mfa_gpu_call_prepare(&call, device, problem, backward);
    if (status != MFA_OK) return status;
    if (mfa_gpu_call_has_work(&call)) {
        void* commands = NULL;
        status = device->ops->begin(device->self, call.what, &commands);
        if (status == MFA_OK) {
            mfa_gpu_call_encode(&call, commands);
            status = device->ops->commit_and_wait(device->self, commands, call.what);
        }
    }
    mfa_gpu_call_finish(&call, status == MFA_OK);
    return status;
}

/* The heap call of mfa_gpu_encode, finished when its command buffer completes or is dropped. */
static void encoded_call_completed(void* arg, bool ran) {
    mfa_gpu_call* call = (mfa_gpu_call*)arg;
    mfa_gpu_call_finish(call, ran);
    free(call);
}

mfa_status mfa_gpu_encode(const mfa_gpu_device* device, void* command_buffer,
                          const mfa_problem* problem, bool backward) {
    const char* what = backward ? "backward" : "forward";
    if (device->ops->begin_encode == NULL || device->ops->end_encode == NULL) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "%s: %s cannot encode into a caller's command "
                             "buffer",
                             device->backend, device->name);
    }
    mfa_gpu_call* call = (mfa_gpu_call*)malloc(sizeof *call);
    if (call == NULL) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "%s: cannot allocate an encoded %s call",
                             device->backend, what);
    }
    mfa_status status = mfa_gpu_call_prepare(call, device, problem, backward);
    if (status != MFA_OK) {
        free(call);
        return status;
    }
    /* The problem belongs to the public call that is returning: the call must not keep it. */
    call->problem = NULL;
    if (!mfa_gpu_call_has_work(call)) {
        encoded_call_completed(call, true);
        return MFA_OK;
    }
    void* commands = NULL;
    status = device->ops->begin_encode(device->self, command_buffer, what, &commands);
    if (status == MFA_OK) {
        mfa_gpu_call_encode(call, commands);
        status = device->ops->end_encode(device->self, commands, encoded_call_completed, call);
    }
    if (status != MFA_OK) encoded_call_completed(call, false);
    return status;
}
