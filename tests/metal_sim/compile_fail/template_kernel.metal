// expect: template_kernel\.metal:6: error: kernel 'scaled': template kernels are not supported by metal-sim
#include <metal_stdlib>
using namespace metal;

// One `kernel void` per variant instead: metal-sim binds kernels by their plain names.
template <typename T>
kernel void scaled(device T* data [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    data[i] = data[i] * T(2);
}
