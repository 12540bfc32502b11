// cuda_emulation.h: runs Panamera's generated CUDA C++ unchanged on the CPU.
//
// Each thread block is executed by cooperative fibers, one per CUDA thread, that switch only at
// __syncthreads() and at warp collectives (__shfl_*_sync). Blocks run one after another, in an
// order chosen by the launcher (forward, reverse or shuffled), and so do the fibers of a block,
// so that a missing barrier shows up as a wrong result rather than passing by luck.
// __shared__ becomes `static`: one instance per kernel, correct because blocks never overlap.
//
// A cooperative launch (every block resident at once, as cudaLaunchCooperativeKernel guarantees)
// gives every thread of every block its own fiber: a block runs until all its live threads wait
// (at a barrier, or at a grid-wide wait, pn_grid_wait), then the next block in the launch order
// runs; a thread waiting at pn_grid_wait resumes once its counter reaches the target. Blocks
// interleave only at grid-wide waits, so the static __shared__ stays correct under one contract
// the generated code keeps: shared memory never carries a value across a grid-wide wait. When no
// block can move, the launch fails with a deadlock report instead of hanging.
// Shared memory that must hold a value while other blocks run (PN_BLOCK_SHARED: rows kept on chip,
// a cluster's partials) is each block's own instead: a per-block arena of kArena bytes, every
// declaration at its own offset, filled with 0xff bytes (NaN) when the block starts. A launch's
// dynamic shared memory (PN_DYNAMIC_SHARED, `extern __shared__`) is each block's own buffer beside
// the arena (the arena's offsets are fixed per library, over all its kernels' declarations: another
// kernel's arrays must not take its room), likewise filled with NaN.
// Atomics are real atomic operations (GCC __atomic builtins), so the semantics stay honest even
// though one host thread runs everything.
#pragma once
#include <cmath>
#include <climits>
#include <cstdint>
#include <cstring>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <ucontext.h>
#include <sys/mman.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) longlong2 { long long x, y; };

// ---------------------------------------------------------------- 16-bit floating types
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };

static inline float pn_emu_bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t pn_emu_float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Conversions without branches (selects only), so that a SIMD loop over 16-bit values vectorizes
// on the CPU target (codegen/cpu_kernel.py; g++ -fno-trapping-math if-converts them): exact,
// round to nearest even, as numpy's astype (every fp16 value, and 21 M float32 values around
// every fp16 range, checked against numpy).
// fp16 -> float: a normal number by rebiasing its exponent, zero and subnormals as m * 2^-24
// (exact), inf and NaN by the top exponent. No float operation has a subnormal operand or result:
// those take a microcode assist (~100 cycles) on x86 without DAZ/FTZ, so the shorter trick of one
// multiply of the shifted bits by 2^112 (a subnormal float for a subnormal half) runs 3x slower on
// rows of small values (softmax 64x30522 float16's outputs).
static inline float pn_emu_h2f(uint32_t h) {
  const uint32_t s = (h & 0x8000u) << 16, em = h & 0x7fffu;
  const uint32_t sub = pn_emu_float_to_bits((float)(int)em * 5.9604644775390625e-08f);
  uint32_t r = em < 0x0400u ? sub : (em << 13) + 0x38000000u;
  r = em >= 0x7c00u ? ((em << 13) | 0x7f800000u) : r;
  return pn_emu_bits_to_float(r | s);
}
// B = 2^(e+13) for |f| = a's bits in [2^e, 2^(e+1)), 0.5 below 2^-14: |f| + B lies where the float
// ulp is the fp16 quantum, so the sum rounds |f| to the fp16 grid (pn_emu_f2h, pn_emu_round_half).
static inline float pn_emu_half_bias(uint32_t a) {
  const float b = pn_emu_bits_to_float((a & 0x7f800000u) + (13u << 23));
  return b > 0.5f ? b : 0.5f;
}
// float -> fp16 bits: |f| rounded to the fp16 grid in float arithmetic as pn_emu_round_half does
// (below): x + B with B = 2^(e+13) (0.5 below 2^-14) has the fp16 quantum as its ulp, so below
// 2^-14 the bits of x + 0.5 less those of 0.5 are the subnormal half's m (1024: the smallest
// normal), and above, r = (x + B) - B is a half value whose float bits, rebiased, >> 13 are the
// half's; |f| >= 65520 -> inf, NaN -> quiet NaN, the sign OR'd. No variable shifts and no
// subnormal float result (see pn_emu_h2f), ~12 SIMD operations.
static inline uint32_t pn_emu_f2h(float f) {
  const uint32_t u = pn_emu_float_to_bits(f), a = u & 0x7fffffffu;
  const float x = pn_emu_bits_to_float(a), b = pn_emu_half_bias(a), xb = x + b;
  uint32_t r = a < 0x38800000u ? pn_emu_float_to_bits(xb) - 0x3f000000u
                               : (pn_emu_float_to_bits(xb - b) - 0x38000000u) >> 13;
  r = a >= 0x477ff000u ? 0x7c00u : r;
  r = a > 0x7f800000u ? 0x7e00u : r;
  return r | ((u >> 16) & 0x8000u);
}
// float -> fp16 -> float (pn_round_half) in float arithmetic, ~8 SIMD operations instead of both
// conversions' ~30: for |f| in [2^e, 2^(e+1)), |f| + B with B = 2^(e+13) (0.5 below 2^-14, where
// the fp16 quantum is 2^-24) lies where the float ulp is the fp16 quantum 2^(e-10), so the sum
// rounds |f| to it, ties to even (B is a multiple of two quanta), and - B is exact; |f| >= 65520
// -> inf, a NaN stays NaN, the sign is kept (every float32 checked against numpy's astype).
static inline float pn_emu_round_half(float f) {
  const uint32_t u = pn_emu_float_to_bits(f), a = u & 0x7fffffffu;
  const float x = pn_emu_bits_to_float(a), b = pn_emu_half_bias(a);
  float r = (x + b) - b;
  r = x >= 65520.0f ? pn_emu_bits_to_float(0x7f800000u) : r;
  return pn_emu_bits_to_float(pn_emu_float_to_bits(r) | (u & 0x80000000u));
}
static inline float __half2float(__half h) { return pn_emu_h2f(h.x); }
static inline __half __float2half_rn(float f) {
  __half h;
  h.x = (unsigned short)pn_emu_f2h(f);
  return h;
}
static inline float __bfloat162float(__nv_bfloat16 b) { return pn_emu_bits_to_float((uint32_t)b.x << 16); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {  // NaN stays a (quiet) NaN; else nearest even
  const uint32_t u = pn_emu_float_to_bits(f);
  const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) : u + 0x7fffu + ((u >> 16) & 1u);
  __nv_bfloat16 b;
  b.x = (unsigned short)(r >> 16);
  return b;
}
static inline __half __ushort_as_half(unsigned short v) { __half h; h.x = v; return h; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) { __nv_bfloat16 b; b.x = v; return b; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }

