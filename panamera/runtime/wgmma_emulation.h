// wgmma_emulation.h: Hopper's warpgroup MMAs (PTX wgmma, sm_90a) for the emulator, as a reference.
//
// What Panamera's wgmma tiles use (codegen/wgmma_kernel.py, whose CUDA side issues the same PTX):
//   pn_wgacc<N, A>       a thread's accumulator registers of an MMA (N = columns / 2 per thread), of
//                        type A: float (f32 accumulators) or int (s32, s8 operands); its operator[]
//                        is the only access to them
//   pn_wgmma_desc        the 64-bit shared-memory matrix descriptor of an operand (PTX ISA, "Matrix
//                        Descriptor Format"): bits 0-13 the start address >> 4, 16-29 the leading
//                        dimension byte offset >> 4, 32-45 the stride dimension byte offset >> 4,
//                        49-51 the base offset, 62-63 the swizzle mode
//   pn_wgmma<N, T>       wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T (T f16 / bf16), or
//                        .m64nNk32.s32.s8.s8 (T signed char): A and B from shared memory through
//                        descriptors, both K-major, D += A * B^T; an MMA's K is 32 bytes of T
//   pn_wgmma_fence / pn_wgmma_commit / pn_wgmma_wait<n>: wgmma.fence, commit_group, wait_group n
//   pn_fence_proxy_async fence.proxy.async.shared::cta (generic-proxy stores made visible to wgmma)
//
// Layout decoded as documented for no swizzle (mode 0, "interleave"): the operand is made of core
// matrices of 8 rows x 16 bytes, each contiguous (row r at r * 16 bytes); the core matrix holding
// row r (of 64 for A, of N for B) and k is at start + (r / 8) * SBO + (k * sizeof(T) / 16) * LBO,
// i.e. LBO steps along K (the leading dimension) and SBO along M or N. Other swizzle modes and a
// nonzero base offset are reported, not guessed.
// The addresses are shared-memory addresses: the emulator's are offsets in the block's
// PN_BLOCK_SHARED arena (the operands' slabs live there); any other pointer is an error.
//
// Accumulators: a warpgroup is 4 warps (threads 128 g .. 128 g + 127); warp w holds rows
// 16 w .. 16 w + 15, and lane l's element i is row 16 w + l / 4 + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 (l % 4) + i % 2 (the PTX ISA's "Register Fragments" figure for wgmma D, the same
// for .m64nNk16 f32 and .m64nNk32 s32 accumulators).
// Each thread computes its own elements from shared memory at the call (the operands must be in
// place, as on the GPU, where they are read asynchronously until the wait), but its registers
// change only at the wgmma.wait_group that covers the MMA's group. Errors, as a GPU's undefined
// behaviour would be a wrong answer: an MMA without a wgmma.fence since the thread last accessed
// accumulator registers; accumulators accessed while an MMA writing them is not waited for; a
// thread that exits with MMAs not waited for; more than kMaxWgmma MMAs in flight; operand bytes
// an MMA read changed by its wait (any thread's store in between: the GPU reads them
// asynchronously, so such a store races with the MMA).
// Arithmetic as wmma_emulation.h: products of 16-bit floats are exact in float, accumulated with
// one rounding per k (fmaf), k ascending; s8 products accumulate exactly in s32, wrapping (the
// instruction without .satfinite).
#pragma once
#include <type_traits>

template <int N, class A = float> struct pn_wgacc {
  static_assert(sizeof(A) == 4, "wgmma accumulators are f32 or s32 registers");
  A v[N];
  A& operator[](int i) {
    using namespace pn_emu;
    WgmmaState* s = cur->wgmma;
    if (s) {
      s->fenced = 0;  // the registers were touched: the next MMA needs a wgmma.fence first
      for (int j = 0; j < s->n; ++j)
        if (s->p[j].acc == v && !error) error = "wgmma: accumulators accessed before the wgmma.wait_group of an MMA writing them";
    }
    return v[i];
  }
};

namespace pn_emu {
static inline WgmmaState& wgmma_state() {
  if (!cur->wgmma) {
    cur->wgmma = static_cast<WgmmaState*>(std::malloc(sizeof(WgmmaState)));
    cur->wgmma->fenced = cur->wgmma->committed = cur->wgmma->n = 0;
  }
  return *cur->wgmma;
}
// The bytes of element (r, k), `size` bytes each, of a K-major operand described by `desc`, or
// nullptr (error set).
static inline const unsigned char* wgmma_bytes(unsigned long long desc, int r, int k, size_t size) {
  if ((desc >> 62) != 0 || ((desc >> 49) & 7) != 0) {
    if (!error) error = "wgmma: only descriptors without swizzle and with base offset 0 are emulated";
    return nullptr;
  }
  const size_t start = (desc & 0x3FFF) << 4, lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
  const size_t kb = (size_t)k * size;
  const size_t at = start + (size_t)(r / 8) * sbo + (kb / 16) * lbo + (size_t)(r % 8) * 16 + kb % 16;
  if (at + size > kArena) {
    if (!error) error = "wgmma: a descriptor addresses past the block's shared memory";
    return nullptr;
  }
  return arena_of(blk) + at;
}
template <class T> static inline const T* wgmma_element(unsigned long long desc, int r, int k) {
  return reinterpret_cast<const T*>(wgmma_bytes(desc, r, k, sizeof(T)));
}
// This thread's D element i of an MMA: (row, column) by the D fragment layout.
static inline int wgmma_row(int i) { const int t = cur->tid % 128; return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
static inline int wgmma_col(int i) { const int l = cur->tid % 32; return 8 * (i / 4) + 2 * (l % 4) + i % 2; }
// A hash of the operand bytes this thread's D elements read (FNV-1a), folded into `h`.
static inline unsigned long long wgmma_hash(unsigned long long h, unsigned long long da, unsigned long long db,
                                            int n, size_t size) {
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < (int)(32 / size); ++k) {  // the MMA's K: 32 bytes
      const unsigned char* a = wgmma_bytes(da, wgmma_row(i), k, size);
      const unsigned char* b = wgmma_bytes(db, wgmma_col(i), k, size);
      if (!a || !b) return h;
      for (size_t j = 0; j < size; ++j) h = (h ^ a[j]) * 1099511628211ULL, h = (h ^ b[j]) * 1099511628211ULL;
    }
  return h;
}
// acc + a b, one step of an MMA's dot product: 16-bit floats in float with one rounding (fmaf), s8 in
// s32, exact and wrapping.
template <class T> static inline float wgmma_fma(float acc, const T& a, const T& b) {
  return std::fmaf(nvcuda::wmma::detail::to_float(a), nvcuda::wmma::detail::to_float(b), acc);
}
static inline int wgmma_fma(int acc, const signed char& a, const signed char& b) {
  return (int)((uint32_t)acc + (uint32_t)((int)a * (int)b));
}
}  // namespace pn_emu

