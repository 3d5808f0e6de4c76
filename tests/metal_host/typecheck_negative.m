// Mistakes the Linux type-check must reject, one per macro; without any macro this file is the
// control and must compile, so each failure is caused by its mistake alone.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

id<MTLLibrary> load(id<MTLDevice> device, NSURL* url);
id<MTLLibrary> load(id<MTLDevice> device, NSURL* url) {
    NSError* error = nil;
#if defined(MFA_NEGATIVE_MISSPELLED_SELECTOR)
    return [device newLibraryWithURL:url eror:&error];
#else
    return [device newLibraryWithURL:url error:&error];
#endif
}

void configure(MTLCompileOptions* options);
void configure(MTLCompileOptions* options) {
#if defined(MFA_NEGATIVE_UNGUARDED_AVAILABILITY)
    options.mathMode = MTLMathModeFast;
#else
    if (@available(macOS 15.0, *)) options.mathMode = MTLMathModeFast;
#endif
}

void finish(id<MTLCommandBuffer> commands);
void finish(id<MTLCommandBuffer> commands) {
    [commands waitUntilCompleted];
#if defined(MFA_NEGATIVE_ARC_RELEASE)
    [commands release];
#endif
}
