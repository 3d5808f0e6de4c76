// simdgroup_matrix: Apple's lane layout, loads and stores with stride/origin/transpose, and the
// products against a plain matrix product.
#include "sim_test.h"

namespace {

using sim_test::bind;

// The lane holding element (row, column) and the element's index in it: the inverse form of
// the layout in reference/mfa.md section 3 (the simulator implements the forward form).
int owner_lane(int row, int column) {
    return (row / 4) * 16 + (column / 4) * 8 + (row % 4) * 2 + (column % 4) / 2;
}
int owner_index(int column) { return column % 2; }

void test_lane_layout() {
    std::vector<float> matrix(64), elements(64, -1.0f);
    for (int i = 0; i < 64; ++i) matrix[i] = (float)i; // element (r, c) = 8r + c
    auto d = sim_test::one_group("matrix_lane_layout", 32);
    d.buffers[0] = bind(matrix);
    d.buffers[1] = bind(elements);
    if (!sim_test::run(d)) return;
    for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c)
            CHECK(elements[owner_lane(r, c) * 2 + owner_index(c)] == (float)(8 * r + c),
                  "element (%d, %d) is not in lane %d", r, c, owner_lane(r, c));
    // Spot checks straight from the table in the reference.
    CHECK(elements[1 * 2 + 0] == 2.0f);   // lane 1 holds row 0, columns 2-3
    CHECK(elements[8 * 2 + 0] == 4.0f);   // lane 8 holds row 0, columns 4-5
    CHECK(elements[16 * 2 + 0] == 32.0f); // lane 16 holds row 4, columns 0-1
    CHECK(elements[31 * 2 + 1] == 63.0f); // lane 31 holds row 7, columns 6-7

    std::vector<float> tagged(64, -1.0f);
    auto t = sim_test::one_group("matrix_lane_tags", 32);
    t.buffers[0] = bind(tagged);
    if (!sim_test::run(t)) return;
    for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c)
            CHECK(tagged[8 * r + c] == (float)(owner_lane(r, c) * 2 + owner_index(c)));
}

struct TransferParams {
    uint32_t load_stride, load_origin_x, load_origin_y, load_transpose;
    uint32_t store_stride, store_origin_x, store_origin_y, store_transpose;
};

void test_transfer(const TransferParams& p) {
    const uint32_t rows = 20, columns = 24; // both source and destination are 20 x 24
    std::vector<float> source(rows * columns), destination(rows * columns, -1.0f);
    for (size_t i = 0; i < source.size(); ++i) source[i] = (float)i;
    TransferParams params = p;
    auto d = sim_test::one_group("matrix_transfer", 32);
    d.buffers[0] = bind(source);
    d.buffers[1] = bind(destination);
    d.buffers[2] = sim_test::bind_value(params);
    d.threadgroup_memory_lengths[0] = 64 * sizeof(float);
    if (!sim_test::run(d)) return;
    // Logical tile element (r, c): where it is read from and written to.
    std::vector<float> expected(rows * columns, -1.0f);
    for (uint32_t r = 0; r < 8; ++r) {
        for (uint32_t c = 0; c < 8; ++c) {
            const size_t from =
                p.load_transpose
                    ? (size_t)(p.load_origin_x + c) * p.load_stride + p.load_origin_y + r
                    : (size_t)(p.load_origin_y + r) * p.load_stride + p.load_origin_x + c;
            const size_t to =
                p.store_transpose
                    ? (size_t)(p.store_origin_x + c) * p.store_stride + p.store_origin_y + r
                    : (size_t)(p.store_origin_y + r) * p.store_stride + p.store_origin_x + c;
            expected[to] = source[from];
        }
    }
    for (size_t i = 0; i < expected.size(); ++i)
        CHECK(destination[i] == expected[i],
              "transfer (stride %u, origin %u,%u, transpose %u) -> (stride %u, origin %u,%u, "
              "transpose %u): element %zu is %g, expected %g",
              p.load_stride, p.load_origin_x, p.load_origin_y, p.load_transpose, p.store_stride,
              p.store_origin_x, p.store_origin_y, p.store_transpose, i, destination[i],
              expected[i]);
}

// Plain products in double.
void reference_products(const std::vector<float>& a, const std::vector<float>& b,
                        const std::vector<float>& c, std::vector<double>* d,
                        std::vector<double>* e) {
    d->assign(64, 0.0);
    e->assign(64, 0.0);
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) {
            double sum = 0;
            for (int k = 0; k < 8; ++k) sum += (double)a[i * 8 + k] * b[k * 8 + j];
            (*e)[i * 8 + j] = sum;
            (*d)[i * 8 + j] = sum + c[i * 8 + j];
        }
}

