/*
 * Type-check stub: exactly the Metal subset the host uses, declared with the SDK's signatures,
 * ownership, nullability, availability and deprecations (macOS), so that clang can type-check
 * the host under ARC on machines without an Apple SDK. Never used to build. Selectors and
 * enum values are checked against metal-cpp by tests/metal_host/check_selectors.py.
 *
 * Keep one declaration per line: the selector check reads them line by line.
 */
#ifndef MFA_TYPECHECK_METAL_H
#define MFA_TYPECHECK_METAL_H

#import <Foundation/Foundation.h>

#define MFA_STUB_MACOS(v) __attribute__((availability(macos, introduced = v)))
#define MFA_STUB_MACOS_DEPRECATED(v, d) __attribute__((availability(macos, introduced = v, deprecated = d)))

#pragma clang assume_nonnull begin

/* ---- Types ---------------------------------------------------------------------------------- */

typedef struct {
    NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
    MTLSize size = {width, height, depth};
    return size;
}

typedef enum MTLGPUFamily : NSInteger {
    MTLGPUFamilyApple7 = 1007,
    MTLGPUFamilyApple8 MFA_STUB_MACOS(13.0) = 1008,
    MTLGPUFamilyApple9 MFA_STUB_MACOS(14.0) = 1009,
} MTLGPUFamily;

typedef enum MTLLanguageVersion : NSUInteger {
    MTLLanguageVersion3_1 MFA_STUB_MACOS(14.0) = (3 << 16) + 1,
} MTLLanguageVersion;

typedef enum MTLMathMode : NSInteger {
    MTLMathModeSafe = 0,
    MTLMathModeRelaxed = 1,
    MTLMathModeFast = 2,
} MTLMathMode MFA_STUB_MACOS(15.0);

typedef enum MTLDataType : NSUInteger {
    MTLDataTypeUInt = 33,
    MTLDataTypeBool = 53,
} MTLDataType;

typedef enum MTLResourceOptions : NSUInteger {
    MTLResourceStorageModeShared = 0,
    MTLResourceStorageModePrivate = 2 << 4,
} MTLResourceOptions;

typedef enum MTLCommandBufferStatus : NSUInteger {
    MTLCommandBufferStatusNotEnqueued = 0,
    MTLCommandBufferStatusEnqueued = 1,
    MTLCommandBufferStatusCommitted = 2,
    MTLCommandBufferStatusScheduled = 3,
    MTLCommandBufferStatusCompleted = 4,
    MTLCommandBufferStatusError = 5,
} MTLCommandBufferStatus;

typedef enum MTLCommandBufferError : NSUInteger {
    MTLCommandBufferErrorOutOfMemory = 8,
} MTLCommandBufferError;

/* ---- Objects -------------------------------------------------------------------------------- */

@protocol MTLDevice;

@protocol MTLResource <NSObject>
@end

@protocol MTLBuffer <MTLResource>
@property (readonly) NSUInteger length;
- (void *)contents NS_RETURNS_INNER_POINTER;
@end

@protocol MTLFunction <NSObject>
@end

@interface MTLFunctionConstantValues : NSObject
- (void)setConstantValue:(const void *)value type:(MTLDataType)type atIndex:(NSUInteger)index;
@end

@interface MTLCompileOptions : NSObject
@property (readwrite, nonatomic) BOOL fastMathEnabled MFA_STUB_MACOS_DEPRECATED(10.11, 15.0);
@property (readwrite, nonatomic) MTLMathMode mathMode MFA_STUB_MACOS(15.0);
@property (readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLLibrary <NSObject>
@property (readonly) NSArray<NSString *> *functionNames;
- (nullable id<MTLFunction>)newFunctionWithName:(NSString *)name constantValues:(MTLFunctionConstantValues *)constantValues error:(__autoreleasing NSError **)error;
@end

@protocol MTLComputePipelineState <NSObject>
@property (readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property (readonly) NSUInteger threadExecutionWidth;
@property (readonly) NSUInteger staticThreadgroupMemoryLength;
@end

@protocol MTLCommandEncoder <NSObject>
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLCommandBuffer;
typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer> buffer);

@protocol MTLCommandBuffer <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) MTLCommandBufferStatus status;
@property (nullable, readonly) NSError *error;
@property (readonly) CFTimeInterval GPUStartTime;
@property (readonly) CFTimeInterval GPUEndTime;
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
- (void)commit;
- (void)waitUntilCompleted;
@end

@protocol MTLCommandQueue <NSObject>
- (nullable id<MTLCommandBuffer>)commandBuffer;
@end

@protocol MTLDevice <NSObject>
@property (readonly) NSString *name;
@property (readonly) NSUInteger maxThreadgroupMemoryLength;
@property (readonly) MTLSize maxThreadsPerThreadgroup;
@property (readonly) NSUInteger maxBufferLength;
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
- (nullable id<MTLCommandQueue>)newCommandQueue;
- (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (nullable id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer length:(NSUInteger)length options:(MTLResourceOptions)options deallocator:(void (^_Nullable)(void *pointer, NSUInteger length))deallocator;
- (nullable id<MTLLibrary>)newLibraryWithURL:(NSURL *)url error:(__autoreleasing NSError **)error;
- (nullable id<MTLLibrary>)newLibraryWithSource:(NSString *)source options:(nullable MTLCompileOptions *)options error:(__autoreleasing NSError **)error;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction error:(__autoreleasing NSError **)error;
@end

/* ---- Functions ------------------------------------------------------------------------------ */

extern id<MTLDevice> _Nullable MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;
extern NSArray<id<MTLDevice>> *MTLCopyAllDevices(void) NS_RETURNS_RETAINED;

#pragma clang assume_nonnull end

#endif
