"""Device functions every generated kernel includes: the lowering of the reduction algebra.

The functors (pn_op_*) and the native atomic merges are generated from `algebra.COMBINERS`, the
one definition of each reduction; the block routines implement the three levels of a Panamera
reduction: registers (in the kernel's loop), warp shuffles, shared memory; the atomics merge one
partial per block per output. NaN propagates through max/min as in numpy.

>>> print(functor_source(algebra.SUM))
struct pn_op_sum {
  template <class T> static __device__ __forceinline__ T apply(T a, T b) {
    return a + b;
  }
  template <class T> static __device__ __forceinline__ T identity() {
    return (T)0;
  }
};
"""

import re

from .. import algebra, dtypes

_TEMPLATE = r"""
#ifdef PANAMERA_EMULATOR
#include "cuda_emulation.h"
#else
// A vector load of sizeof(V) bytes from an address aligned to sizeof(V): a misaligned one is the
// sticky cudaErrorMisalignedAddress (the emulator's pn_vload fails the launch instead).
template <class V, class T> __device__ __forceinline__ V pn_vload(const T* p) { return *reinterpret_cast<const V*>(p); }
template <class V, class T> __device__ __forceinline__ void pn_vstore(T* p, V v) { *reinterpret_cast<V*>(p) = v; }
// Polls a counter other blocks raise until it reaches `target`: a volatile load (L2, never a
// stale L1 line nor a value hoisted out of the loop), backing off between polls.
__device__ __forceinline__ void pn_grid_wait(const unsigned* counter, unsigned target) {
  while (*reinterpret_cast<const volatile unsigned*>(counter) < target) __nanosleep(64);
}
// Drops one 128-byte L2 line without writing it back (discard.global.L2, sm_80+): a split's partials
// once the last block has read them; reads see an indeterminate value until the line is written again.
__device__ __forceinline__ void pn_discard_l2(void* p) { asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory"); }
// Shared memory that holds a value across a grid-wide wait or a cluster barrier (rows kept on
// chip, a cluster's partials): the emulator gives each block its own instance of it.
#define PN_BLOCK_SHARED(T, name, dims) __shared__ __align__(16) T name dims
// The block's dynamic shared memory (schedule/dynsmem.py): the bytes the launch passes, carved by
// the kernel at 16-byte offsets; the emulator gives each block its own.
#define PN_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
// A thread-block cluster's shape (sm_90); compiled for an older GPU the kernel only traps.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define PN_CLUSTER_DIMS(x, y, z)
#else
#define PN_CLUSTER_DIMS(x, y, z) __cluster_dims__(x, y, z)
#endif
#endif
// The whole 128-byte lines of [begin, end) dropped from L2 without a write-back (pn_discard_l2), by
// `threads` threads from `tid`: a split's workspace once every thread that reads it has (a barrier).
__device__ __forceinline__ void pn_discard_range(const void* begin, const void* end, int tid, int threads) {
  const unsigned long long z = (unsigned long long)end;
  for (unsigned long long l = (((unsigned long long)begin + 127) & ~127ull) + 128ull * tid; l + 128 <= z;
       l += 128ull * threads)
    pn_discard_l2((void*)l);
}
#define PN_INF_F __int_as_float(0x7f800000)
#define PN_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define PN_NAN_F __int_as_float(0x7fc00000)
#define PN_NAN_D __longlong_as_double(0x7ff8000000000000LL)

template <class T> struct pn_lim;
template <> struct pn_lim<float> {
  static __device__ __forceinline__ float lowest() { return -PN_INF_F; }
  static __device__ __forceinline__ float highest() { return PN_INF_F; }
};
template <> struct pn_lim<double> {
  static __device__ __forceinline__ double lowest() { return -PN_INF_D; }
  static __device__ __forceinline__ double highest() { return PN_INF_D; }
};
template <> struct pn_lim<int> {
  static __device__ __forceinline__ int lowest() { return (int)0x80000000; }
  static __device__ __forceinline__ int highest() { return 0x7fffffff; }
};
template <> struct pn_lim<long long> {
  static __device__ __forceinline__ long long lowest() { return (long long)0x8000000000000000ULL; }
  static __device__ __forceinline__ long long highest() { return 0x7fffffffffffffffLL; }
};

// Welford's accumulator and Chan et al.'s pairwise merge: one pass, numerically stable. The
// conversion from T is the accumulation of one element; the default constructor stays trivial
// so that the accumulator can live in __shared__ memory.
template <class T> struct pn_welford {
  T shift, mean, m2, n;  // mean: of x - shift; shift: the first element seen (algebra.WELFORD)
  pn_welford() = default;
  // x - x is 0 for a finite x and NaN for inf or NaN: a non-finite element is its own (unshifted)
  // mean and makes M2, so the variance, NaN as in numpy (algebra._welford_lift).
  __device__ __forceinline__ pn_welford(T x)
      : shift(x - x == (T)0 ? x : (T)0), mean(x - x == (T)0 ? (T)0 : x), m2(x - x), n((T)1) {}
};
template <class T> __device__ __forceinline__ T pn_welford_mean(pn_welford<T> w) { return w.shift + w.mean; }
template <class T> __device__ __forceinline__ T pn_welford_var(pn_welford<T> w, int ddof) { return w.m2 / (w.n - (T)ddof); }

// Online softmax statistics (m, s): s = sum of exp(x - m) over the elements seen, rescaled to a
// larger m when one is merged in. Converting x is seeing one element: (x, 1).
__device__ __forceinline__ float pn_exp(float v) { return expf(v); }
__device__ __forceinline__ double pn_exp(double v) { return exp(v); }
template <class T> struct pn_lse {
  T m, s;
  pn_lse() = default;
  __device__ __forceinline__ pn_lse(T x) : m(x), s((T)1) {}
};
@FUNCTORS@

// Shuffles and cache-global loads of any accumulator (structs member by member).
template <class T> __device__ __forceinline__ T pn_shfl_down(T v, int o, int w) { return __shfl_down_sync(0xffffffffu, v, o, w); }
template <class T> __device__ __forceinline__ pn_welford<T> pn_shfl_down(pn_welford<T> v, int o, int w) {
  v.shift = __shfl_down_sync(0xffffffffu, v.shift, o, w);
  v.mean = __shfl_down_sync(0xffffffffu, v.mean, o, w);
  v.m2 = __shfl_down_sync(0xffffffffu, v.m2, o, w);
  v.n = __shfl_down_sync(0xffffffffu, v.n, o, w);
  return v;
}
template <class T> __device__ __forceinline__ pn_lse<T> pn_shfl_down(pn_lse<T> v, int o, int w) {
  v.m = __shfl_down_sync(0xffffffffu, v.m, o, w);
  v.s = __shfl_down_sync(0xffffffffu, v.s, o, w);
  return v;
}
// Lane 0's value in every lane of the warp (structs member by member).
template <class T> __device__ __forceinline__ T pn_shfl0(T v) { return __shfl_sync(0xffffffffu, v, 0); }
template <class T> __device__ __forceinline__ pn_welford<T> pn_shfl0(pn_welford<T> v) {
  v.shift = __shfl_sync(0xffffffffu, v.shift, 0);
  v.mean = __shfl_sync(0xffffffffu, v.mean, 0);
  v.m2 = __shfl_sync(0xffffffffu, v.m2, 0);
  v.n = __shfl_sync(0xffffffffu, v.n, 0);
  return v;
}
template <class T> __device__ __forceinline__ pn_lse<T> pn_shfl0(pn_lse<T> v) {
  v.m = __shfl_sync(0xffffffffu, v.m, 0);
  v.s = __shfl_sync(0xffffffffu, v.s, 0);
  return v;
}
template <class T> __device__ __forceinline__ T pn_ldcg(const T* p) { return __ldcg(p); }
template <class T> __device__ __forceinline__ pn_lse<T> pn_ldcg(const pn_lse<T>* p) {
  pn_lse<T> v;
  v.m = __ldcg(&p->m);
  v.s = __ldcg(&p->s);
  return v;
}
template <class T> __device__ __forceinline__ pn_welford<T> pn_ldcg(const pn_welford<T>* p) {
  pn_welford<T> w;
  w.shift = __ldcg(&p->shift);
  w.mean = __ldcg(&p->mean);
  w.m2 = __ldcg(&p->m2);
  w.n = __ldcg(&p->n);
  return w;
}

template <class T> __device__ __forceinline__ T pn_maximum(T a, T b) { return pn_op_max::apply(a, b); }
template <class T> __device__ __forceinline__ T pn_minimum(T a, T b) { return pn_op_min::apply(a, b); }
template <class T> __device__ __forceinline__ T pn_abs(T a) { return a < (T)0 ? -a : a; }
__device__ __forceinline__ float pn_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double pn_abs(double a) { return fabs(a); }
// numpy.power: pow() for floats; integers by exact repeated squaring (a negative exponent gives
// 0 unless the base is 1 or -1, where numpy raises and C would divide by zero).
// The CPU target (PN_CPU_TARGET): a constant exponent 3 (GELU's tanh form) as two products, which
// vectorize; powf's vector variant is ~40x slower (g++ folds an exponent 2 to a * a itself).
#ifdef PN_CPU_TARGET
#define PN_CUBE(a, b) if (__builtin_constant_p(b) && b == 3) return a * a * a;
#else
#define PN_CUBE(a, b)
#endif
__device__ __forceinline__ float pn_pow(float a, float b) { PN_CUBE(a, b) return powf(a, b); }
__device__ __forceinline__ double pn_pow(double a, double b) { PN_CUBE(a, b) return pow(a, b); }
template <class T> __device__ __forceinline__ T pn_pow(T a, T b) {
  if (b < 0) return a == 1 ? (T)1 : (a == -1 ? ((b & 1) ? (T)-1 : (T)1) : (T)0);
  T r = 1;
  for (; b; b >>= 1, a *= a)
    if (b & 1) r *= a;
  return r;
}
// numpy.mod from C's remainder r = fmod(a, b) or a % b: the result takes the divisor's sign.
template <class T> __device__ __forceinline__ T pn_mod_fix(T r, T b) {
  return (r != (T)0 && ((r < (T)0) != (b < (T)0))) ? (T)(r + b) : r;
}

// argmax/argmin: a (value, index) pair as one int64 key whose signed order is the order of
// (value, then first index): max of keys = argmax, min of keys = argmin. Values are mapped to
// order-preserving 32-bit patterns (-0.0 as +0.0; NaN above everything for argmax and below
// everything for argmin, so that the first NaN wins, as in numpy).
__device__ __forceinline__ unsigned pn_order_bits(float v) {
  unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ unsigned pn_order_bits(int v) { return (unsigned)v ^ 0x80000000u; }
template <class T> __device__ __forceinline__ long long pn_argkey_max(T v, long long index) {
  unsigned o = (v != v) ? 0xffffffffu : pn_order_bits(v);
  unsigned long long k = ((unsigned long long)o << 32) | (0xffffffffull - (unsigned long long)index);
  return (long long)(k ^ 0x8000000000000000ull);
}
template <class T> __device__ __forceinline__ long long pn_argkey_min(T v, long long index) {
  unsigned o = (v != v) ? 0u : pn_order_bits(v);
  unsigned long long k = ((unsigned long long)o << 32) | (unsigned long long)index;
  return (long long)(k ^ 0x8000000000000000ull);
}
__device__ __forceinline__ long long pn_argindex_max(long long k) { return 0xffffffffll - (k & 0xffffffffll); }
__device__ __forceinline__ long long pn_argindex_min(long long k) { return k & 0xffffffffll; }

// Loads convert storage types to register types; stores convert back.
__device__ __forceinline__ float pn_ld(const float* p) { return *p; }
__device__ __forceinline__ double pn_ld(const double* p) { return *p; }
__device__ __forceinline__ int pn_ld(const int* p) { return *p; }
__device__ __forceinline__ long long pn_ld(const long long* p) { return *p; }
__device__ __forceinline__ int pn_ld(const bool* p) { return *p ? 1 : 0; }
__device__ __forceinline__ void pn_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void pn_st(double* p, double v) { *p = v; }
__device__ __forceinline__ void pn_st(int* p, int v) { *p = v; }
__device__ __forceinline__ void pn_st(long long* p, long long v) { *p = v; }
__device__ __forceinline__ void pn_st(bool* p, int v) { *p = v != 0; }
// 8-bit integers (quantized weights): int registers, stores wrap modulo 256 as numpy's astype.
__device__ __forceinline__ int pn_ld(const signed char* p) { return *p; }
__device__ __forceinline__ int pn_ld(const unsigned char* p) { return *p; }
__device__ __forceinline__ void pn_st(signed char* p, int v) { *p = (signed char)v; }
__device__ __forceinline__ void pn_st(unsigned char* p, int v) { *p = (unsigned char)v; }

// Vector loads of 4 (or 2) consecutive, aligned elements into registers.
__device__ __forceinline__ void pn_ldv(const float* p, float (&r)[4]) { float4 v = pn_vload<float4>(p); r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w; }
__device__ __forceinline__ void pn_ldv(const float* p, float (&r)[2]) { float2 v = pn_vload<float2>(p); r[0] = v.x; r[1] = v.y; }
__device__ __forceinline__ void pn_ldv(const double* p, double (&r)[2]) { double2 v = pn_vload<double2>(p); r[0] = v.x; r[1] = v.y; }
__device__ __forceinline__ void pn_ldv(const int* p, int (&r)[4]) { int4 v = pn_vload<int4>(p); r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w; }
__device__ __forceinline__ void pn_ldv(const int* p, int (&r)[2]) { int2 v = pn_vload<int2>(p); r[0] = v.x; r[1] = v.y; }
__device__ __forceinline__ void pn_ldv(const long long* p, long long (&r)[2]) { longlong2 v = pn_vload<longlong2>(p); r[0] = v.x; r[1] = v.y; }
__device__ __forceinline__ void pn_ldv(const bool* p, int (&r)[4]) { unsigned v = pn_vload<unsigned>(p); for (int k = 0; k < 4; ++k) r[k] = (v >> (8 * k)) & 0xff ? 1 : 0; }
__device__ __forceinline__ void pn_ldv(const bool* p, int (&r)[2]) { r[0] = p[0] ? 1 : 0; r[1] = p[1] ? 1 : 0; }
// 4 to 16 consecutive 8-bit integers in one load of 4, 8 or 16 bytes.
template <class Q, int V> __device__ __forceinline__ void pn_ldv_bytes(const Q* p, int (&r)[V]) {
  unsigned w[4];
  if (V == 16) { const uint4 v = pn_vload<uint4>(p); w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
  else if (V == 8) { const uint2 v = pn_vload<uint2>(p); w[0] = v.x; w[1] = v.y; }
  else if (V == 4) { w[0] = pn_vload<unsigned>(p); }
  else { r[0] = p[0]; r[1] = p[1]; return; }
  for (int k = 0; k < V; ++k) r[k] = (int)(Q)((w[k / 4] >> (8 * (k % 4))) & 0xffu);
}
__device__ __forceinline__ void pn_ldv(const signed char* p, int (&r)[16]) { pn_ldv_bytes<signed char, 16>(p, r); }
__device__ __forceinline__ void pn_ldv(const signed char* p, int (&r)[8]) { pn_ldv_bytes<signed char, 8>(p, r); }
__device__ __forceinline__ void pn_ldv(const signed char* p, int (&r)[4]) { pn_ldv_bytes<signed char, 4>(p, r); }
__device__ __forceinline__ void pn_ldv(const signed char* p, int (&r)[2]) { pn_ldv_bytes<signed char, 2>(p, r); }
__device__ __forceinline__ void pn_ldv(const unsigned char* p, int (&r)[16]) { pn_ldv_bytes<unsigned char, 16>(p, r); }
__device__ __forceinline__ void pn_ldv(const unsigned char* p, int (&r)[8]) { pn_ldv_bytes<unsigned char, 8>(p, r); }
__device__ __forceinline__ void pn_ldv(const unsigned char* p, int (&r)[4]) { pn_ldv_bytes<unsigned char, 4>(p, r); }
__device__ __forceinline__ void pn_ldv(const unsigned char* p, int (&r)[2]) { pn_ldv_bytes<unsigned char, 2>(p, r); }
// 16-byte loads of 16 (8) bools: a thread keeps 16 bytes in flight whatever the dtype.
__device__ __forceinline__ void pn_ldv(const bool* p, int (&r)[16]) {
  const uint4 v = pn_vload<uint4>(p);
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 16; ++k) r[k] = (w[k / 4] >> (8 * (k % 4))) & 0xffu ? 1 : 0;
}
__device__ __forceinline__ void pn_ldv(const bool* p, int (&r)[8]) {
  const uint2 v = pn_vload<uint2>(p);
  for (int k = 0; k < 8; ++k) r[k] = ((k < 4 ? v.x : v.y) >> (8 * (k % 4))) & 0xffu ? 1 : 0;
}

// Reduce across threadIdx.x (TX lanes of each row of the block); valid at threadIdx.x == 0.
// smem holds TY * max(1, TX / 32) values.
template <class OP, int TX, int TY, class T>
__device__ __forceinline__ T pn_reduce_x(T v, T* smem) {
  if (TX == 1) return v;
  constexpr int W = TX < 32 ? TX : 32;
  for (int o = W / 2; o > 0; o >>= 1) v = OP::apply(v, pn_shfl_down(v, o, W));
  if (TX <= 32) return v;
  constexpr int NW = TX / 32;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  __syncthreads();  // the buffer may still be read by a previous reduction
  if (lane == 0) smem[threadIdx.y * NW + w] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < NW ? smem[threadIdx.y * NW + threadIdx.x] : OP::template identity<T>();
    for (int o = 16; o > 0; o >>= 1) v = OP::apply(v, pn_shfl_down(v, o, 32));
  }
  return v;
}

// N reductions across threadIdx.x at once (a register tile's rows): the shuffles of the N values
// interleave and one pair of barriers serves all of them. smem holds N * TY * max(1, TX / 32).
template <class OP, int TX, int TY, int N, class T>
__device__ __forceinline__ void pn_reduce_x_n(T (&v)[N], T* smem) {
  if (TX == 1) return;
  constexpr int W = TX < 32 ? TX : 32;
  for (int o = W / 2; o > 0; o >>= 1)
    for (int n = 0; n < N; ++n) v[n] = OP::apply(v[n], pn_shfl_down(v[n], o, W));
  if (TX <= 32) return;
  constexpr int NW = TX / 32;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  __syncthreads();  // the buffer may still be read by a previous reduction
  if (lane == 0) for (int n = 0; n < N; ++n) smem[(n * TY + threadIdx.y) * NW + w] = v[n];
  __syncthreads();
  if (threadIdx.x < 32)
    for (int n = 0; n < N; ++n) {
      v[n] = threadIdx.x < NW ? smem[(n * TY + threadIdx.y) * NW + threadIdx.x] : OP::template identity<T>();
      for (int o = 16; o > 0; o >>= 1) v[n] = OP::apply(v[n], pn_shfl_down(v[n], o, 32));
    }
}

// Reduce across threadIdx.x and hand the row's result to every thread of the row (a stitched
// kernel's consumers need it); bcast holds TY values.
template <class OP, int TX, int TY, class T>
__device__ __forceinline__ T pn_allreduce_x(T v, T* smem, T* bcast) {
  v = pn_reduce_x<OP, TX, TY>(v, smem);
  __syncthreads();  // the previous broadcast through bcast has been read
  if (threadIdx.x == 0) bcast[threadIdx.y] = v;
  __syncthreads();
  return bcast[threadIdx.y];
}

// The blocks that share a split row meet (a stitched kernel split across blocks, launched
// cooperatively so that every block is resident): each block has written its partials; thread 0
// publishes them (fence), arrives on the row's counter and waits until `target` arrivals (every
// block of the row, this exchange and the earlier ones), then the whole block reads them. As in
// cooperative groups' grid sync. Shared memory carries no value across this call (the emulator
// switches blocks here and keeps one __shared__ instance).
__device__ __forceinline__ void pn_grid_sync(unsigned* arrivals, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    __threadfence();
    atomicAdd(arrivals, 1u);
    pn_grid_wait(arrivals, target);
    __threadfence();
  }
  __syncthreads();
}

// Reduce across threadIdx.y (TY rows, TY a power of two); valid at threadIdx.y == 0.
template <class OP, int TX, int TY, class T>
__device__ __forceinline__ T pn_reduce_y(T v, T* smem) {
  if (TY == 1) return v;
  __syncthreads();
  smem[threadIdx.y * TX + threadIdx.x] = v;
  __syncthreads();
  for (int s = TY / 2; s > 0; s >>= 1) {
    if (threadIdx.y < s)
      smem[threadIdx.y * TX + threadIdx.x] = OP::apply(smem[threadIdx.y * TX + threadIdx.x], smem[(threadIdx.y + s) * TX + threadIdx.x]);
    __syncthreads();
  }
  return smem[threadIdx.x];
}

// Reduce P register partials across threadIdx.y, C at a time (schedule/derived.py `tree_chunk`):
// every thread stores C partials (smem: [C][TY][TX]), one barrier, each thread sums its share of
// the C * TX (partial, column) pairs over the TY rows in row order, a barrier, and the rows'
// leaders (threadIdx.y == 0) read the sums back into v. Three barriers per chunk, where
// pn_reduce_y takes 2 + log2(TY) per partial.
template <class OP, int TX, int TY, int P, int C, class T>
__device__ __forceinline__ void pn_reduce_y_all(T (&v)[P], T* smem) {
  if (TY == 1) return;
#pragma unroll
  for (int c0 = 0; c0 < P; c0 += C) {
    __syncthreads();
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (c0 + c < P) smem[(c * TY + threadIdx.y) * TX + threadIdx.x] = v[c0 + c];
    __syncthreads();
    for (int q = threadIdx.y * TX + threadIdx.x; q < C * TX; q += TX * TY) {
      const int c = q / TX, x = q % TX;
      if (c0 + c < P) {
        T a = smem[c * TY * TX + x];
        for (int y = 1; y < TY; ++y) a = OP::apply(a, smem[(c * TY + y) * TX + x]);
        smem[c * TY * TX + x] = a;
      }
    }
    __syncthreads();
    if (threadIdx.y == 0) {
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (c0 + c < P) v[c0 + c] = smem[c * TY * TX + threadIdx.x];
    }
  }
}

// One atomic per block per output: native where the hardware has it, a CAS loop otherwise.
template <class OP> __device__ __forceinline__ void pn_atomic_cas(float* p, float v) {
  unsigned* q = reinterpret_cast<unsigned*>(p);
  unsigned old = __ldcg(q), assumed;  // L2, not a stale L1 line
  do {
    assumed = old;
    unsigned want = __float_as_uint(OP::apply(__uint_as_float(assumed), v));
    if (want == assumed) return;
    old = atomicCAS(q, assumed, want);
  } while (old != assumed);
}
template <class OP> __device__ __forceinline__ void pn_atomic_cas(double* p, double v) {
  unsigned long long* q = reinterpret_cast<unsigned long long*>(p);
  unsigned long long old = __ldcg(q), assumed;
  do {
    assumed = old;
    unsigned long long want = (unsigned long long)__double_as_longlong(OP::apply(__longlong_as_double((long long)assumed), v));
    if (want == assumed) return;
    old = atomicCAS(q, assumed, want);
  } while (old != assumed);
}
template <class OP> __device__ __forceinline__ void pn_atomic_cas(int* p, int v) {
  int old = __ldcg(p), assumed;
  do {
    assumed = old;
    int want = OP::apply(assumed, v);
    if (want == assumed) return;
    old = atomicCAS(p, assumed, want);
  } while (old != assumed);
}
template <class OP> __device__ __forceinline__ void pn_atomic_cas(long long* p, long long v) {
  unsigned long long* q = reinterpret_cast<unsigned long long*>(p);
  unsigned long long old = __ldcg(q), assumed;
  do {
    assumed = old;
    unsigned long long want = (unsigned long long)OP::apply((long long)assumed, v);
    if (want == assumed) return;
    old = atomicCAS(q, assumed, want);
  } while (old != assumed);
}
@ATOMICS@
template <class OP, class T> __device__ __forceinline__ void pn_atomic(OP, T* p, T v) { pn_atomic_cas<OP>(p, v); }
// Float max/min merged by native integer atomics on an order-preserving image (algebra.ordered):
// non-negative floats keep their bits, negative ones flip all but the sign; NaN goes to the top
// for max and the bottom for min, so it wins, and both images read back as a NaN.
__device__ __forceinline__ int pn_ordered(float v, bool top) {
  const int b = __float_as_int(v);
  return v != v ? (top ? 0x7fffffff : (int)0x80000000) : (b >= 0 ? b : b ^ 0x7fffffff);
}
__device__ __forceinline__ long long pn_ordered(double v, bool top) {
  const long long b = __double_as_longlong(v);
  return v != v ? (top ? 0x7fffffffffffffffLL : (long long)0x8000000000000000ULL) : (b >= 0 ? b : b ^ 0x7fffffffffffffffLL);
}
__device__ __forceinline__ float pn_unordered(int x) { return __int_as_float(x >= 0 ? x : x ^ 0x7fffffff); }
__device__ __forceinline__ double pn_unordered(long long x) { return __longlong_as_double(x >= 0 ? x : x ^ 0x7fffffffffffffffLL); }
__device__ __forceinline__ void pn_atomic_ordered(pn_op_max, int* p, float v) { atomicMax(p, pn_ordered(v, true)); }
__device__ __forceinline__ void pn_atomic_ordered(pn_op_min, int* p, float v) { atomicMin(p, pn_ordered(v, false)); }
__device__ __forceinline__ void pn_atomic_ordered(pn_op_max, long long* p, double v) { atomicMax(p, pn_ordered(v, true)); }
__device__ __forceinline__ void pn_atomic_ordered(pn_op_min, long long* p, double v) { atomicMin(p, pn_ordered(v, false)); }
// float32 sums of 2 or 4 adjacent outputs: one 8- or 16-byte reduction on sm_90 (ATOMG.E.ADD.F32x4),
// one atomic per lane before it. p is aligned to the width (mapping.py's atomic_vec).
__device__ __forceinline__ void pn_atomic_v(float* p, const float (&v)[4]) {
#if defined(PANAMERA_EMULATOR) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
  atomicAdd(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
#else
  for (int k = 0; k < 4; ++k) atomicAdd(p + k, v[k]);
#endif
}
__device__ __forceinline__ void pn_atomic_v(float* p, const float (&v)[2]) {
#if defined(PANAMERA_EMULATOR) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(v[0], v[1]));
#else
  for (int k = 0; k < 2; ++k) atomicAdd(p + k, v[k]);
#endif
}
"""


