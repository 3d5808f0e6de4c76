// Runs metal/lane_layout_probe.metal on the GPU and checks that the simdgroup_matrix lane
// layout the kernels assume (metal/attention/fragment.h) is the device's. The MSL spec leaves
// that layout unspecified, so this runs wherever an Apple7+ GPU is present, against the
// kernel as libmfa gets it both ways: compiled from the embedded source and, when given, from
// mfa.metallib.
//
//   lane_layout_probe [--metallib <mfa.metallib>]
//
// Exit status: 0 all layouts match, 1 a mismatch or a Metal failure, 77 no Apple7+ GPU (skip).
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <stdio.h>
#include <string.h>

#include "metal/embedded_sources.h"

enum { SKIP = 77, MATRIX_FLOATS = 64, OUT_FLOATS = 256 };

static id<MTLLibrary> _Nullable library_from_embedded_source(id<MTLDevice> device) {
    for (size_t i = 0; i < mfa_metal_embedded_source_count; i++) {
        const mfa_metal_embedded_source* source = &mfa_metal_embedded_sources[i];
        if (strcmp(source->name, "lane_layout_probe.metal") != 0) continue;
        NSString* text = [NSString stringWithCString:source->text encoding:NSUTF8StringEncoding];
        MTLCompileOptions* options = [[MTLCompileOptions alloc] init];
        options.languageVersion = MTLLanguageVersion3_1;
        NSError* error = nil;
        id<MTLLibrary> library =
            text == nil ? nil : [device newLibraryWithSource:text options:options error:&error];
        if (library == nil) {
            printf("compiling the embedded lane_layout_probe.metal failed: %s\n",
                   error != nil ? error.localizedDescription.UTF8String : "not UTF-8");
        }
        return library;
    }
    printf("lane_layout_probe.metal is not among the embedded kernel sources\n");
    return nil;
}

static id<MTLLibrary> _Nullable library_from_metallib(id<MTLDevice> device, const char* path) {
    NSString* file = [NSString stringWithCString:path encoding:NSUTF8StringEncoding];
    NSError* error = nil;
    id<MTLLibrary> library =
        file == nil ? nil : [device newLibraryWithURL:[NSURL fileURLWithPath:file] error:&error];
    if (library == nil)
        printf("loading %s failed: %s\n", path, error.localizedDescription.UTF8String);
    return library;
}

