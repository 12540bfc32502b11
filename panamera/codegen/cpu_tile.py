"""The register-tiled contraction kernel of the CPU target: a `Gemm` (schedule/cpu_gemm.py) the CPU
model routes away from the BLAS (model/cpu_tile.py `gemm_kernel`) runs as `pn_tile_gemm`, printed
once into the program's source (`TILE_SOURCE`) and called by the group's C function.

The shape is Goto's micro-kernel without his A packing (what ONNX Runtime's MLAS does for a small
M): C is cut into MR x NR tiles (MR rows, NR = NV vectors of columns), each tile's accumulators
held in MR x NV vector registers across its K loop, the innermost, one broadcast of A and one FMA
per accumulator and step. K runs in blocks of KC so that a B block (KC x NR, `KC_BYTES`: half of L1)
stays in L1 while every M tile of the panel reads it. B is read in place when it is row-major (k x n, `tb` = 0) and
N is whole panels; otherwise it is copied each call into zero-padded panels on cache lines (the only
packing; a transposed B's whole panels transposed in registers, 16 columns at a time with AVX-512, 8
with AVX2, 4 for float64). Threads share the (K chunk, N panel, M tile) tasks in contiguous shares, as a static
schedule's (the same tasks each K block): each C element is summed by one thread in K order, then (K
split: `TileShape.ksplit`, the model's choice) its chunks' partials added in chunk order, so results
are bit-stable across thread counts. Each thread packs the pieces of B (K chunk x panel) its own tasks
read, into its own buffer, so no barrier separates the pack from the tiles: with a passive OpenMP pool
a barrier a thread reaches first is a futex sleep and a wake-up (as ONNX Runtime's MLAS, whose threads
each pack the B panels of their own segment: onnxruntime/core/mlas/lib/sgemm.cpp, `MlasSgemmOperation`).
An element-wise consumer the grouping fused (schedule/cpu_epilogue.py) is the kernel's `pn_ep` lambda
(codegen/cpu_tile_epilogue.py), the template's `E`: called on each row of a tile right after the
tile's last K block (the rows still in L1), or on each row after the K split's merge; it writes the
consumer's output, so the product never makes a pass through memory of its own.

>>> "pn_tile_gemm" in TILE_SOURCE
True
"""

from __future__ import annotations

from ..model.cpu_tile import KC_BYTES, TileShape  # the shape the model prices, decided below codegen


def tile_call(tile: TileShape, ctype: str, args: str, nt: str, epilogue: bool = False) -> str:
    """The call of `pn_tile_gemm` for `tile`, with pn_gemm's arguments `args` and the threads `nt`;
    `epilogue`: the kernel's `pn_ep` lambda applied at the store (codegen/cpu_tile_epilogue.py).

    >>> tile_call(TileShape(8, 2, 16), "float", "...", "pn_nt")
    'pn_tile_gemm<float, 8, 2, 16>(..., pn_nt, 1)'
    """
    ep = ", pn_ep" if epilogue else ""
    return f"pn_tile_gemm<{ctype}, {tile.mr}, {tile.nv}, {tile.lanes}>({args}, {nt}, {tile.ksplit}{ep})"


def plan_calls(plans: tuple, ctype: str, args: str, epilogue: bool = False) -> list[str]:
    """The body lines of a contraction kernel that runs its plans (schedule/cpu_contraction.py's
    `GemmPlan`s, fewest threads decided first, the last for any call): each but the last under
    `if (pn_nt <= decided)`; a TILE plan caps the threads at its own, a BLAS plan calls `pn_gemm`
    with pn_gemm's arguments `args`.

    >>> from types import SimpleNamespace as P
    >>> one, two = P(decided=1, tile=TileShape(6, 2, 8), threads=1), P(decided=2, tile=None, threads=2)
    >>> print("\\n".join(plan_calls((one, two), "float", "...")))
      if (pn_nt <= 1) {  // the plan of a call on 1 thread(s)
        if (pn_nt > 1) pn_nt = 1;  // the plan's threads
        pn_tile_gemm<float, 6, 2, 8>(..., pn_nt, 1);
        return;
      }
      pn_gemm<float>(...);
    """
    lines = []
    for k, plan in enumerate(plans):
        last = k == len(plans) - 1
        pad = "  " if last else "    "
        if not last:
            lines.append(f"  if (pn_nt <= {plan.decided}) {{  // the plan of a call on {plan.decided} thread(s)")
        if plan.tile is None:
            lines.append(f"{pad}pn_gemm<{ctype}>({args});")
        else:
            lines.append(f"{pad}if (pn_nt > {plan.threads}) pn_nt = {plan.threads};  // the plan's threads")
            lines.append(f"{pad}{tile_call(plan.tile, ctype, args, 'pn_nt', epilogue)};")
        if not last:
            lines += [f"{pad}return;", "  }"]
    return lines


