// wmma_emulation.h: nvcuda::wmma (mma.h) for the emulator, as a reference implementation.
//
// The operations Panamera's tensor-core kernels use (codegen/wmma_kernel.py): fragment, fill_fragment,
// load_matrix_sync, mma_sync, store_matrix_sync, for the shapes m16n16k16 with
// __half / __nv_bfloat16 operands and float accumulators, and signed char operands with int
// accumulators. A fragment's layout across the lanes of a warp is unspecified by CUDA; here every
// lane holds the whole tile (row-major, logical indices), and the fragment has no `x` or
// `num_elements` members, so code that indexed fragment elements (a layout-dependent access)
// does not compile against the emulator. Every lane performs the whole warp-wide operation on its
// own copy: the results are the same on every lane, and what one warp stores is visible to the
// others only after a barrier, as on the GPU (the fibers switch at barriers only).
//
// Arithmetic: products of 16-bit floats are exact in float; mma_sync accumulates them into the
// accumulator in float, k ascending, with one rounding per step (fmaf). Tensor cores add the
// products of one k step with wider internal precision, so they are at least as accurate as this
// chain; the tests derive their tolerances from it. s8 products accumulate exactly in int32,
// wrapping on overflow as mma.sync without .satfinite does.
// Alignment, as the CUDA Programming Guide requires of load/store_matrix_sync: the pointer 256-bit
// aligned, ldm a multiple of 16 bytes (8 half elements, 16 s8, 4 float or int); else the launch
// fails with the reason.
#pragma once

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> { static const int rows = M, cols = K; };
template <int M, int N, int K> struct dims<matrix_b, M, N, K> { static const int rows = K, cols = N; };
template <int M, int N, int K> struct dims<accumulator, M, N, K> { static const int rows = M, cols = N; };
static inline float to_float(__half h) { return __half2float(h); }
static inline float to_float(__nv_bfloat16 b) { return __bfloat162float(b); }
static inline float to_float(float f) { return f; }
template <class T> static inline void check(const void* p, unsigned ldm, const char* op) {
  using namespace pn_emu;
  if (error) return;
  if ((uintptr_t)p % 32 != 0) {
    std::snprintf(error_text, sizeof error_text, "%s: pointer %p is not 256-bit aligned (wmma requires it)", op, p);
    error = error_text;
  } else if ((ldm * sizeof(T)) % 16 != 0) {
    std::snprintf(error_text, sizeof error_text, "%s: ldm %u is not a multiple of 16 bytes (wmma requires it)", op, ldm);
    error = error_text;
  }
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator implements wmma's m16n16k16 shape only");
  static const int rows = detail::dims<Use, M, N, K>::rows, cols = detail::dims<Use, M, N, K>::cols;
  T v[rows * cols];  // logical (row, col), row-major: the emulator's own layout (not `x`)
};

template <class Use, int M, int N, int K, class T, class L, class V>
static inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& value) {
  for (int e = 0; e < f.rows * f.cols; ++e) f.v[e] = (T)value;
}

// matrix_a / matrix_b: the layout is the fragment's type
template <class Use, int M, int N, int K, class T, class L>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
  detail::check<T>(p, ldm, "load_matrix_sync");
  const bool row = __is_same(L, row_major);
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c) f.v[r * f.cols + c] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

// accumulator: the layout is an argument
template <int M, int N, int K, class T>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t l) {
  detail::check<T>(p, ldm, "load_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) f.v[r * N + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

template <int M, int N, int K, class T>
static inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t l) {
  detail::check<T>(p, ldm, "store_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) (l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.v[r * N + c];
}

// d = a b + c, 16-bit float operands, float accumulators
template <int M, int N, int K, class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
                            const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int r = 0; r < M; ++r)
    for (int n = 0; n < N; ++n) {
      float acc = c.v[r * N + n];
      for (int k = 0; k < K; ++k) acc = std::fmaf(detail::to_float(a.v[r * K + k]), detail::to_float(b.v[k * N + n]), acc);
      out[r * N + n] = acc;
    }
  std::memcpy(d.v, out, sizeof out);
}

// d = a b + c, s8 operands, int accumulators (exact, wrapping)
template <int M, int N, int K, class LA, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, int>& d, const fragment<matrix_a, M, N, K, signed char, LA>& a,
                            const fragment<matrix_b, M, N, K, signed char, LB>& b, const fragment<accumulator, M, N, K, int>& c) {
  int out[M * N];
  for (int r = 0; r < M; ++r)
    for (int n = 0; n < N; ++n) {
      uint32_t acc = (uint32_t)c.v[r * N + n];
      for (int k = 0; k < K; ++k) acc += (uint32_t)((int)a.v[r * K + k] * (int)b.v[k * N + n]);
      out[r * N + n] = (int)acc;
    }
  std::memcpy(d.v, out, sizeof out);
}
}  // namespace wmma
}  // namespace nvcuda