// Runs the probe once; fills out[OUT_FLOATS]. Returns NO after printing why on a Metal failure.
static BOOL run_probe(id<MTLDevice> device, id<MTLLibrary> library, float* out) {
    NSError* error = nil;
    MTLFunctionConstantValues* none = [[MTLFunctionConstantValues alloc] init];
    NSString* name = [NSString stringWithCString:"kernel_lane_layout_probe"
                                        encoding:NSUTF8StringEncoding];
    id<MTLFunction> function = [library newFunctionWithName:name constantValues:none error:&error];
    id<MTLComputePipelineState> pipeline =
        function == nil ? nil : [device newComputePipelineStateWithFunction:function error:&error];
    id<MTLBuffer> matrix = [device newBufferWithLength:MATRIX_FLOATS * sizeof(float)
                                               options:MTLResourceStorageModeShared];
    id<MTLBuffer> result = [device newBufferWithLength:OUT_FLOATS * sizeof(float)
                                               options:MTLResourceStorageModeShared];
    id<MTLCommandQueue> queue = [device newCommandQueue];
    id<MTLCommandBuffer> commands = [queue commandBuffer];
    id<MTLComputeCommandEncoder> encoder = [commands computeCommandEncoder];
    if (pipeline == nil || matrix == nil || result == nil || encoder == nil) {
        printf("setting up the probe failed: %s\n",
               error != nil ? error.localizedDescription.UTF8String : "a Metal object was nil");
        return NO;
    }
    // Element (r, c) holds r * 8 + c, so every value read back names the position it came from.
    float* values = (float*)matrix.contents;
    for (int i = 0; i < MATRIX_FLOATS; i++) values[i] = (float)i;
    [encoder setComputePipelineState:pipeline];
    [encoder setBuffer:matrix offset:0 atIndex:0];
    [encoder setBuffer:result offset:0 atIndex:1];
    [encoder dispatchThreadgroups:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
    [encoder endEncoding];
    [commands commit];
    [commands waitUntilCompleted];
    if (commands.status != MTLCommandBufferStatusCompleted) {
        printf("the probe failed on the GPU: %s\n",
               commands.error != nil ? commands.error.localizedDescription.UTF8String
                                     : "no detail");
        return NO;
    }
    memcpy(out, result.contents, OUT_FLOATS * sizeof(float));
    return YES;
}

// Sections of out (see the probe): [0,64) loaded, [64,128) fragment.h's positions,
// [128,192) a store of lane-written values, [192,256) a transposed load.
static int count_mismatches(const float* out) {
    int mismatches = 0;
    int covered[MATRIX_FLOATS] = {0};
    for (int lane = 0; lane < 32; lane++) {
        for (int e = 0; e < 2; e++) {
            const int slot = 2 * lane + e;
            const int position = (int)out[64 + slot]; // row * 8 + col + e per fragment.h
            if (position < 0 || position >= MATRIX_FLOATS) {
                printf("lane %d element %d: fragment.h position %d is outside 8x8\n", lane, e,
                       position);
                mismatches++;
                continue;
            }
            covered[position]++;
            if (out[slot] != (float)position) {
                printf("lane %d element %d: load gave (%d,%d), fragment.h says (%d,%d)\n", lane, e,
                       (int)out[slot] / 8, (int)out[slot] % 8, position / 8, position % 8);
                mismatches++;
            }
            if (out[128 + position] != (float)slot) {
                printf("lane %d element %d: store put it at %d, fragment.h says (%d,%d)\n", lane, e,
                       (int)out[128 + position], position / 8, position % 8);
                mismatches++;
            }
            const float transposed = (float)((position % 8) * 8 + position / 8);
            if (out[192 + slot] != transposed) {
                printf("lane %d element %d: transposed load gave %g, expected %g\n", lane, e,
                       (double)out[192 + slot], (double)transposed);
                mismatches++;
            }
        }
    }
    for (int position = 0; position < MATRIX_FLOATS; position++) {
        if (covered[position] != 1) {
            printf("fragment.h maps %d lanes to (%d,%d); a layout covers each element once\n",
                   covered[position], position / 8, position % 8);
            mismatches++;
        }
    }
    return mismatches;
}

int main(int argc, char** argv) {
    @autoreleasepool {
        const char* metallib = NULL;
        if (argc == 3 && strcmp(argv[1], "--metallib") == 0) {
            metallib = argv[2];
        } else if (argc != 1) {
            printf("usage: %s [--metallib <mfa.metallib>]\n", argv[0]);
            return 1;
        }
        id<MTLDevice> device = MTLCreateSystemDefaultDevice();
        if (device == nil || ![device supportsFamily:MTLGPUFamilyApple7]) {
            printf("skipped: no Apple7 or later GPU\n");
            return SKIP;
        }
        int failures = 0;
        const char* origins[2] = {"embedded source", metallib};
        for (int i = 0; i < 2; i++) {
            if (origins[i] == NULL) continue;
            id<MTLLibrary> library = i == 0 ? library_from_embedded_source(device)
                                            : library_from_metallib(device, origins[i]);
            float out[OUT_FLOATS];
            if (library == nil || !run_probe(device, library, out)) {
                failures++;
                continue;
            }
            const int mismatches = count_mismatches(out);
            printf("%s: %s (%d mismatches)\n", origins[i],
                   mismatches == 0 ? "layout matches" : "LAYOUT DIFFERS", mismatches);
            failures += mismatches != 0;
        }
        return failures == 0 ? 0 : 1;
    }
}
