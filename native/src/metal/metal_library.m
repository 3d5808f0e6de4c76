// Kernel functions from mfa.metallib, or from the kernel source embedded in libmfa.
#import "metal_host.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metal/embedded_sources.h"

static MTLCompileOptions* runtime_compile_options(void) {
    MTLCompileOptions* options = [[MTLCompileOptions alloc] init];
    // bfloat needs MSL 3.1; the offline build uses -std=metal3.1 for the same reason.
    options.languageVersion = MTLLanguageVersion3_1;
    // Fast math, as `xcrun metal` defaults to: both paths must run the same arithmetic. The
    // kernels mask with a finite sentinel, never -inf, so fast math is safe for them.
    if (@available(macOS 15.0, *)) {
        options.mathMode = MTLMathModeFast;
    } else {
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
        options.fastMathEnabled = YES;
#pragma clang diagnostic pop
    }
    return options;
}

static BOOL library_has_function(id<MTLLibrary> library, NSString* name) {
    for (NSString* candidate in library.functionNames) {
        if ([candidate isEqualToString:name]) return YES;
    }
    return NO;
}

// <directory of libmfa>/mfa.metallib: the build and both installs (prefix and wheel) put the
// metallib beside the library, and dladdr on one of the library's own functions finds it
// wherever that is.
static BOOL metallib_beside_library(char* path, size_t size) {
    Dl_info info;
    if (dladdr((const void*)&mfa_metal_backend_ops, &info) == 0 || info.dli_fname == NULL)
        return NO;
    const char* slash = strrchr(info.dli_fname, '/');
    const int written = slash == NULL ? snprintf(path, size, "mfa.metallib")
                                      : snprintf(path, size, "%.*s/mfa.metallib",
                                                 (int)(slash - info.dli_fname), info.dli_fname);
    return written > 0 && (size_t)written < size;
}

@implementation LibMFAKernelLibrary {
    id<MTLDevice> _device;
    id<MTLLibrary> _precompiled;        // nil: no usable metallib
    char _precompiledOrigin[1024];      // its path, or why there is none (for messages)
    NSLock* _compileLock;               // guards the three fields below
    NSArray<id<MTLLibrary>>* _compiled; // one library per embedded source, once compiled
    mfa_status _compileStatus;          // MFA_OK until a compile has failed
    char _compileFailure[1024];         // that failure, repeated to every later caller
}

- (instancetype)initWithDevice:(id<MTLDevice>)device status:(mfa_status*)status {
    self = [super init];
    if (self == nil) {
        *status =
            mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal: cannot allocate the kernel library");
        return nil;
    }
    _device = device;
    _compileLock = [[NSLock alloc] init];
    _compileStatus = MFA_OK;

    const char* override = getenv("MFA_METALLIB");
    if (override != NULL && override[0] != '\0') {
        // An explicit choice that cannot be used is an error, never silently replaced.
        if (![self loadMetallib:override]) {
            *status = mfa_set_error(MFA_ERROR_BACKEND_UNAVAILABLE, "metal: MFA_METALLIB: %s",
                                    _precompiledOrigin);
            return nil;
        }
        return self;
    }
    char path[1024];
    if (!metallib_beside_library(path, sizeof path)) {
        snprintf(_precompiledOrigin, sizeof _precompiledOrigin,
                 "no mfa.metallib: dladdr cannot locate libmfa");
    } else {
        [self loadMetallib:path];
    }
    // Without a metallib every kernel comes from the embedded source; compiling it now makes a
    // broken installation fail at context creation rather than in the middle of a call.
    if (_precompiled == nil && ![self compileEmbeddedSourcesLocked:status]) return nil;
    return self;
}

// Sets _precompiled and _precompiledOrigin (the path, or why the file is unusable).
- (BOOL)loadMetallib:(const char*)path {
    NSString* string = [NSString stringWithCString:path encoding:NSUTF8StringEncoding];
    if (string == nil) {
        snprintf(_precompiledOrigin, sizeof _precompiledOrigin, "%s is not a UTF-8 path", path);
        return NO;
    }
    NSError* error = nil;
    id<MTLLibrary> library = [_device newLibraryWithURL:[NSURL fileURLWithPath:string]
                                                  error:&error];
    if (library == nil) {
        const char* reason = error != nil ? error.localizedDescription.UTF8String : NULL;
        snprintf(_precompiledOrigin, sizeof _precompiledOrigin, "%s did not load: %s", path,
                 reason != NULL ? reason : "Metal gave no reason");
        return NO;
    }
    NSString* stamp = [NSString stringWithCString:mfa_metal_source_stamp
                                         encoding:NSUTF8StringEncoding];
    if (stamp == nil || !library_has_function(library, stamp)) {
        snprintf(_precompiledOrigin, sizeof _precompiledOrigin,
                 "%s was built from other kernel sources than this libmfa (no %s)", path,
                 mfa_metal_source_stamp);
        return NO;
    }
    _precompiled = library;
    snprintf(_precompiledOrigin, sizeof _precompiledOrigin, "%s", path);
    return YES;
}