// Pairs of 16-bit floats (x the low 16 bits, as CUDA's) and the paired operations the int4
// dequantization uses (codegen/header.py, pn_i4x8). Each result is the float32 result of the
// 16-bit operands rounded once to the 16-bit type: correctly rounded, as the hardware's, since
// float32's 24 bits are at least 2p + 2 for fp16's p = 11 and bf16's p = 8 (double rounding is
// innocuous for + - *; Figueroa 1995).
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
static inline __half2 __half2half2(__half a) { return __half2{a, a}; }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }
static inline __half pn_emu_hop(__half a, __half b, int op) {
  const float x = __half2float(a), y = __half2float(b);
  return __float2half_rn(op ? x * y : x - y);
}
static inline __half2 __hsub2(__half2 a, __half2 b) { return __half2{pn_emu_hop(a.x, b.x, 0), pn_emu_hop(a.y, b.y, 0)}; }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __half2{pn_emu_hop(a.x, b.x, 1), pn_emu_hop(a.y, b.y, 1)}; }
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }
static inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162{a, a}; }
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
static inline __nv_bfloat16 pn_emu_bop(__nv_bfloat16 a, __nv_bfloat16 b, int op) {
  const float x = __bfloat162float(a), y = __bfloat162float(b);
  return __float2bfloat16_rn(op ? x * y : x - y);
}
static inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162{pn_emu_bop(a.x, b.x, 0), pn_emu_bop(a.y, b.y, 0)};
}
static inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162{pn_emu_bop(a.x, b.x, 1), pn_emu_bop(a.y, b.y, 1)};
}

