/*
 * Type-check stub: exactly the Foundation subset the Metal host uses, declared with the SDK's
 * signatures, ownership and nullability, so that clang can type-check the host under ARC on
 * machines without an Apple SDK. Never used to build. Every selector here is checked against
 * metal-cpp's published selector list by tests/metal_host/check_selectors.py.
 *
 * Keep one declaration per line: the selector check reads them line by line.
 */
#ifndef MFA_TYPECHECK_FOUNDATION_H
#define MFA_TYPECHECK_FOUNDATION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <CoreFoundation/CoreFoundation.h>

typedef long NSInteger;
typedef unsigned long NSUInteger;
typedef bool BOOL; /* arm64 */
#define YES __objc_yes
#define NO __objc_no
#define nil ((void *)0)

#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))

#pragma clang assume_nonnull begin

@protocol NSObject
- (BOOL)isEqual:(nullable id)object;
@end

__attribute__((objc_root_class))
@interface NSObject <NSObject>
+ (instancetype)alloc;
- (instancetype)init;
@end

typedef struct {
    unsigned long state;
    id __unsafe_unretained _Nullable * _Nullable itemsPtr;
    unsigned long * _Nullable mutationsPtr;
    unsigned long extra[5];
} NSFastEnumerationState;

@protocol NSFastEnumeration
- (NSUInteger)countByEnumeratingWithState:(NSFastEnumerationState *)state objects:(id __unsafe_unretained _Nullable [_Nonnull])buffer count:(NSUInteger)len;
@end

typedef NSUInteger NSStringEncoding;
enum { NSUTF8StringEncoding = 4 };

@interface NSString : NSObject
+ (nullable instancetype)stringWithCString:(const char *)cString encoding:(NSStringEncoding)enc;
@property (nullable, readonly) const char *UTF8String NS_RETURNS_INNER_POINTER;
- (BOOL)isEqualToString:(NSString *)aString;
@end

typedef NSString *NSErrorDomain;

@interface NSError : NSObject
@property (readonly, copy) NSErrorDomain domain;
@property (readonly) NSInteger code;
@property (readonly, copy) NSString *localizedDescription;
@end

@interface NSURL : NSObject
+ (NSURL *)fileURLWithPath:(NSString *)path;
@end

@interface NSArray<__covariant ObjectType> : NSObject <NSFastEnumeration>
+ (instancetype)arrayWithObjects:(const ObjectType _Nonnull [_Nonnull])objects count:(NSUInteger)cnt;
@property (readonly) NSUInteger count;
@end

@protocol NSLocking
- (void)lock;
- (void)unlock;
@end

@interface NSLock : NSObject <NSLocking>
@end

#pragma clang assume_nonnull end

#endif
