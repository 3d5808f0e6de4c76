/*
 * metal_host.h - the Objective-C side of the Metal backend, shared by its .m files only.
 *
 * The host is split by the Metal object each file owns, as ggml-metal splits its host:
 *   metal_context.m    device selection, limits, the command queue, GPU timing
 *   metal_library.m    where kernel functions come from: mfa.metallib or the embedded source
 *   metal_pipelines.m  the thread-safe pipeline cache
 *   metal_operands.m   caller memory as MTLBuffers (zero-copy or staged)
 *   metal_dispatch.m   a planner's plan turned into one command buffer, run and checked
 *   metal_backend.m    the C entry points of mfa_backend_ops
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
#include "planner/planner.h"

#pragma clang assume_nonnull begin

/* ---- Errors ------------------------------------------------------------------------------- */

/* Record "<printf message>: <Metal's description> (<domain> <code>)" for the calling thread and
 * return status. error may be nil when Metal gave none. */
mfa_status mfa_metal_error(mfa_status status, NSError* _Nullable error, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

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
@property (nonatomic, readonly) const char* deviceName;            /* owned by the context */
@property (nonatomic, readonly) uint32_t maxThreadsPerThreadgroup; /* device-wide bound */
@property (nonatomic, readonly) NSUInteger maxThreadgroupMemoryLength;
@property (nonatomic, readonly) NSUInteger maxBufferLength;
@property (nonatomic, readonly) LibMFAPipelineCache* pipelines;
/* Bound where a pass has nothing to bind (an operand without elements, an lse nobody asked
 * for): the kernel never touches it, but Metal wants every argument index bound. */
@property (nonatomic, readonly) id<MTLBuffer> placeholder;
/* Called once a command buffer has completed; keeps the most recent GPUEndTime - GPUStartTime. */
- (void)recordGPUStart:(CFTimeInterval)start end:(CFTimeInterval)end;
/* Seconds of GPU time of the most recently completed command buffer; NO before the first. */
- (BOOL)lastGPUTime:(double*)seconds;
@end

/* The first Apple7-or-later GPU, or nil. */
id<MTLDevice> _Nullable mfa_metal_select_device(void);

/* A context on the selected device; on failure the error is recorded and returned. */
mfa_status mfa_metal_context_create(LibMFAMetalContext* _Nullable __autoreleasing* _Nonnull out);

/* ---- Operands ------------------------------------------------------------------------------ */

/* One operand's memory as the kernels see it: `buffer` at `offset` holds the first byte of the
 * planner's binding. Caller memory is wrapped without a copy (the enclosing whole pages,
 * newBufferWithBytesNoCopy); when Metal cannot wrap it, or its elements are not naturally
 * aligned, it is staged through a shared buffer and, for outputs, copied back by
 * -copyResultsToCaller after the GPU has finished. */
@interface LibMFAOperandBuffer : NSObject
@property (nonatomic, readonly) id<MTLBuffer> buffer;
@property (nonatomic, readonly) NSUInteger offset;
@property (nonatomic, readonly) BOOL staged;
/* Copy a staged output's elements (and nothing between them) back to the caller's view. */
- (void)copyResultsToCaller;
@end

/* Map `binding` of `problem` to a buffer; `scratch` backs MFA_OPERAND_DELTA. nil with the error
 * recorded and *status set. */
LibMFAOperandBuffer* _Nullable mfa_metal_bind_operand(LibMFAMetalContext* context,
                                                      const mfa_problem* problem,
                                                      const mfa_buffer_binding* binding,
                                                      id<MTLBuffer> _Nullable scratch,
                                                      mfa_status* status);

/* ---- Dispatch ------------------------------------------------------------------------------ */

typedef mfa_status (*mfa_metal_planner)(const mfa_problem* problem, mfa_gpu_family family,
                                        uint32_t max_threads_per_threadgroup, mfa_plan* plan);

/* Plan `problem` with `planner`, run every pass in one command buffer, wait, check, record the
 * GPU time and copy staged outputs back. `what` names the call in messages ("forward"). */
mfa_status mfa_metal_run(LibMFAMetalContext* context, const mfa_problem* problem,
                         mfa_metal_planner planner, const char* what);

#pragma clang assume_nonnull end

#endif /* MFA_METAL_HOST_H */