// Caller holds _compileLock, or is the initialiser (the object is not shared yet).
- (BOOL)compileEmbeddedSourcesLocked:(mfa_status*)status {
    if (_compiled != nil) return YES;
    if (_compileStatus == MFA_OK) [self compileEmbeddedSourcesOnce];
    if (_compiled != nil) return YES;
    *status = mfa_set_error(_compileStatus, "%s", _compileFailure);
    return NO;
}

- (void)compileEmbeddedSourcesOnce {
    const size_t count = mfa_metal_embedded_source_count;
    if (count == 0) {
        [self recordCompileFailure:"libmfa was built without embedded kernel source"];
        return;
    }
    MTLCompileOptions* options = runtime_compile_options();
    __strong id<MTLLibrary> libraries[count];
    for (size_t i = 0; i < count; i++) {
        const mfa_metal_embedded_source* source = &mfa_metal_embedded_sources[i];
        NSString* text = [NSString stringWithCString:source->text encoding:NSUTF8StringEncoding];
        if (text == nil) {
            char reason[256];
            snprintf(reason, sizeof reason, "the embedded %s is not UTF-8", source->name);
            [self recordCompileFailure:reason];
            return;
        }
        NSError* error = nil;
        libraries[i] = [_device newLibraryWithSource:text options:options error:&error];
        // A compile with warnings also returns an NSError: only a nil library is a failure.
        if (libraries[i] == nil) {
            char reason[768];
            const char* detail = error != nil ? error.localizedDescription.UTF8String : NULL;
            snprintf(reason, sizeof reason, "compiling the embedded %s failed: %s", source->name,
                     detail != NULL ? detail : "Metal gave no reason");
            [self recordCompileFailure:reason];
            return;
        }
    }
    _compiled = [NSArray arrayWithObjects:libraries count:count];
}

- (void)recordCompileFailure:(const char*)reason {
    _compileStatus = MFA_ERROR_BACKEND_UNAVAILABLE;
    snprintf(_compileFailure, sizeof _compileFailure, "metal: no kernels: %s, and %s",
             _precompiledOrigin, reason);
}

- (id<MTLFunction>)newFunctionNamed:(const char*)name
                          constants:(MTLFunctionConstantValues*)constants
                             status:(mfa_status*)status {
    NSString* functionName = [NSString stringWithCString:name encoding:NSUTF8StringEncoding];
    if (functionName == nil) {
        *status = mfa_set_error(MFA_ERROR_INTERNAL, "metal: kernel name %s is not UTF-8", name);
        return nil;
    }
    id<MTLLibrary> library = nil;
    if (_precompiled != nil && library_has_function(_precompiled, functionName)) {
        library = _precompiled;
    } else {
        [_compileLock lock];
        const BOOL compiled = [self compileEmbeddedSourcesLocked:status];
        NSArray<id<MTLLibrary>>* candidates = _compiled;
        [_compileLock unlock];
        if (!compiled) return nil;
        for (id<MTLLibrary> candidate in candidates) {
            if (library_has_function(candidate, functionName)) {
                library = candidate;
                break;
            }
        }
        if (library == nil) {
            *status = mfa_set_error(MFA_ERROR_INTERNAL,
                                    "metal: kernel %s is neither in the embedded kernel source "
                                    "nor in the metallib (%s)",
                                    name, _precompiledOrigin);
            return nil;
        }
    }
    NSError* error = nil;
    id<MTLFunction> function = [library newFunctionWithName:functionName
                                             constantValues:constants
                                                      error:&error];
    if (function == nil) {
        *status = mfa_metal_error(MFA_ERROR_INTERNAL, error, "metal: specialising kernel %s failed",
                                  name);
    }
    return function;
}

@end