// ---------------------------------------------------------------- math and bit intrinsics
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
static inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcg(const T* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline float __ldcg(const float* p) { float v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
static inline double __ldcg(const double* p) { double v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---------------------------------------------------------------- atomics
template <class T> static inline T pn_emu_fetch_add(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline int atomicAdd(int* p, int v) { return pn_emu_fetch_add(p, v); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return pn_emu_fetch_add(p, v); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return pn_emu_fetch_add(p, v); }
template <class F, class U> static inline F pn_emu_cas_float_add(F* p, F v) {
  U* q = reinterpret_cast<U*>(p);
  U old = __atomic_load_n(q, __ATOMIC_RELAXED), want;
  F f;
  do { std::memcpy(&f, &old, sizeof(F)); F n = f + v; std::memcpy(&want, &n, sizeof(F)); }
  while (!__atomic_compare_exchange_n(q, &old, want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return f;
}
static inline float atomicAdd(float* p, float v) { return pn_emu_cas_float_add<float, uint32_t>(p, v); }
static inline double atomicAdd(double* p, double v) { return pn_emu_cas_float_add<double, uint64_t>(p, v); }
template <class T> static inline T pn_emu_cas(T* p, T compare, T val) {
  __atomic_compare_exchange_n(p, &compare, val, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;  // holds the old value either way
}
static inline int atomicCAS(int* p, int c, int v) { return pn_emu_cas(p, c, v); }
static inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { return pn_emu_cas(p, c, v); }
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c, unsigned long long v) { return pn_emu_cas(p, c, v); }
template <class T> static inline T pn_emu_fetch_max(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return old;
}
template <class T> static inline T pn_emu_fetch_min(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return old;
}
static inline int atomicMax(int* p, int v) { return pn_emu_fetch_max(p, v); }
static inline unsigned atomicMax(unsigned* p, unsigned v) { return pn_emu_fetch_max(p, v); }
static inline long long atomicMax(long long* p, long long v) { return pn_emu_fetch_max(p, v); }
static inline int atomicMin(int* p, int v) { return pn_emu_fetch_min(p, v); }
static inline unsigned atomicMin(unsigned* p, unsigned v) { return pn_emu_fetch_min(p, v); }
static inline long long atomicMin(long long* p, long long v) { return pn_emu_fetch_min(p, v); }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
namespace pn_emu { static inline void check_aligned(const void* p, unsigned bytes); }
// sm_90's vector atomics: each lane an atomic add (the GPU's one 16-byte reduction is atomic per
// lane too); the address must be aligned to the vector, as on the GPU.
static inline float4 atomicAdd(float4* p, float4 v) {
  pn_emu::check_aligned(p, 16);
  float* q = reinterpret_cast<float*>(p);
  return float4{atomicAdd(q, v.x), atomicAdd(q + 1, v.y), atomicAdd(q + 2, v.z), atomicAdd(q + 3, v.w)};
}
static inline float2 atomicAdd(float2* p, float2 v) {
  pn_emu::check_aligned(p, 8);
  float* q = reinterpret_cast<float*>(p);
  return float2{atomicAdd(q, v.x), atomicAdd(q + 1, v.y)};
}
static inline int atomicAnd(int* p, int v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
static inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }

// ---------------------------------------------------------------- fibers and the block scheduler
namespace pn_emu {
enum State { RUNNABLE = 0, AT_BARRIER = 1, AT_WARP = 2, DONE = 3, AT_GRID = 4, AT_CLUSTER = 5, AT_MBAR = 6 };
static const int kMaxCluster = 16;  // blocks of one thread-block cluster (sm_90, non-portable size)
static const int kMaxThreads = 1024;
// Asynchronous copies a thread has issued and not yet waited for (cuda_pipeline.h): the source is
// read at the copy, the destination written only at the __pipeline_wait_prior that covers its
// batch, so a missing or early wait leaves shared memory stale, as it may on a GPU.
// PN_MAX_ASYNC is read by runtime/emulator.py (MAX_ASYNC_COPIES): the one source of the bound the
// model's landed partials stay within (schedule/tc_tiling.py MAX_LANDED_COPIES).
#define PN_MAX_ASYNC 256
#define PN_STR_(x) #x
#define PN_STR(x) PN_STR_(x)
static const int kMaxAsync = PN_MAX_ASYNC;
struct AsyncCopy {
  void* dst;
  int size, batch;
  unsigned char data[16];
};
struct AsyncCopies {
  int n, open;  // copies pending; the batch that the next copy joins (commits so far)
  AsyncCopy c[kMaxAsync];
};
// Warpgroup MMAs (wgmma_emulation.h) a thread has issued and not yet waited for: the new
// accumulator values of each, applied to the registers only at the wgmma.wait_group that covers
// its group; `fenced`: a wgmma.fence since the thread last touched accumulator registers.
// `ops` MMAs chained into one result: their descriptors and element size, and a hash of the
// operand bytes this thread read at the issue, read again at the wait: shared memory written in
// between (by any thread) is an error, as on a GPU the MMA may read its operands until the wait.
static const int kMaxWgmma = 16;
struct WgmmaPending {
  void* acc;  // the accumulator registers (pn_wgacc::v: f32 or s32) it writes
  int n, group, ops, esize;
  unsigned long long da[kMaxWgmma], db[kMaxWgmma], hash;
  alignas(4) unsigned char v[128 * 4];  // the n new accumulator values, 4 bytes each
};
struct WgmmaState {
  int fenced, committed, n;  // committed: groups closed so far (the open group's number)
  WgmmaPending p[kMaxWgmma];
};
struct Fiber {
  jmp_buf jb;
  ucontext_t uc;
  uint3 tidx;
  int tid;
  int state;
  int started;
  const unsigned* wait_at;  // AT_GRID: the counter awaited ...
  unsigned wait_for;        // ... and the value it must reach
  AsyncCopies* async;       // allocated at the thread's first asynchronous copy
  WgmmaState* wgmma;        // allocated at the thread's first warpgroup MMA
  int cluster_arrived;      // 1 + the cluster barrier phase it arrived at and has not waited for (0: none)
  int cluster_passed;       // cluster barriers it has passed (distributed shared memory needs one)
  const struct Mbar* mbar;  // AT_MBAR: the mbarrier awaited ...
  int parity;               // ... until its phase of this parity completes
};
// An mbarrier (8 bytes of a block's PN_BLOCK_SHARED memory, as on a GPU): `count` the arrivals a
// phase needs (its top bit the phase's parity), `pending` those still missing, `tx` the bytes still
// expected (expect_tx adds, complete_tx subtracts; below zero while bytes land before their
// announcement). A phase completes when both reach zero. 0xffff: never initialized.
struct Mbar {
  unsigned short count, pending;
  int tx;
};
static_assert(sizeof(Mbar) == 8, "an mbarrier is 8 bytes");
// One block's threads and barrier bookkeeping (a plain launch reuses one for every block).
struct Block;
// The blocks of one thread-block cluster and its barrier: `live` threads not yet exited, `arrived`
// of them at the cluster barrier now, `phase` the barriers completed.
struct Cluster {
  Block* blocks[kMaxCluster];
  int n, live, arrived, phase;
};
struct Block {
  uint3 idx;
  unsigned char* arena;  // PN_BLOCK_SHARED memory of this block (allocated at its first use)
  unsigned char* dyn;    // its dynamic shared memory (allocated at its first use), `dyn_cap` bytes
  size_t dyn_cap;
  Cluster* cluster;      // the block's cluster (nullptr outside a cluster launch) and its rank in it
  int cluster_rank;
  Fiber* fibers;
  int live, barrier_count;
  int warp_count[kMaxThreads / 32];
  unsigned long long warp_slot[kMaxThreads];
};
static const int kStack = 64 * 1024;
static const long long kMaxCooperativeThreads = 1 << 18;  // fibers of one cooperative launch (a GPU holds at most SMs x 2048 threads)
static Fiber fibers[kMaxThreads];
static Block single;  // the block of a plain launch
static char* stacks = nullptr;
static Fiber* cur = nullptr;
static Block* blk = &single;  // the block whose fibers run now
static jmp_buf sched_jb;
static uint3 block_dim, grid_dim;
static int nthreads = 0;
static void (*entry)(void**) = nullptr;
static void** entry_args = nullptr;
static const char* error = nullptr;
static char error_text[320];
static const int kMaxMbars = 256;  // mbarriers initialized in one cluster's run (checked at its end)
static Mbar* mbars[kMaxMbars];
static int n_mbars = 0;
static const size_t kArena = 256 * 1024;
static size_t arena_used = 0;  // bytes the declarations seen so far take (offsets are per library)
static inline size_t shared_slot(size_t bytes) {
  size_t at = (arena_used + 15) / 16 * 16;
  arena_used = at + bytes;
  return at;
}
static inline unsigned char* arena_of(Block* b) {
  if (!b->arena) {
    b->arena = static_cast<unsigned char*>(std::malloc(kArena));
    std::memset(b->arena, 0xff, kArena);
  }
  return b->arena;
}
static size_t dyn_bytes = 0;  // the launch's dynamic shared memory (the shared_mem launch argument)
static unsigned char no_dynamic[kArena];  // what a kernel launched without dynamic shared memory gets (an error)
// Sets the next launch's dynamic shared memory; an error past kArena (more than any GPU's opt-in maximum).
static inline const char* set_dynamic(size_t bytes) {
  dyn_bytes = bytes;
  return bytes <= kArena ? nullptr : "dynamic shared memory: more bytes than the emulator's 256 KB arena";
}
// This block's dynamic shared memory (PN_DYNAMIC_SHARED): its own buffer, 16-byte aligned.
static inline unsigned char* dynamic_shared() {
  if (dyn_bytes == 0) {
    if (!error) error = "extern __shared__: a kernel that uses dynamic shared memory launched with none";
    return no_dynamic;
  }
  if (blk->dyn_cap < dyn_bytes) {  // a block's first use, or a launch asking for more than the last
    std::free(blk->dyn);
    blk->dyn = static_cast<unsigned char*>(std::aligned_alloc(16, (dyn_bytes + 15) / 16 * 16));
    blk->dyn_cap = dyn_bytes;
    std::memset(blk->dyn, 0xff, dyn_bytes);
  }
  return blk->dyn;
}
static inline unsigned char* block_shared(size_t at, size_t bytes) {
  if (at + bytes > kArena) {
    if (!error) error = "PN_BLOCK_SHARED: the block's shared memory exceeds the emulator's 256 KB arena";
    static unsigned char scratch[16];
    return scratch;
  }
  return arena_of(blk) + at;
}

// Records the launch's first fault (the launcher returns it once the block finishes): what a
// GPU reports as a sticky launch error must fail the emulated launch too.
static inline void check_aligned(const void* p, unsigned bytes) {
  if ((uintptr_t)p % bytes == 0 || error) return;
  std::snprintf(error_text, sizeof error_text,
                "misaligned address: a %u-byte vector load from %p (a GPU raises cudaErrorMisalignedAddress)", bytes, p);
  error = error_text;
}

static inline void yield() {
  if (!_setjmp(cur->jb)) _longjmp(sched_jb, 1);
}
static inline void release_barrier(Block* b) {
  b->barrier_count = 0;
  for (int t = 0; t < nthreads; ++t)
    if (b->fibers[t].state == AT_BARRIER) b->fibers[t].state = RUNNABLE;
}
static inline void release_cluster(Cluster* c) {
  c->arrived = 0;
  c->phase++;
  for (int b = 0; b < c->n; ++b)
    for (int t = 0; t < nthreads; ++t)
      if (c->blocks[b]->fibers[t].state == AT_CLUSTER) c->blocks[b]->fibers[t].state = RUNNABLE;
}
static void fiber_main() {
  for (;;) {  // a plain launch reuses a fiber for the same thread index of every block
    cur->cluster_arrived = cur->cluster_passed = 0;
    entry(entry_args);
    std::free(cur->async);  // copies never waited for never land
    cur->async = nullptr;
    if (cur->wgmma && cur->wgmma->n && !error)
      error = "wgmma.mma_async: the thread exited with MMAs never waited for (wgmma.wait_group)";
    std::free(cur->wgmma);
    cur->wgmma = nullptr;
    cur->state = DONE;
    blk->live--;
    // An exited thread no longer takes part in barriers: release them if it was the last awaited.
    if (blk->barrier_count > 0 && blk->barrier_count == blk->live) release_barrier(blk);
    if (Cluster* c = blk->cluster) {  // likewise the cluster barrier
      c->live--;
      if (c->arrived > 0 && c->arrived == c->live) release_cluster(c);
    }
    yield();
  }
}
static inline void syncthreads() {
  cur->state = AT_BARRIER;
  if (++blk->barrier_count == blk->live) release_barrier(blk);  // the last to arrive releases everybody, then yields too
  yield();
}
// cluster.sync(): every live thread of every block of the cluster arrives, then all go on. The
// block switches out once all its threads wait, so the cluster's other blocks run meanwhile.
static inline void cluster_sync() {
  Cluster* c = blk->cluster;
  if (!c) {
    if (!error) error = "cluster.sync() in a launch without thread-block clusters";
    return;
  }
  if (cur->cluster_arrived) {
    if (!error) error = "cluster.sync() after barrier_arrive() without its barrier_wait()";
    return;
  }
  cur->state = AT_CLUSTER;
  if (++c->arrived == c->live) release_cluster(c);
  yield();
  cur->cluster_passed++;
}
// The split cluster barrier (barrier.cluster.arrive / wait): a thread arrives and goes on; its
// wait returns once every live thread of the cluster has arrived at that phase.
static inline void cluster_arrive() {
  Cluster* c = blk->cluster;
  if (!c || cur->cluster_arrived) {
    if (!error) error = !c ? "barrier_arrive() in a launch without thread-block clusters"
                           : "barrier_arrive() twice without a barrier_wait() between";
    return;
  }
  cur->cluster_arrived = c->phase + 1;
  if (++c->arrived == c->live) release_cluster(c);
}
static inline void cluster_wait() {
  Cluster* c = blk->cluster;
  if (!c || !cur->cluster_arrived) {
    if (!error) error = "barrier_wait() without a barrier_arrive() before it";
    return;
  }
  if (c->phase < cur->cluster_arrived) {  // the phase it arrived at is not complete yet
    cur->state = AT_CLUSTER;
    yield();
  }
  cur->cluster_arrived = 0;
  cur->cluster_passed++;
}
// The address `p` (this block's PN_BLOCK_SHARED memory) in the shared memory of the cluster's block
// `rank`: distributed shared memory. A block that has exited has no shared memory left to read.
template <class T> static inline T* map_shared_rank(T* p, unsigned rank) {
  Cluster* c = blk->cluster;
  if (!c || rank >= (unsigned)c->n) {
    if (!error) error = "map_shared_rank: no block of that rank in this block's cluster";
    return p;
  }
  long long off = (long long)((unsigned char*)p - arena_of(blk));
  if (off < 0 || off >= (long long)kArena) {
    if (!error) error = "map_shared_rank: the address is not shared memory of the block (PN_BLOCK_SHARED)";
    return p;
  }
  Block* peer = c->blocks[rank];
  if ((int)rank != blk->cluster_rank && cur->cluster_passed == 0 && !error) {
    std::snprintf(error_text, sizeof error_text,
                  "distributed shared memory of cluster block %u accessed before this thread passed a cluster "
                  "barrier (the block may not have started: a missing cluster barrier at the start)", rank);
    error = error_text;
  }
  if (peer->live == 0 && !error) {
    std::snprintf(error_text, sizeof error_text,
                  "distributed shared memory of cluster block %u accessed after it exited (a missing cluster "
                  "barrier before the exit or the access)", rank);
    error = error_text;
  }
  return reinterpret_cast<T*>(arena_of(peer) + off);
}
// ---- mbarriers and st.async (sm_90; codegen/mbarrier.py): bytes counted per phase
static inline int mbar_parity(const Mbar* m) { return m->count >> 15; }
static inline void mbar_progress(Mbar* m) {  // a phase whose arrivals and bytes are all in completes
  if (m->pending == 0 && m->tx == 0) {
    m->count ^= 0x8000;
    m->pending = m->count & 0x7fff;
  }
}
// The mbarrier at `p` (this block's PN_BLOCK_SHARED memory) of the cluster's block `rank`; `what`
// names the operation in an error. nullptr (and the error recorded) if there is none.
static inline Mbar* mbar_at(unsigned long long* p, int rank, const char* what) {
  Cluster* c = blk->cluster;
  long long off = (long long)((unsigned char*)p - arena_of(blk));
  if (!c || off < 0 || off + 8 > (long long)kArena || off % 8) {
    if (!error) {
      std::snprintf(error_text, sizeof error_text,
                    "%s: the mbarrier is not 8-byte aligned shared memory of a block of a thread-block cluster "
                    "(PN_BLOCK_SHARED in a cluster launch)", what);
      error = error_text;
    }
    return nullptr;
  }
  Mbar* m = reinterpret_cast<Mbar*>(arena_of(c->blocks[rank]) + off);
  if (m->count == 0xffff) {
    if (!error) {
      std::snprintf(error_text, sizeof error_text,
                    "%s: the mbarrier of cluster block %d is not initialized (mbarrier.init, then "
                    "fence.mbarrier_init and a cluster barrier, before any block uses it)", what, rank);
      error = error_text;
    }
    return nullptr;
  }
  return m;
}
static inline void mbar_init(unsigned long long* p, unsigned arrivals) {
  Cluster* c = blk->cluster;
  long long off = (long long)((unsigned char*)p - arena_of(blk));
  if (!c || off < 0 || off + 8 > (long long)kArena || off % 8 || arrivals < 1 || arrivals > 1024) {
    if (!error) error = "mbarrier.init: 1 to 1024 arrivals on 8-byte aligned PN_BLOCK_SHARED memory in a cluster launch";
    return;
  }
  if (n_mbars == kMaxMbars) {
    if (!error) error = "mbarrier.init: more than 256 mbarriers in one cluster";
    return;
  }
  Mbar* m = reinterpret_cast<Mbar*>(p);
  m->count = m->pending = (unsigned short)arrivals;
  m->tx = 0;
  mbars[n_mbars++] = m;
}
// mbarrier.arrive.expect_tx: `bytes` more to land in this phase, and this thread's arrival.
static inline void mbar_expect(unsigned long long* p, unsigned bytes) {
  Mbar* m = mbar_at(p, blk->cluster ? blk->cluster_rank : 0, "mbarrier.arrive.expect_tx");
  if (!m) return;
  m->tx += (int)bytes;
  m->pending--;
  mbar_progress(m);
}
// mbarrier.try_wait.parity in a loop: returns once the phase of that parity has completed.
static inline void mbar_wait(unsigned long long* p, unsigned parity) {
  Mbar* m = mbar_at(p, blk->cluster ? blk->cluster_rank : 0, "mbarrier.try_wait.parity");
  if (!m) return;
  while (mbar_parity(m) == (int)(parity & 1)) {
    cur->state = AT_MBAR;
    cur->mbar = m;
    cur->parity = (int)(parity & 1);
    yield();
  }
}
// st.async.shared::cluster.mbarrier::complete_tx::bytes: v written into `slot` of block `rank`
// (this block's address mapped there) and its bytes completed on that block's mbarrier `bar`.
template <class T> static inline void push(T* slot, T v, unsigned long long* bar, unsigned rank) {
  static_assert(sizeof(T) % 4 == 0, "st.async pushes 4-byte words");
  Cluster* c = blk->cluster;
  if (c && rank < (unsigned)c->n && c->blocks[rank]->live == 0 && !error) {
    std::snprintf(error_text, sizeof error_text,
                  "st.async into the shared memory of cluster block %u after it exited (a block may exit only "
                  "once its mbarrier saw every push: a skipped wait, or an expect_tx of fewer bytes than pushed)", rank);
    error = error_text;
    return;
  }
  T* dst = map_shared_rank(slot, rank);
  Mbar* m = error ? nullptr : mbar_at(bar, (int)rank, "st.async");
  if (!m) return;
  std::memcpy(dst, &v, sizeof(T));
  m->tx -= (int)sizeof(T);
  mbar_progress(m);
}
// Why an mbarrier's phase is not complete: `what` then the reason, in error_text.
static inline const char* mbar_incomplete(const char* what, const Mbar* m) {
  // bytes below zero after a completed phase (Panamera's mbarriers serve one phase each): pushed
  // beyond the count that completed it
  bool late = m->tx < 0 && mbar_parity(m) != 0;
  int n = m->pending && !late ? (int)m->pending : m->tx < 0 ? -m->tx : m->tx;
  const char* why =
      late ? "byte(s) landed beyond those its expect_tx announced, after its phase completed (fewer bytes expected "
             "than pushed)"
      : m->pending ? "arrival(s) missing (a missing mbarrier.arrive.expect_tx)"
      : m->tx > 0  ? "byte(s) announced by expect_tx that no push delivers (more bytes expected than pushed)"
                   : "byte(s) landed beyond those its expect_tx announced (fewer bytes expected than pushed)";
  std::snprintf(error_text, sizeof error_text, "%s: %d %s", what, n, why);
  return error_text;
}
static inline const char* mbar_deadlock(const Mbar* m) {
  return mbar_incomplete("deadlock: threads wait on an mbarrier whose phase never completes", m);
}
// At a cluster's end: every mbarrier's last phase complete, no byte beyond those announced.
static inline const char* mbar_leftover() {
  for (int k = 0; k < n_mbars; ++k)
    if (mbars[k]->tx != 0 || mbars[k]->pending != (mbars[k]->count & 0x7fff))
      return mbar_incomplete("mbarrier: a phase left incomplete when the cluster exited", mbars[k]);
  return nullptr;
}
static inline int warp_members(int w) {
  int first = w * 32, n = nthreads - first;
  return n < 32 ? n : 32;
}
// Rendezvous of the lanes of one warp: publish, wait for all, read, wait again.
static inline void warp_barrier() {
  int w = cur->tid / 32;
  cur->state = AT_WARP;
  if (++blk->warp_count[w] == warp_members(w)) {
    blk->warp_count[w] = 0;
    for (int t = w * 32; t < w * 32 + warp_members(w); ++t)
      if (blk->fibers[t].state == AT_WARP) blk->fibers[t].state = RUNNABLE;
  }
  yield();
}
template <class T> static inline T shfl(T v, int src_lane, bool valid) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  blk->warp_slot[cur->tid] = bits;
  warp_barrier();
  int src = (cur->tid / 32) * 32 + src_lane;
  if (valid && src < nthreads) std::memcpy(&v, &blk->warp_slot[src], sizeof(T));
  warp_barrier();
  return v;
}
// A grid-wide wait: the thread sleeps until *counter >= target (another block's arrival).
static inline void grid_wait(const unsigned* counter, unsigned target) {
  while (__atomic_load_n(counter, __ATOMIC_ACQUIRE) < target) {
    cur->state = AT_GRID;
    cur->wait_at = counter;
    cur->wait_for = target;
    yield();
  }
}
static inline void init_fiber(Fiber& f, int t, dim3 block, char* stack) {
  f.tid = t;
  f.tidx = {(unsigned)(t % block.x), (unsigned)((t / block.x) % block.y), (unsigned)(t / (block.x * block.y))};
  f.started = 0;
  f.state = RUNNABLE;
  f.async = nullptr;
  f.wgmma = nullptr;
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = stack;
  f.uc.uc_stack.ss_size = kStack;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, fiber_main, 0);
}
static inline void reset_block(Block& b, Fiber* fs, uint3 idx) {
  b.idx = idx;
  if (b.arena) std::memset(b.arena, 0xff, arena_used < kArena ? arena_used : kArena);  // stale: NaN
  if (b.dyn && dyn_bytes) std::memset(b.dyn, 0xff, dyn_bytes < b.dyn_cap ? dyn_bytes : b.dyn_cap);
  b.fibers = fs;
  b.live = nthreads;
  b.barrier_count = 0;
  for (int w = 0; w < kMaxThreads / 32; ++w) b.warp_count[w] = 0;
}
// Runs the runnable fibers of the current block (in the order perm) until none is; whether any ran.
static inline bool run_block(const int* perm) {
  bool ran = false, again = true;
  while (again && blk->live > 0) {
    again = false;
    for (int k = 0; k < nthreads; ++k) {
      Fiber& f = blk->fibers[perm[k]];
      if (f.state != RUNNABLE) continue;
      ran = again = true;
      cur = &f;
      if (!_setjmp(sched_jb)) {
        if (!f.started) { f.started = 1; setcontext(&f.uc); }
        else _longjmp(f.jb, 1);
      }
    }
  }
  return ran;
}
static const char* kDivergent = "deadlock: threads of a block wait at different barriers (divergent __syncthreads or warp collective)";
static const char* kGridDeadlock =
    "deadlock: every block waits at a grid-wide wait (pn_grid_wait) that no block can release "
    "(a missing arrival, a wrong target, or a grid-wide wait in a launch that is not cooperative)";
static const char* kClusterDeadlock =
    "deadlock: threads of a cluster wait at a cluster barrier (cluster.sync) that not every thread of the "
    "cluster reaches (a block skipped or exited before it)";
static inline uint3 block_index(long long b, dim3 grid) {
  return {(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y), (unsigned)(b / ((long long)grid.x * grid.y))};
}
// Runs one launch. order: 0 forward, 1 reverse, 2 shuffled (by seed). Returns nullptr or an error.
static const char* launch(void (*fn)(void**), void** args, dim3 grid, dim3 block, int order, unsigned seed) {
  nthreads = (int)(block.x * block.y * block.z);
  if (nthreads <= 0 || nthreads > kMaxThreads) return "invalid block size";
  if (!stacks) stacks = (char*)std::malloc((size_t)kStack * kMaxThreads);
  entry = fn; entry_args = args; error = nullptr;
  grid_dim = {grid.x, grid.y, grid.z};
  block_dim = {block.x, block.y, block.z};
  long long nblocks = (long long)grid.x * grid.y * grid.z;
  int perm[kMaxThreads];
  blk = &single;
  for (int t = 0; t < nthreads; ++t) init_fiber(fibers[t], t, block, stacks + (size_t)t * kStack);
  unsigned long long rng = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&rng]() { rng = rng * 6364136223846793005ull + 1442695040888963407ull; return (unsigned)(rng >> 33); };
  for (long long bb = 0; bb < nblocks; ++bb) {
    long long b = order == 1 ? nblocks - 1 - bb : bb;
    if (order == 2) b = (long long)((bb * 2654435761ull + seed) % (unsigned long long)nblocks);  // a bijection only when coprime
    if (order == 2 && nblocks % 2654435761ull == 0) b = bb;
    reset_block(single, fibers, block_index(b, grid));
    for (int t = 0; t < nthreads; ++t) perm[t] = order == 1 ? nthreads - 1 - t : t;
    if (order == 2)
      for (int t = nthreads - 1; t > 0; --t) { int r = (int)(next() % (unsigned)(t + 1)); int s = perm[t]; perm[t] = perm[r]; perm[r] = s; }
    for (int t = 0; t < nthreads; ++t) fibers[t].state = RUNNABLE;
    run_block(perm);
    if (single.live > 0) {
      for (int t = 0; t < nthreads; ++t)
        if (fibers[t].state == AT_GRID) return kGridDeadlock;
      return kDivergent;
    }
    if (error) return error;
  }
  return error;
}
// Runs the blocks `idx[0..n)` at once: every thread on its own fiber, a block switched out when
// all its live threads wait (a barrier, a grid-wide wait, a cluster barrier), the blocks visited
// in the order given, the threads of each block in one order of the launch's kind. `cluster_y`
// > 1: consecutive runs of cluster_y blocks of idx form one thread-block cluster each.
static const char* run_together(const uint3* idx, long long nblocks, dim3 block, int order, unsigned seed, int cluster_y) {
  size_t total = (size_t)nblocks * nthreads;
  size_t stack_bytes = total * kStack;  // pages are touched lazily: a fiber uses a few KB of its stack
  char* st = (char*)mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (st == MAP_FAILED) return "cooperative launch: cannot map the fibers' stacks";
  Fiber* fs = new Fiber[total];
  Block* bs = new Block[nblocks]();
  long long nclusters = cluster_y > 1 ? nblocks / cluster_y : 0;
  Cluster* cs = nclusters ? new Cluster[nclusters]() : nullptr;
  n_mbars = 0;
  long long* border = new long long[nblocks];
  int perm[kMaxThreads];
  unsigned long long rng = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&rng]() { rng = rng * 6364136223846793005ull + 1442695040888963407ull; return (unsigned)(rng >> 33); };
  for (long long b = 0; b < nblocks; ++b) {
    reset_block(bs[b], fs + b * nthreads, idx[b]);
    for (int t = 0; t < nthreads; ++t) init_fiber(bs[b].fibers[t], t, block, st + ((size_t)b * nthreads + t) * kStack);
    if (cs) {
      Cluster& c = cs[b / cluster_y];
      bs[b].cluster = &c;
      bs[b].cluster_rank = (int)(b % cluster_y);
      c.blocks[c.n++] = &bs[b];
      c.live += nthreads;
    }
    border[b] = order == 1 ? nblocks - 1 - b : b;
  }
  for (int t = 0; t < nthreads; ++t) perm[t] = order == 1 ? nthreads - 1 - t : t;
  if (order == 2) {
    for (long long b = nblocks - 1; b > 0; --b) { long long r = (long long)(next() % (unsigned long long)(b + 1)); long long s = border[b]; border[b] = border[r]; border[r] = s; }
    for (int t = nthreads - 1; t > 0; --t) { int r = (int)(next() % (unsigned)(t + 1)); int s = perm[t]; perm[t] = perm[r]; perm[r] = s; }
  }
  const char* result = nullptr;
  for (long long left = nblocks; left > 0 && !result;) {
    bool progressed = false;
    for (long long k = 0; k < nblocks && !result; ++k) {
      Block& b = bs[border[k]];
      if (b.live == 0) continue;
      for (int t = 0; t < nthreads; ++t) {  // a grid-wide wait whose counter has arrived resumes
        Fiber& f = b.fibers[t];
        if (f.state == AT_GRID && __atomic_load_n(f.wait_at, __ATOMIC_ACQUIRE) >= f.wait_for) f.state = RUNNABLE;
        if (f.state == AT_MBAR && mbar_parity(f.mbar) != f.parity) f.state = RUNNABLE;  // its phase completed
      }
      blk = &b;
      progressed |= run_block(perm);
      if (b.live == 0) left--;
      if (error) result = error;
    }
    if (!progressed && left > 0 && !result) {
      bool at_grid = false, at_cluster = false;
      const Mbar* at_mbar = nullptr;
      for (size_t t = 0; t < total; ++t) {
        at_grid |= fs[t].state == AT_GRID;
        at_cluster |= fs[t].state == AT_CLUSTER;
        if (fs[t].state == AT_MBAR && !at_mbar) at_mbar = fs[t].mbar;
      }
      result = at_mbar ? mbar_deadlock(at_mbar) : at_cluster ? kClusterDeadlock : at_grid ? kGridDeadlock : kDivergent;
    }
  }
  if (!result && !error && cluster_y > 1) result = mbar_leftover();
  n_mbars = 0;
  blk = &single;
  delete[] border;
  for (long long b = 0; b < nblocks; ++b) std::free(bs[b].arena), std::free(bs[b].dyn);
  delete[] cs;
  delete[] bs;
  delete[] fs;
  munmap(st, stack_bytes);
  return result ? result : error;
}
static inline bool set_launch(void (*fn)(void**), void** args, dim3 grid, dim3 block) {
  nthreads = (int)(block.x * block.y * block.z);
  entry = fn; entry_args = args; error = nullptr;
  grid_dim = {grid.x, grid.y, grid.z};
  block_dim = {block.x, block.y, block.z};
  return nthreads > 0 && nthreads <= kMaxThreads;
}
// Runs one cooperative launch: every block resident at once (cudaLaunchCooperativeKernel).
static const char* launch_cooperative(void (*fn)(void**), void** args, dim3 grid, dim3 block, int order, unsigned seed) {
  if (!set_launch(fn, args, grid, block)) return "invalid block size";
  long long nblocks = (long long)grid.x * grid.y * grid.z;
  if (nblocks * nthreads > kMaxCooperativeThreads)
    return "a cooperative launch of more than 262144 threads is too large for the emulator";
  uint3* idx = new uint3[nblocks];
  for (long long b = 0; b < nblocks; ++b) idx[b] = block_index(b, grid);
  const char* r = run_together(idx, nblocks, block, order, seed, 1);
  delete[] idx;
  return r;
}
// Runs a launch of thread-block clusters of cluster_y blocks along y (__cluster_dims__(1, cluster_y,
// 1)): the blocks of one cluster run at once (each thread on its own fiber, as a cooperative launch
// runs the grid), one cluster after another in the launch order; blockIdx.y % cluster_y is the
// block's rank in its cluster.
static const char* launch_clusters(void (*fn)(void**), void** args, dim3 grid, dim3 block, int order, unsigned seed, int cluster_y) {
  if (!set_launch(fn, args, grid, block)) return "invalid block size";
  if (cluster_y < 1 || cluster_y > kMaxCluster || grid.y % cluster_y)
    return "invalid cluster: 1 to 16 blocks along y that divide gridDim.y";
  long long n = (long long)grid.x * (grid.y / cluster_y) * grid.z;
  uint3 idx[kMaxCluster];
  for (long long kk = 0; kk < n && !error; ++kk) {
    long long k = order == 1 ? n - 1 - kk : kk;
    if (order == 2 && n % 2654435761ull) k = (long long)((kk * 2654435761ull + seed) % (unsigned long long)n);
    uint3 c = block_index(k, dim3{grid.x, grid.y / cluster_y, grid.z});
    for (int r = 0; r < cluster_y; ++r) idx[r] = uint3{c.x, c.y * cluster_y + r, c.z};
    const char* res = run_together(idx, cluster_y, block, order, seed + (unsigned)k, cluster_y);
    if (res) return res;
  }
  return error;
}
}  // namespace pn_emu

// A vector load of sizeof(V) bytes (pn_ldv): checked for the alignment the GPU requires, then
// read byte-wise, so that a misaligned address is a launch error here rather than undefined.
template <class V, class T> static inline V pn_vload(const T* p) {
  pn_emu::check_aligned(p, sizeof(V));
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
// Its store (tensor-core staging copies raw 16-bit or int8 lanes to shared memory), checked alike.
template <class V, class T> static inline void pn_vstore(T* p, V v) {
  pn_emu::check_aligned(p, sizeof(V));
  std::memcpy(p, &v, sizeof(V));
}

// The block's dynamic shared memory (see the top of this file).
#define PN_DYNAMIC_SHARED(name) unsigned char* const name = pn_emu::dynamic_shared()
// Each block's own instance (see the top of this file); the offset is fixed at the first use.
#define PN_BLOCK_SHARED(T, name, dims)                                              \
  static const size_t name##_pn_at = pn_emu::shared_slot(sizeof(T dims));          \
  T(&name) dims = *reinterpret_cast<T(*) dims>(pn_emu::block_shared(name##_pn_at, sizeof(T dims)))

// cooperative_groups' thread-block cluster (sm_90), as the generated code uses it.
namespace cooperative_groups {
struct cluster_group {
  void sync() const { pn_emu::cluster_sync(); }
  void barrier_arrive() const { pn_emu::cluster_arrive(); }
  void barrier_wait() const { pn_emu::cluster_wait(); }
  unsigned block_rank() const { return pn_emu::blk->cluster ? (unsigned)pn_emu::blk->cluster_rank : 0u; }
  unsigned num_blocks() const { return pn_emu::blk->cluster ? (unsigned)pn_emu::blk->cluster->n : 1u; }
  template <class T> T* map_shared_rank(T* p, unsigned rank) const { return pn_emu::map_shared_rank(p, rank); }
};
static inline cluster_group this_cluster() { return cluster_group{}; }
}  // namespace cooperative_groups
#define PN_CLUSTER_DIMS(x, y, z)
// The mbarrier helpers of codegen/mbarrier.py (sm_90 PTX there), run by pn_emu.
static inline void pn_mbar_init(unsigned long long* bar, unsigned arrivals) { pn_emu::mbar_init(bar, arrivals); }
static inline void pn_mbar_fence_init() {}
static inline void pn_mbar_expect(unsigned long long* bar, unsigned bytes) { pn_emu::mbar_expect(bar, bytes); }
static inline void pn_mbar_wait(unsigned long long* bar, unsigned parity) { pn_emu::mbar_wait(bar, parity); }
template <class T> static inline void pn_push(T* slot, T v, unsigned long long* bar, unsigned rank) {
  pn_emu::push(slot, v, bar, rank);
}

#define threadIdx (pn_emu::cur->tidx)
#define blockIdx (pn_emu::blk->idx)
#define blockDim (pn_emu::block_dim)
#define gridDim (pn_emu::grid_dim)
static const int warpSize = 32;
static inline void __syncthreads() { pn_emu::syncthreads(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { pn_emu::warp_barrier(); }
// A GPU thread backs off while it polls; here a poll that fails suspends the fiber (pn_grid_wait).
static inline void __nanosleep(unsigned) {}
// discard.global.L2 of one 128-byte line: the line's values become indeterminate until written
// again; here they are poisoned (all bits set: NaN for floats) so that a read before the rewrite shows.
static inline void pn_discard_l2(void* p) { std::memset(p, 0xff, 128); }
static inline void pn_grid_wait(const unsigned* counter, unsigned target) { pn_emu::grid_wait(counter, target); }
// cuda_pipeline.h's primitives, run lazily (pn_emu::AsyncCopies): the copy reads its source now,
// commit closes the thread's current batch, and __pipeline_wait_prior(n) lands every committed
// batch but the newest n, in issue order.
static inline void __pipeline_memcpy_async(void* dst, const void* src, size_t size, size_t zfill = 0) {
  using namespace pn_emu;
  if (size != 4 && size != 8 && size != 16) {
    if (!error) error = "__pipeline_memcpy_async: the size must be 4, 8 or 16 bytes";
    return;
  }
  check_aligned(src, (unsigned)size);
  check_aligned(dst, (unsigned)size);
  if (!cur->async) {
    cur->async = static_cast<AsyncCopies*>(std::malloc(sizeof(AsyncCopies)));
    cur->async->n = cur->async->open = 0;
  }
  AsyncCopies& q = *cur->async;
  if (q.n == kMaxAsync) {
    if (!error) error = "__pipeline_memcpy_async: more than " PN_STR(PN_MAX_ASYNC) " copies of one thread in flight";
    return;
  }
  AsyncCopy& c = q.c[q.n++];
  c.dst = dst;
  c.size = (int)size;
  c.batch = q.open;
  std::memset(c.data, 0, sizeof c.data);
  std::memcpy(c.data, src, size - zfill);
}
static inline void __pipeline_commit() {
  if (pn_emu::cur->async) pn_emu::cur->async->open++;
}
static inline void __pipeline_wait_prior(size_t n) {
  pn_emu::AsyncCopies* q = pn_emu::cur->async;
  if (!q) return;
  int keep = 0;
  for (int k = 0; k < q->n; ++k) {
    pn_emu::AsyncCopy& c = q->c[k];
    if (c.batch < q->open - (int)n) std::memcpy(c.dst, c.data, c.size);
    else q->c[keep++] = c;
  }
  q->n = keep;
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = pn_emu::cur->tid % 32, seg = lane % width;
  return pn_emu::shfl(v, lane + (int)delta, seg + (int)delta < width);
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  int lane = pn_emu::cur->tid % 32, src = lane ^ mask;
  return pn_emu::shfl(v, src, (src / width) == (lane / width));
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  int lane = pn_emu::cur->tid % 32;
  return pn_emu::shfl(v, (lane / width) * width + (src_lane % width), true);
}
#include "wmma_emulation.h"  // nvcuda::wmma for the tensor-core kernels
#include "wgmma_emulation.h"  // Hopper's warpgroup MMAs (wgmma.mma_async) for the tensor-core kernels