def functor_source(c: algebra.Combiner) -> str:
    """The C++ functor struct of one combiner, from its `cpp_apply` and `cpp_identity` bodies."""

    def body(text: str) -> str:
        return "\n".join("    " + ln for ln in text.splitlines())

    return (
        f"struct {c.functor} {{\n"
        f"  template <class T> static __device__ __forceinline__ T apply(T a, T b) {{\n{body(c.cpp_apply)}\n  }}\n"
        f"  template <class T> static __device__ __forceinline__ T identity() {{\n{body(c.cpp_identity)}\n  }}\n"
        "};"
    )


def native_atomic_source(c: algebra.Combiner) -> str:
    """`pn_atomic` overloads for the accumulator dtypes the hardware merges natively (64-bit
    integer adds go through unsigned long long, the type CUDA's atomicAdd takes)."""
    out = []
    for name in sorted(c.native_dtypes):
        t = dtypes.as_dtype(name).compute
        call = f"{c.native_atomic}(p, v)"
        if name == "int64" and c.native_atomic == "atomicAdd":
            call = "atomicAdd(reinterpret_cast<unsigned long long*>(p), (unsigned long long)v)"
        out.append(f"__device__ __forceinline__ void pn_atomic({c.functor}, {t}* p, {t} v) {{ {call}; }}")
    return "\n".join(out)


