/*
 * metal_host.h - the Objective-C side of the Metal backend, shared by its .m files only.
 *
 * The host is the Metal device of the plan runner (planner/runner.h), which owns everything
 * between a plan and the encoder calls; what is left here is what needs Metal objects. It is
 * split by the Metal object each file owns, as ggml-metal splits its host:
 *   metal_context.m    device selection, limits, the command queue, GPU timing, and the
 *                      runner's view of the device (mfa_gpu_device)
 *   metal_library.m    where kernel functions come from: mfa.metallib or the embedded source
 *   metal_pipelines.m  the thread-safe pipeline cache; the runner's `pipeline`
 *   metal_operands.m   caller memory as MTLBuffers (zero-copy or staged) and the scratch; the
 *                      runner's `wrap_host`, `scratch` and `release`
 *   metal_commands.m   command buffers and compute encoders; the runner's `encode`, `begin`,
 *                      `commit_and_wait`, and for callers' MTLBuffers and command buffers
 *                      `device_buffer`, `begin_encode` and `end_encode`
 *   metal_backend.m    the C entry points of mfa_backend_ops and mfa_device_ops
 *   metal_errors.m     NSError and Metal failures as an mfa_status with a message
 *   metal_portable.c   the arithmetic that needs no Metal (tested on Linux): page spans,
 *                      staged copy-back, pipeline keys
 * Everything the rest of libmfa sees is mfa_metal_backend_ops() (core/backend.h).
 *
 * Compiled with ARC. Every object here is safe to share between threads once created: the
 * mutable parts (pipeline cache, lazily compiled source, timing) lock themselves.
 *
 * Objective-C class names are process-global, and "MFA" prefixes are already taken by other
 * FlashAttention-for-Metal libraries that may be loaded into the same Python process; the
 * classes here are therefore prefixed LibMFA.
 */
#ifndef MFA_METAL_HOST_H
#define MFA_METAL_HOST_H

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include "core/backend.h"
#include "planner/runner.h"

#pragma clang assume_nonnull begin

/* ---- Errors ------------------------------------------------------------------------------- */

/* Record "<printf message>: <Metal's description> (<domain> <code>)" for the calling thread and
 * return status. error may be nil when Metal gave none. */
mfa_status mfa_metal_error(mfa_status status, NSError* _Nullable error, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

/* MFA_OK while buffer has not been enqueued; otherwise INVALID_ARGUMENT: "<call>: the command
 * buffer was already committed (status ...)<advice>". */
mfa_status mfa_metal_require_not_enqueued(id<MTLCommandBuffer> buffer, const char* call,
                                          const char* advice);

/* ---- Kernel library ----------------------------------------------------------------------- */

/* Where kernel functions come from. mfa.metallib is loaded from $MFA_METALLIB when set (and
 * failing to load it is then an error), otherwise from beside libmfa. The kernel source
 * embedded in libmfa is compiled at run time for any function the metallib cannot provide:
 * at creation when there is no usable metallib, lazily when the metallib lacks a function. */
@interface LibMFAKernelLibrary : NSObject
/* nil with the error recorded and *status set when neither source of kernels is usable. */
- (nullable instancetype)initWithDevice:(id<MTLDevice>)device status:(mfa_status*)status;
/* The function `name` specialised with `constants`; nil with the error recorded. */
- (nullable id<MTLFunction>)newFunctionNamed:(const char*)name
                                   constants:(MTLFunctionConstantValues*)constants
                                      status:(mfa_status*)status;
@end

/* ---- Pipeline cache ------------------------------------------------------------------------ */

/* Compute pipelines keyed by kernel name plus every function-constant value. Lookups and
 * inserts take one lock; compiles run outside it, and a compile that loses a race to an
 * identical one keeps the pipeline already cached. */
@interface LibMFAPipelineCache : NSObject
- (instancetype)initWithDevice:(id<MTLDevice>)device kernels:(LibMFAKernelLibrary*)kernels;
/* The pipeline for a planned pass; nil with the error recorded and *status set. */
- (nullable id<MTLComputePipelineState>)pipelineForPass:(const mfa_pass_plan*)pass
                                                 status:(mfa_status*)status;
@end

/* ---- Context ------------------------------------------------------------------------------- */

/* Everything one mfa_context owns on the Metal side. */
@interface LibMFAMetalContext : NSObject
@property (nonatomic, readonly) id<MTLDevice> device;
@property (nonatomic, readonly) id<MTLCommandQueue> queue;
@property (nonatomic, readonly) mfa_gpu_family family;
@property (nonatomic, readonly) const char* deviceName; /* owned by the context */
@property (nonatomic, readonly) NSUInteger maxBufferLength;
@property (nonatomic, readonly) LibMFAPipelineCache* pipelines;
/* The context as the plan runner's device; owned by the context. */
@property (nonatomic, readonly) const mfa_gpu_device* gpuDevice;
/* Called once a command buffer has completed; keeps the most recent GPUEndTime - GPUStartTime. */
- (void)recordGPUStart:(CFTimeInterval)start end:(CFTimeInterval)end;
/* Seconds of GPU time of the most recently completed command buffer; NO, leaving *seconds
 * alone, before the first. */
- (BOOL)lastGPUTime:(double*)seconds;
@end

/* The first Apple7-or-later GPU, or nil. */
id<MTLDevice> _Nullable mfa_metal_select_device(void);

/* A context on the selected device; on failure the error is recorded and returned. */
mfa_status mfa_metal_context_create(LibMFAMetalContext* _Nullable __autoreleasing* _Nonnull out);

/* ---- The runner's device operations (mfa_gpu_device_ops) ----------------------------------- */
/* `device` is the LibMFAMetalContext, bridged. */

/* metal_pipelines.m: the cached pipeline of a pass. */
mfa_status mfa_metal_pipeline(void* device, const mfa_pass_plan* pass, mfa_gpu_pipeline* out);

/* metal_operands.m: caller memory wrapped without a copy (the enclosing whole pages,
 * newBufferWithBytesNoCopy) or, when Metal cannot wrap it or its elements are not naturally
 * aligned, staged through a shared buffer and, for outputs, copied back by release once the
 * commands completed; the scratch, private to the GPU; and their release. */
mfa_status mfa_metal_wrap_host(void* device, const mfa_host_range* range, mfa_gpu_memory* out);
mfa_status mfa_metal_scratch(void* device, uint64_t bytes, mfa_gpu_memory* out);
void mfa_metal_release(void* device, void* owner, bool completed);

/* metal_commands.m: the table of them all, with encode, begin, commit_and_wait, device_buffer
 * (a caller's MTLBuffer bound in place), begin_encode and end_encode (a caller's command
 * buffer). */
extern const mfa_gpu_device_ops mfa_metal_device_ops;

#pragma clang assume_nonnull end

#endif /* MFA_METAL_HOST_H */