static inline unsigned long long pn_wgmma_desc(const void* p, unsigned lbo, unsigned sbo) {
  using namespace pn_emu;
  long long off = (long long)((const unsigned char*)p - arena_of(blk));
  if (off < 0 || off >= (long long)kArena || off % 16) {
    if (!error) error = "wgmma: a descriptor's address is not 16-byte aligned shared memory of the block (PN_BLOCK_SHARED)";
    return 0;
  }
  return ((unsigned long long)off >> 4) | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);
}
static inline void pn_fence_proxy_async() {}  // the emulator's shared memory has one proxy
static inline void pn_wgmma_fence() { pn_emu::wgmma_state().fenced = 1; }
static inline void pn_wgmma_commit() { pn_emu::wgmma_state().committed++; }
// wgmma.wait_group n: every MMA of the groups committed before the newest n lands, oldest first.
template <int Pending> static inline void pn_wgmma_wait() {
  using namespace pn_emu;
  WgmmaState& s = wgmma_state();
  int kept = 0;
  for (int j = 0; j < s.n; ++j) {
    WgmmaPending& q = s.p[j];
    if (q.group < s.committed - Pending) {
      unsigned long long h = 14695981039346656037ULL;
      for (int o = 0; o < q.ops; ++o) h = wgmma_hash(h, q.da[o], q.db[o], q.n, q.esize);
      if (h != q.hash && !error)
        error = "wgmma.mma_async: shared memory an MMA reads was written before the wgmma.wait_group that covers it";
      std::memcpy(q.acc, q.v, 4 * (size_t)q.n);
    } else {
      s.p[kept++] = q;
    }
  }
  s.n = kept;
}

// D (this thread's N / 2 elements) += A (64 x K) * B (N x K)^T, both K-major in shared memory; K is
// 32 bytes of T (16 f16 / bf16 with float accumulators, 32 s8 with int).
template <int N, class T, class A> static inline void pn_wgmma(pn_wgacc<N / 2, A>& d, unsigned long long da,
                                                             unsigned long long db) {
  using namespace pn_emu;
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma .m64nNk16 / k32: N is a multiple of 8 up to 256");
  static_assert(sizeof(T) == 1 ? std::is_same<A, int>::value : std::is_same<A, float>::value,
                "wgmma: s8 operands take s32 accumulators, 16-bit floats f32");
  constexpr int kK = 32 / (int)sizeof(T);
  WgmmaState& s = wgmma_state();
  if (!s.fenced) {
    if (!error) error = "wgmma.mma_async: no wgmma.fence since the thread last accessed accumulator registers";
    return;
  }
  // the accumulator's value the MMA starts from: its newest pending result, else the registers
  A from[N / 2];
  std::memcpy(from, d.v, sizeof from);
  for (int j = 0; j < s.n; ++j)
    if (s.p[j].acc == d.v) std::memcpy(from, s.p[j].v, sizeof from);
  A next[N / 2];
  for (int i = 0; i < N / 2; ++i) {
    const int r = wgmma_row(i), c = wgmma_col(i);
    A acc = from[i];
    for (int k = 0; k < kK; ++k) {
      const T* a = wgmma_element<T>(da, r, k);
      const T* b = wgmma_element<T>(db, c, k);
      if (!a || !b) return;
      acc = wgmma_fma(acc, *a, *b);
    }
    next[i] = acc;
  }
  WgmmaPending* q = nullptr;
  for (int j = 0; j < s.n; ++j)  // chained onto an MMA of the open group: one pending result
    if (s.p[j].acc == d.v && s.p[j].group == s.committed) q = &s.p[j];
  if (q && q->ops == kMaxWgmma) {
    if (!error) error = "wgmma.mma_async: more than 16 MMAs chained into one accumulator in one group";
    return;
  }
  if (!q) {
    if (s.n == kMaxWgmma) {
      if (!error) error = "wgmma.mma_async: more than 16 MMAs of one thread in flight";
      return;
    }
    q = &s.p[s.n++];
    q->acc = d.v;
    q->n = N / 2;
    q->group = s.committed;
    q->ops = 0;
    q->esize = (int)sizeof(T);
    q->hash = 14695981039346656037ULL;
  }
  q->da[q->ops] = da;
  q->db[q->ops++] = db;
  q->hash = wgmma_hash(q->hash, da, db, N / 2, sizeof(T));  // the operands as this MMA read them
  std::memcpy(q->v, next, sizeof next);
}