# pn_tile_gemm<T, MR, NV, L>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, count, t, nt, ks): pn_gemm's calls
# (runtime/cpu_gemm.py: `t` = (A, B, C offset, beta) per call) on `nt` OpenMP threads, K in `ks` chunks.
TILE_SOURCE = (
    r"""
#include <immintrin.h>
#include <type_traits>
#if defined(_OPENMP)
#include <omp.h>
#endif
#include <vector>
struct pn_no_ep {  // no epilogue: the tile's values are the result
  void operator()(long long, const void*, int) const {}
};
#ifndef PN_UNROLL
#define PN_UNROLL _Pragma("GCC unroll 32")
#endif
template <class T, int W> struct pn_tv { typedef T V __attribute__((vector_size(W))); };
template <class V> static inline V pn_fma(V a, V b, V c) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && sizeof(a[0]) == 4) return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
  if constexpr (sizeof(V) == 64 && sizeof(a[0]) == 8) return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#endif
#if defined(__FMA__)
  if constexpr (sizeof(V) == 32 && sizeof(a[0]) == 4) return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  if constexpr (sizeof(V) == 32 && sizeof(a[0]) == 8) return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#endif
  return a * b + c;
}
template <class V, class T> static inline V pn_bcast(const T* p) {  // a broadcast load (the load port, not a shuffle)
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && sizeof(T) == 4) return (V)_mm512_set1_ps(*p);
  if constexpr (sizeof(V) == 64 && sizeof(T) == 8) return (V)_mm512_set1_pd(*p);
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32 && sizeof(T) == 4) return (V)_mm256_broadcast_ss(p);
  if constexpr (sizeof(V) == 32 && sizeof(T) == 8) return (V)_mm256_broadcast_sd(p);
#endif
  return V{} + *p;
}
// One R x (NV vectors) tile over kn steps: acc (+)= A[R rows, kn] B[kn, NV*L]; `add`: add to C, else store.
// Every loop over R and NV unrolled and `acc` never addressed: the accumulators stay in registers (g++ 12
// otherwise kept them in a stack array, stored each K step: 12 stores a step held the AVX2 6x16 tile to a
// third of its FMA rate, 280 us on 128x32x1024 against 99 unrolled).
template <class T, int R, int NV, int W> static inline void pn_tile_mk(long long kn, const T* a, long long ars,
    long long aks, const T* b, long long bks, T* c, long long ldc, int add, int nvalid) {
  typedef typename pn_tv<T, W>::V V;
  constexpr int L = W / sizeof(T);
  V acc[R][NV];
  PN_UNROLL for (int i = 0; i < R; ++i) PN_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = V{};
  for (long long p = 0; p < kn; ++p) {
    V bv[NV];
    PN_UNROLL for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], b + p * bks + v * L, W);
    PN_UNROLL for (int i = 0; i < R; ++i) {
      V ai = pn_bcast<V>(a + i * ars + p * aks);
      PN_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = pn_fma(ai, bv[v], acc[i][v]);
    }
  }
  PN_UNROLL for (int i = 0; i < R; ++i) {
    T* ci = c + i * ldc;
    if (nvalid == NV * L) {
      PN_UNROLL for (int v = 0; v < NV; ++v) {
        V o = acc[i][v];
        if (add) { V x; __builtin_memcpy(&x, ci + v * L, W); o += x; }
        __builtin_memcpy(ci + v * L, &o, W);
      }
    } else {
      T tmp[NV * L];
      PN_UNROLL for (int v = 0; v < NV; ++v) { V o = acc[i][v]; __builtin_memcpy(tmp + v * L, &o, W); }
      for (int j = 0; j < nvalid; ++j) ci[j] = add ? ci[j] + tmp[j] : tmp[j];
    }
  }
}
template <class T, int MR, int NV, int W> static inline void pn_tile_rows(int r, long long kn, const T* a,
    long long ars, long long aks, const T* b, long long bks, T* c, long long ldc, int add, int nvalid) {
  if constexpr (MR > 1) {
    if (r < MR) { pn_tile_rows<T, MR - 1, NV, W>(r, kn, a, ars, aks, b, bks, c, ldc, add, nvalid); return; }
  }
  pn_tile_mk<T, MR, NV, W>(kn, a, ars, aks, b, bks, c, ldc, add, nvalid);
}
// A transposed B's block (rows p0..pe, at most 16, of a whole panel of NR columns, column j at bq + j ldb):
// 16 columns at a time, their 16 K values loaded as vectors and transposed in registers (four rounds of
// in-lane unpacks and 128-bit lane shuffles), then stored as the panel's rows (AVX-512, float32); with AVX2
// 8 columns by 8 K values at a time (three rounds), float64 4 by 4 (two rounds); false where none applies
// (the scalar copy runs).
template <class T, long long NR> static inline bool pn_tile_gather(T* pq, const T* bq, long long ldb, long long p0,
    long long pe, long long cols) {
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 4 && NR % 16 == 0) {
    if (cols < NR || pe - p0 > 16) return false;
    const int cnt = (int)(pe - p0);
    const __mmask16 mk = (__mmask16)((1u << cnt) - 1u);
    for (long long h = 0; h < NR; h += 16) {
      __m512 r[16], t[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_maskz_loadu_ps(mk, bq + (h + j) * ldb + p0);
      for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
      }
      for (int j = 0; j < 16; j += 4) {
        const __m512d t0 = _mm512_castps_pd(t[j]), t1 = _mm512_castps_pd(t[j + 1]);
        const __m512d t2 = _mm512_castps_pd(t[j + 2]), t3 = _mm512_castps_pd(t[j + 3]);
        r[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
      }
      for (int j = 0; j < 4; ++j) {
        t[j] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0x88);
        t[j + 4] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0xdd);
        t[j + 8] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0x88);
        t[j + 12] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0xdd);
      }
      for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
      }
      for (int c = 0; c < cnt; ++c) _mm512_storeu_ps(pq + (p0 + c) * NR + h, r[c]);
    }
    return true;
  }
#endif
#if defined(__AVX2__)
  if constexpr (sizeof(T) == 4 && NR % 8 == 0) {  // AVX2: 8 x 8 blocks, three rounds (unpacks, shuffles, lanes)
    if (cols < NR || pe - p0 > 16) return false;
    const int cnt = (int)(pe - p0);
    for (long long h = 0; h < NR; h += 8)
      for (int q0 = 0; q0 < cnt; q0 += 8) {
        const int c8 = cnt - q0 < 8 ? cnt - q0 : 8;
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(c8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 r[8], t[8];
        for (int j = 0; j < 8; ++j) {
          const T* src = bq + (h + j) * ldb + p0 + q0;
          r[j] = c8 == 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, mk);
        }
        for (int j = 0; j < 8; j += 2) {
          t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
          t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
        }
        for (int j = 0; j < 8; j += 4) {
          r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
          r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xee);
          r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
          r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xee);
        }
        for (int j = 0; j < 4; ++j) {
          t[j] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x20);
          t[j + 4] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x31);
        }
        for (int c = 0; c < c8; ++c) _mm256_storeu_ps(pq + (p0 + q0 + c) * NR + h, t[c]);
      }
    return true;
  }
  if constexpr (sizeof(T) == 8 && NR % 4 == 0) {  // float64 (AVX2, and AVX-512's 16-column panels): 4 x 4 blocks
    if (cols < NR || pe - p0 > 16) return false;
    const int cnt = (int)(pe - p0);
    for (long long h = 0; h < NR; h += 4)
      for (int q0 = 0; q0 < cnt; q0 += 4) {
        const int c4 = cnt - q0 < 4 ? cnt - q0 : 4;
        const __m256i mk = _mm256_cmpgt_epi64(_mm256_set1_epi64x(c4), _mm256_setr_epi64x(0, 1, 2, 3));
        __m256d r[4], u[4];
        for (int j = 0; j < 4; ++j) {
          const T* src = bq + (h + j) * ldb + p0 + q0;
          r[j] = c4 == 4 ? _mm256_loadu_pd(src) : _mm256_maskload_pd(src, mk);
        }
        u[0] = _mm256_unpacklo_pd(r[0], r[1]), u[1] = _mm256_unpackhi_pd(r[0], r[1]);  // K 0,2 and 1,3 paired
        u[2] = _mm256_unpacklo_pd(r[2], r[3]), u[3] = _mm256_unpackhi_pd(r[2], r[3]);
        r[0] = _mm256_permute2f128_pd(u[0], u[2], 0x20), r[1] = _mm256_permute2f128_pd(u[1], u[3], 0x20);
        r[2] = _mm256_permute2f128_pd(u[0], u[2], 0x31), r[3] = _mm256_permute2f128_pd(u[1], u[3], 0x31);
        for (int c = 0; c < c4; ++c) _mm256_storeu_pd(pq + (p0 + q0 + c) * NR + h, r[c]);
      }
    return true;
  }
#endif
  return false;
}
// The calling thread's place in the region's team (0 outside one, or without OpenMP).
static inline int pn_tile_me() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}
// B's panels in the pack a task reads: K chunk sk of panel q, rows [p0, pe) of its k x NR block (zero past n).
template <class T, long long NR> static void pn_tile_pack(T* pq, const T* b, int tb, long long ldb, long long q,
    long long n, long long p0, long long pe) {
  constexpr long long CL = 64 / sizeof(T);  // K steps a block: a cache line of a B row
  for (long long c0 = p0; c0 < pe; c0 += CL) {
    const long long ce = c0 + CL < pe ? c0 + CL : pe;
    if (tb && pn_tile_gather<T, NR>(pq, b + q * NR * ldb, ldb, c0, ce, n - q * NR)) {
    } else if (tb)  // B read along its rows, the block's rows of the panel in L1
      for (long long j = 0; j < NR; ++j) {
        const long long col = q * NR + j;
        for (long long p = c0; p < ce; ++p) pq[p * NR + j] = col < n ? b[col * ldb + p] : T(0);
      }
    else
      for (long long p = c0; p < ce; ++p)
        for (long long j = 0; j < NR; ++j) pq[p * NR + j] = q * NR + j < n ? b[p * ldb + q * NR + j] : T(0);
  }
}
template <class T, int MR, int NV, int L, class E = pn_no_ep> static void pn_tile_gemm(int ta, int tb, long long m,
    long long n, long long k, const T* a0, long long lda, const T* b0, long long ldb, T* c0, long long ldc,
    int count, const long long* t, int nt, int ks, const E& ep = E{}) {
  constexpr int W = L * sizeof(T);
  constexpr long long NR = NV * L, KC = """
    + str(KC_BYTES)
    + r""" / (NR * (long long)sizeof(T)) > 0 ? """
    + str(KC_BYTES)
    + r""" / (NR * (long long)sizeof(T)) : 1;  // TileShape.kc
  const long long mt = (m + MR - 1) / MR, np = (n + NR - 1) / NR, tasks = mt * np;
  const bool pack = tb || n % NR;
  const long long ars = ta ? 1 : lda, aks = ta ? lda : 1;
  if (nt > tasks * ks) nt = (int)(tasks * ks);  // every thread has a task
  const long long chunk = ks > 1 ? ((k + ks - 1) / ks + KC - 1) / KC * KC : k;  // K per chunk: whole KC blocks
  const long long nkb = chunk > 0 ? (chunk + KC - 1) / KC : 1;
  static thread_local std::vector<T> pn_ws;
  if (ks > 1 && (long long)pn_ws.size() < ks * m * n) pn_ws.resize(ks * m * n);
  T* ws = pn_ws.data();
  for (int call = 0; call < count; ++call, t += 4) {
    const T* a = a0 + t[0];
    const T* b = b0 + t[1];
    T* c = c0 + t[2];
    const int beta = (int)t[3];
    auto region = [&]() {  // on one thread no region: its team's closing barrier is a futex call (cpu_region.py)
      // The thread's tasks (K chunk, N panel, M tile), the same each K block: a contiguous share, as a static
      // schedule's (the first total % nt threads one more), so each C element is summed by one thread.
      const int me = nt > 1 ? pn_tile_me() : 0;
      const long long total = tasks * ks, per = total / nt, extra = total % nt;
      const long long lo = me * per + (me < extra ? me : extra), hi = lo + per + (me < extra ? 1 : 0);
      T* pk = nullptr;
      if (pack) {  // the thread packs the pieces (task / mt: K chunk x panel) its own tasks read: no barrier
        static thread_local std::vector<T> pn_pk;
        constexpr long long AL = 64 / sizeof(T);  // the panels' rows on cache lines: no B load splits one
        if ((long long)pn_pk.size() < np * NR * k + AL) pn_pk.resize(np * NR * k + AL);
        pk = pn_pk.data() + (AL - (long long)(((unsigned long long)pn_pk.data() / sizeof(T)) % AL)) % AL;
        for (long long piece = lo / mt; piece <= (hi - 1) / mt; ++piece) {
          const long long sk = piece / np, q = piece % np, p0 = sk * chunk, pe = p0 + chunk < k ? p0 + chunk : k;
          pn_tile_pack<T, NR>(pk + q * k * NR, b, tb, ldb, q, n, p0, pe);
        }
      }
      for (long long kb = 0; kb < nkb; ++kb) {
        for (long long task = lo; task < hi; ++task) {
          const long long sk = task / tasks, tt = task % tasks, q = tt / mt, i0 = (tt % mt) * MR, j0 = q * NR;
          const long long ks0 = sk * chunk, k0 = ks0 + kb * KC, ke = ks0 + chunk < k ? ks0 + chunk : k;
          const long long kn = ke - k0 < KC ? ke - k0 : KC;
          if (kn <= 0 && kb > 0) continue;
          const T* bq = pack ? pk + q * k * NR + k0 * NR : b + k0 * ldb + j0;
          const int nvalid = (int)(n - j0 < NR ? n - j0 : NR);
          T* out = ks > 1 ? ws + sk * m * n + i0 * n + j0 : c + i0 * ldc + j0;
          const int rows = (int)(m - i0 < MR ? m - i0 : MR);
          pn_tile_rows<T, MR, NV, W>(rows, kn > 0 ? kn : 0, a + i0 * ars + k0 * aks, ars, aks, bq, pack ? NR : ldb,
                                     out, ks > 1 ? n : ldc, kb > 0 || (ks == 1 && beta), nvalid);
          if constexpr (!std::is_same_v<E, pn_no_ep>) {  // the tile's last K block: its rows, still in L1
            if (ks == 1 && kb == nkb - 1)
              for (int r = 0; r < rows; ++r) ep(t[2] + (i0 + r) * ldc + j0, out + r * ldc, nvalid);
          }
        }
      }
      if (ks > 1) {  // the K chunks' partials merged in chunk order: the same bits on any threads
        #pragma omp barrier
        #pragma omp for schedule(static)
        for (long long i = 0; i < m; ++i) {
          for (long long j = 0; j < n; ++j) {
            T v = ws[i * n + j];
            for (long long sk = 1; sk < ks; ++sk) v += ws[sk * m * n + i * n + j];
            c[i * ldc + j] = beta ? c[i * ldc + j] + v : v;
          }
          if constexpr (!std::is_same_v<E, pn_no_ep>) ep(t[2] + i * ldc, c + i * ldc, (int)n);  // the merged row
        }
      }
    };
    if (nt > 1) {
      #pragma omp parallel num_threads(nt)
      region();
    } else {
      region();
    }
  }
}
"""
)