def vector_functor_source(c: algebra.VectorCombiner) -> str:
    """The C++ functor of a vector accumulator (m, s, o[D]) from its `cpp_weights` and
    `cpp_finish` bodies: `weights` (the merged max and the two rescaling factors), `merge` (b
    into a, o of D elements) and `finish` (the stored value of o[d]), generated into the prelude
    as every combiner's functor is.

    >>> print(vector_functor_source(algebra.ONLINE_SOFTMAX_VEC).splitlines()[0])
    struct pn_op_softmax_vec {
    """
    body = "\n".join("    " + ln for ln in c.cpp_weights.splitlines())
    return (
        f"struct {c.functor} {{\n"
        "  template <class T> static __device__ __forceinline__ void weights(T ma, T mb, T& m, T& fa, T& fb) {\n"
        f"{body}\n  }}\n"
        "  template <class T, int D> static __device__ __forceinline__ void merge(T& ma, T& sa, T (&oa)[D], T mb, T sb, const T (&ob)[D]) {\n"
        "    T m, fa, fb;\n"
        "    weights(ma, mb, m, fa, fb);\n"
        "    ma = m;\n"
        "    sa = sa * fa + sb * fb;\n"
        "    for (int k = 0; k < D; ++k) oa[k] = oa[k] * fa + ob[k] * fb;\n"
        "  }\n"
        "  template <class T> static __device__ __forceinline__ T finish(T o, T s) {\n"
        f"    {c.cpp_finish}\n"
        "  }\n"
        "};"
    )


