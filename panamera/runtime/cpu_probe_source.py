"""The C++ source of the CPU probe's library (runtime/cpu_probe.py `measure` times it): the read sum,
the triad, the column sum and the sum of exps, each timed inside one parallel region by every thread
(its entry outside the timed window), and the L1 loops and the empty region timed from Python.

>>> "pn_sum" in SOURCE and "pn_column" in SOURCE and "PN_W" not in SOURCE
True
"""

from __future__ import annotations

from ..model.cpu import COLUMN_BLOCK_BYTES, LANE_VECTORS
from .cpu_team import TEAM_SOURCE

# The read rates' sum keeps PN_W = LANE_VECTORS x 16 float lanes (four AVX-512 registers)
# independent, as the generated row scans do (codegen/cpu_lanes.py): one accumulator register is
# bound by the add's latency, not by the cache. g++ -O3 -march=native, 1 thread, thread CPU time,
# medians of 20 rounds, load 8 (2026-11-25): 1 MiB (L2) 54 GB/s with one register, 74 with four;
# 16 MiB (L3) 28.6 and 28.1.
LANES = LANE_VECTORS * 16  # the read sum's and the triad's floats per block (PN_W)
COLUMN_BLOCK = COLUMN_BLOCK_BYTES // 4  # the column sum's float accumulators (PN_C): the COLUMN form's block
SOURCE = (
    TEAM_SOURCE
    + r"""
#include <atomic>
#include <ctime>
#include <omp.h>
// Seconds by `clock`: CLOCK_MONOTONIC (wall) or CLOCK_THREAD_CPUTIME_ID (the time this thread ran).
static double pn_clock(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
// Every thread of the region spins here until all have arrived: the region's entry (a passive
// pool's wake-ups) stays outside the timed window, and the threads start streaming together.
static void pn_gather(std::atomic<int>* ready, int k) {
  ready->fetch_add(1);
  while (ready->load() < k) {
  }
}
// One region of `nt` threads, each running `reps` times body(lo, hi) over its share [lo, hi) of
// [0, n) in whole `unit`s, the threads started together (`pn_gather`), after one untimed run
// where `warm` (the share back in this core's caches after whatever ran there between trials). out[0]: the slowest
// thread's wall seconds; out[1]: the least share of its wall time a thread held its core (its CPU
// time over its wall time: below 1 where another process, or the hypervisor, took the core
// meanwhile, and the other threads streamed without it; runtime/cpu_probe.py drops such trials).
template <class Body>
static double pn_region(long n, long unit, int reps, int nt, int warm, double* out, const Body& body) {
  pn_team_place(nt);
  double keep = 0, worst = 0, ran = 1;
  std::atomic<int> ready{0};
#pragma omp parallel num_threads(nt) reduction(+ : keep) reduction(max : worst) reduction(min : ran)
  {
    const long k = omp_get_num_threads(), me = omp_get_thread_num(), nb = n / unit;
    const long lo = nb * me / k * unit, hi = nb * (me + 1) / k * unit;
    if (warm) keep += body(lo, hi);
    pn_gather(&ready, (int)k);
    const double w0 = pn_clock(CLOCK_MONOTONIC), c0 = pn_clock(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < reps; ++r) {
      __asm__ volatile("" ::: "memory");  // each repetition reads the buffer again
      keep += body(lo, hi);
    }
    const double cpu = pn_clock(CLOCK_THREAD_CPUTIME_ID) - c0, wall = pn_clock(CLOCK_MONOTONIC) - w0;
    worst = wall;
    ran = wall > 0 ? cpu / wall : 1.0;
  }
  out[0] = worst, out[1] = ran;
  return keep;
}
// s += op(a[i]) over [lo, hi) in PN_W independent lanes (the generated row scans' shape).
template <class Op>
static float pn_lanes_of(const float* a, long lo, long hi, const Op& op) {
  float acc[PN_W] = {0};
  for (long b = lo; b < hi; b += PN_W) {
#pragma omp simd
    for (int l = 0; l < PN_W; ++l) acc[l] += op(a[b + l]);
  }
  float s = 0;
  for (int l = 0; l < PN_W; ++l) s += acc[l];
  return s;
}
extern "C" {
// The read sum: each thread's share of a[0, n).
double pn_sum(const float* a, long n, int reps, int nt, int warm, double* out) {
  return pn_region(n, PN_W, reps, nt, warm, out, [a](long lo, long hi) {
    return pn_lanes_of(a, lo, hi, [](float x) { return x; });
  });
}
// The same with an exp per element (a stream and a compute-bound body at once: `overlap`).
double pn_sum_exp(const float* a, long n, int reps, int nt, int warm, double* out) {
  return pn_region(n, PN_W, reps, nt, warm, out, [a](long lo, long hi) {
    return pn_lanes_of(a, lo, hi, [](float x) { return expf(x); });
  });
}
// The same over a as rows of PN_C floats summed into PN_C accumulators kept in L1 (the COLUMN
// form's block, COLUMN_BLOCK_BYTES: codegen/cpu_kernel.py's pn_blk, a load and a store per vector).
double pn_column(const float* a, long n, int reps, int nt, int warm, double* out) {
  return pn_region(n, PN_C, reps, nt, warm, out, [a](long lo, long hi) {
    float blk[PN_C] = {0};
    for (long j = lo; j < hi; j += PN_C) {
#pragma omp simd
      for (int q = 0; q < PN_C; ++q) blk[q] += a[j + q];
    }
    return blk[0] + blk[PN_C - 1];
  });
}
// A triad over a, b, c [0, n): two reads and a write per element.
double pn_triad(float* a, const float* b, const float* c, long n, int reps, int nt, int warm, double* out) {
  return pn_region(n, PN_W, reps, nt, warm, out, [=](long lo, long hi) {
#pragma omp simd
    for (long i = lo; i < hi; ++i) a[i] = b[i] + 0.5f * c[i];
    return 0.0f;
  });
}
double pn_add(const float* a, long n, int reps) {
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; ++i) s += a[i];
    keep += s;
  }
  return keep;
}
// s += x in PN_W independent lanes (the generated row scans' shape): a cheap operation's throughput.
double pn_lanes(const float* a, long n, int reps) {
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    __asm__ volatile("" ::: "memory");
    float acc[PN_W] = {0};
    for (long b = 0; b + PN_W <= n; b += PN_W) {
#pragma omp simd
      for (int l = 0; l < PN_W; ++l) acc[l] += a[b + l];
    }
    for (int l = 0; l < PN_W; ++l) keep += acc[l];
  }
  return keep;
}
double pn_exp(const float* a, long n, int reps) {
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; ++i) s += expf(a[i]);
    keep += s;
  }
  return keep;
}
double pn_div(const float* a, long n, int reps) {
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; ++i) s += a[i] / (a[i] + 2.0f);
    keep += s;
  }
  return keep;
}
// An empty region's entry and exit, in seconds by the wall clock, after the caller worked alone
// for `gap` seconds (the other threads asleep or spinning meanwhile, as between a program's kernels).
double pn_entry(int nt, double gap) {
  pn_team_place(nt);
  const double end = pn_clock(CLOCK_MONOTONIC) + gap;
  double now;
  do now = pn_clock(CLOCK_MONOTONIC);
  while (now < end);
  volatile int x = 0;
#pragma omp parallel num_threads(nt)
  { x = 1; }
  return pn_clock(CLOCK_MONOTONIC) - now;
}
void pn_empty(int nt) {
  pn_team_place(nt);
  volatile int x = 0;
#pragma omp parallel num_threads(nt)
  { x = 1; }
}
}
""".replace("PN_W", str(LANES)).replace("PN_C", str(COLUMN_BLOCK))  # whole registers on AVX2 and AVX-512
)
