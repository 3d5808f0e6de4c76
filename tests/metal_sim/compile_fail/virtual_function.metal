// expect: poisoned identifier.*virtual float
#include <metal_stdlib>
using namespace metal;

struct Shape {
    virtual float area() const { return 0.0f; }
};

kernel void virtual_function(device float* out [[buffer(0)]]) { out[0] = Shape().area(); }