PRELUDE_BASE = _TEMPLATE.replace(
    "@FUNCTORS@",
    "\n".join(
        [*(functor_source(c) for c in algebra.COMBINERS.values()), vector_functor_source(algebra.ONLINE_SOFTMAX_VEC)]
    ),
).replace("@ATOMICS@", "\n".join(native_atomic_source(c) for c in algebra.COMBINERS.values() if c.native_dtypes))

# What only kernels with a 16-bit type need: NVRTC has no built-in cuda_fp16.h / cuda_bf16.h and
# rejects any source including them when the CUDA headers are not on its path (a pip-only
# install), so a float32 kernel must not include them.
PRELUDE_16BIT = r"""
#ifndef PANAMERA_EMULATOR
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif
#ifdef PANAMERA_EMULATOR
__device__ __forceinline__ float pn_round_half(float v) { return pn_emu_round_half(v); }
#else
__device__ __forceinline__ float pn_round_half(float v) { return __half2float(__float2half_rn(v)); }
#endif
__device__ __forceinline__ float pn_round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float pn_ld(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float pn_ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void pn_st(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void pn_st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void pn_ldv(const __half* p, float (&r)[4]) { uint2 v = pn_vload<uint2>(p); r[0] = __half2float(__ushort_as_half((unsigned short)(v.x & 0xffffu))); r[1] = __half2float(__ushort_as_half((unsigned short)(v.x >> 16))); r[2] = __half2float(__ushort_as_half((unsigned short)(v.y & 0xffffu))); r[3] = __half2float(__ushort_as_half((unsigned short)(v.y >> 16))); }
__device__ __forceinline__ void pn_ldv(const __half* p, float (&r)[2]) { unsigned v = pn_vload<unsigned>(p); r[0] = __half2float(__ushort_as_half((unsigned short)(v & 0xffffu))); r[1] = __half2float(__ushort_as_half((unsigned short)(v >> 16))); }
__device__ __forceinline__ void pn_ldv(const __nv_bfloat16* p, float (&r)[4]) { uint2 v = pn_vload<uint2>(p); r[0] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(v.x & 0xffffu))); r[1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(v.x >> 16))); r[2] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(v.y & 0xffffu))); r[3] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(v.y >> 16))); }
__device__ __forceinline__ void pn_ldv(const __nv_bfloat16* p, float (&r)[2]) { unsigned v = pn_vload<unsigned>(p); r[0] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(v & 0xffffu))); r[1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(v >> 16))); }
// 16-byte loads of 8 half-width values: 2-byte inputs move as many bytes per load as float4.
template <class H, class CVT> __device__ __forceinline__ void pn_ldv16_halves(const H* p, float (&r)[8], CVT cvt) {
  const uint4 v = pn_vload<uint4>(p);
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4; ++k) { r[2 * k] = cvt((unsigned short)(w[k] & 0xffffu)); r[2 * k + 1] = cvt((unsigned short)(w[k] >> 16)); }
}
__device__ __forceinline__ float pn_half_bits(unsigned short b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ float pn_bf16_bits(unsigned short b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
__device__ __forceinline__ void pn_ldv(const __half* p, float (&r)[8]) { pn_ldv16_halves(p, r, pn_half_bits); }
__device__ __forceinline__ void pn_ldv(const __nv_bfloat16* p, float (&r)[8]) { pn_ldv16_halves(p, r, pn_bf16_bits); }
// int4 weights to 16-bit floats by the exponent trick (Marlin's dequant, FasterTransformer's int4
// converter, arXiv 2211.10017): nibble n masked into the low mantissa bits of 1024.0 (fp16 0x6400,
// spacing 1 on [1024, 2048)) or of 128.0 (bf16 0x4300, spacing 1 on [128, 256)) reads as 1024 + n
// (128 + n); one __hsub2 of 1024 + z (128 + z) leaves n - z exactly for two weights, one __hmul2
// by the scale rounds (n - z) * s once, as __float2half_rn((float)(n - z) * s) does. `w` holds 8
// nibbles (nibble b at bits 4b..4b+3); nibbles b and b + 4 share a pair. `zs` is 1024 + z (128 + z)
// in both halves, `s` the scale in both.
__device__ __forceinline__ __half2 pn_h2_bits(unsigned u) { return __halves2half2(__ushort_as_half((unsigned short)(u & 0xffffu)), __ushort_as_half((unsigned short)(u >> 16))); }
__device__ __forceinline__ __nv_bfloat162 pn_b2_bits(unsigned u) { return __halves2bfloat162(__ushort_as_bfloat16((unsigned short)(u & 0xffffu)), __ushort_as_bfloat16((unsigned short)(u >> 16))); }
__device__ __forceinline__ void pn_i4x8(unsigned w, __half2 zs, __half2 s, __half (&out)[8]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const __half2 v = __hmul2(__hsub2(pn_h2_bits(((w >> (4 * b)) & 0x000F000Fu) | 0x64006400u), zs), s);
    out[b] = __low2half(v);
    out[b + 4] = __high2half(v);
  }
}
__device__ __forceinline__ void pn_i4x8(unsigned w, __nv_bfloat162 zs, __nv_bfloat162 s, __nv_bfloat16 (&out)[8]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const __nv_bfloat162 v = __hmul2(__hsub2(pn_b2_bits(((w >> (4 * b)) & 0x000F000Fu) | 0x43004300u), zs), s);
    out[b] = __low2bfloat16(v);
    out[b + 4] = __high2bfloat16(v);
  }
}
"""