template <class Store>
void test_products(const char* kernel, double tolerance, Store to_memory,
                   float (*from_memory)(typename Store::result_type)) {
    std::vector<float> a(64), b(64), c(64);
    for (int i = 0; i < 64; ++i) {
        a[i] = (float)((i * 37) % 17 - 8) / 4.0f;
        b[i] = (float)((i * 11) % 13 - 6) / 2.0f;
        c[i] = (float)((i * 5) % 7 - 3);
    }
    typedef typename Store::result_type T;
    std::vector<T> A(64), B(64), C(64), D(64), E(64);
    for (int i = 0; i < 64; ++i) {
        A[i] = to_memory(a[i]);
        B[i] = to_memory(b[i]);
        C[i] = to_memory(c[i]);
    }
    auto d = sim_test::one_group(kernel, 32);
    d.buffers[0] = bind(A);
    d.buffers[1] = bind(B);
    d.buffers[2] = bind(C);
    d.buffers[3] = bind(D);
    d.buffers[4] = bind(E);
    if (!sim_test::run(d)) return;
    std::vector<double> expected_d, expected_e;
    reference_products(a, b, c, &expected_d, &expected_e); // inputs are exact in every type
    for (int i = 0; i < 64; ++i) {
        CHECK(std::fabs(from_memory(D[i]) - expected_d[i]) <=
                  tolerance * (1 + std::fabs(expected_d[i])),
              "%s: d[%d] = %g, expected %g", kernel, i, from_memory(D[i]), expected_d[i]);
        CHECK(std::fabs(from_memory(E[i]) - expected_e[i]) <=
                  tolerance * (1 + std::fabs(expected_e[i])),
              "%s: e[%d] = %g, expected %g", kernel, i, from_memory(E[i]), expected_e[i]);
    }
}

struct FloatStore {
    typedef float result_type;
    float operator()(float x) const { return x; }
};
struct HalfStore {
    typedef uint16_t result_type;
    uint16_t operator()(float x) const { return sim_test::reference_half(x); }
};
struct BfloatStore {
    typedef uint16_t result_type;
    uint16_t operator()(float x) const { return sim_test::reference_bfloat(x); }
};
float float_value(float x) { return x; }
float half_value(uint16_t h) { return (float)sim_test::decode_half(h); }
float bfloat_value(uint16_t b) { return (float)sim_test::decode_bfloat(b); }

void test_mixed_accumulate() {
    std::vector<uint16_t> a(64), b(64);
    std::vector<float> af(64), bf(64), c(64), zero(64, 0.0f);
    for (int i = 0; i < 64; ++i) {
        af[i] = (float)(i % 9 - 4) * 0.25f;
        bf[i] = (float)(i % 5 - 2);
        a[i] = sim_test::reference_half(af[i]);
        b[i] = sim_test::reference_half(bf[i]);
        c[i] = (float)i;
    }
    std::vector<double> ab, unused;
    reference_products(af, bf, zero, &unused, &ab);
    std::vector<float> initial = c;
    auto d = sim_test::one_group("matrix_mixed_accumulate", 32);
    d.buffers[0] = bind(a);
    d.buffers[1] = bind(b);
    d.buffers[2] = bind(c);
    if (!sim_test::run(d)) return;
    for (int i = 0; i < 64; ++i)
        CHECK(std::fabs(c[i] - (initial[i] + 2 * ab[i])) <= 1e-5,
              "mixed accumulate [%d] = %g, expected %g", i, c[i], initial[i] + 2 * ab[i]);
}

void test_constructors() {
    std::vector<float> diagonal(64, -1.0f), filled(64, -1.0f);
    auto d = sim_test::one_group("matrix_constructors", 32);
    d.buffers[0] = bind(diagonal);
    d.buffers[1] = bind(filled);
    if (!sim_test::run(d)) return;
    for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c) {
            CHECK(diagonal[r * 8 + c] == (r == c ? 2.0f : 0.0f));
            CHECK(filled[r * 8 + c] == 3.0f);
        }
}

} // namespace

int main() {
    test_lane_layout();
    test_transfer({24, 0, 0, 0, 24, 0, 0, 0});
    test_transfer({24, 5, 3, 0, 24, 16, 12, 0}); // origins, row-major both ways
    test_transfer({20, 2, 7, 1, 24, 1, 9, 0});   // transposed load
    test_transfer({24, 3, 1, 0, 20, 4, 10, 1});  // transposed store
    test_transfer({13, 1, 2, 1, 17, 6, 3, 1});   // odd strides, both transposed
    test_products("matrix_products_float", 1e-6, FloatStore(), float_value);
    test_products("matrix_products_half", 1e-3, HalfStore(), half_value);
    test_products("matrix_products_bfloat", 8e-3, BfloatStore(), bfloat_value);
    test_mixed_accumulate();
    test_constructors();
    return test_finish("sim_simdgroup_matrix");
}