PRELUDE = PRELUDE_BASE + PRELUDE_16BIT  # everything: for tests that compile arbitrary kernels

# The identifiers that make a kernel need PRELUDE_16BIT.
_16BIT = re.compile(r"__half|__nv_bfloat16|pn_round_(half|bf16)|__float2half|__float2bfloat16")


def uses_16bit(source: str) -> bool:
    """Whether generated code names a 16-bit float type or conversion.

    >>> uses_16bit("pn_st(&out0[i], pn_round_half(x));"), uses_16bit("float x = 1.0f;")
    (True, False)
    """
    return _16BIT.search(source) is not None


def prelude(source: str) -> str:
    """The prelude the kernels in `source` need: the 16-bit part only where a 16-bit type occurs.

    >>> "cuda_fp16.h" in prelude("float x;"), "cuda_fp16.h" in prelude("__half x;")
    (False, True)
    """
    return PRELUDE_BASE + (PRELUDE_16BIT if uses_16bit(source) else "")


# Every identifier the generated code may call; tests/test_emulator.py checks each against both
# the emulator and nvcc.
INTRINSICS = (
    "__syncthreads",
    "__shfl_down_sync",
    "__shfl_xor_sync",
    "__shfl_sync",
    "__threadfence",
    "__ldcg",
    "__nanosleep",
    "pn_grid_wait",
    "atomicAdd",
    "atomicCAS",
    "atomicMax",
    "atomicMin",
    "atomicAnd",
    "atomicOr",
    "__half2float",
    "__float2half_rn",
    "__bfloat162float",
    "__float2bfloat16_rn",
    "__ushort_as_half",
    "__ushort_as_bfloat16",
    "__halves2half2",
    "__half2half2",
    "__low2half",
    "__high2half",
    "__halves2bfloat162",
    "__bfloat162bfloat162",
    "__low2bfloat16",
    "__high2bfloat16",
    "__hsub2",
    "__hmul2",
    "__float_as_uint",
    "__uint_as_float",
    "__double_as_longlong",
    "__longlong_as_double",
    "__int_as_float",
    "__float_as_int",
    "expf",
    "logf",
    "sqrtf",
    "rsqrtf",
    "fabsf",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "fabs",
    "tanhf",
    "erff",
    "floorf",
    "ceilf",
    "powf",
    "tanh",
    "erf",
    "floor",
    "ceil",
    "pow",
    "sinf",
    "cosf",
    "fmodf",
    "sin",
    "cos",
    "fmod",
)
