"""The C++ source of the CPU probe's library (runtime/cpu_probe.py `measure` times it): the read sum,
the triad, the column sum and the sum of exps, each timed inside one parallel region by every thread
(its entry outside the timed window), and the L1 loops and the empty region timed from Python.

>>> "pn_sum" in SOURCE and "pn_column" in SOURCE and "PN_W" not in SOURCE
True
"""

from __future__ import annotations

from ..model.cpu import LANE_VECTORS
from .cpu_team import TEAM_SOURCE

# The read rates' sum keeps PN_W = LANE_VECTORS x 16 float lanes (four AVX-512 registers)
# independent, as the generated row scans do (codegen/cpu_lanes.py): one accumulator register is
# bound by the add's latency, not by the cache. g++ -O3 -march=native, 1 thread, thread CPU time,
# medians of 20 rounds, load 8 (2026-11-25): 1 MiB (L2) 54 GB/s with one register, 74 with four;
# 16 MiB (L3) 28.6 and 28.1.
LANES = LANE_VECTORS * 16  # the read sum's and the triad's floats per block (PN_W)
COLUMN_BLOCK = 1024  # the column sum's accumulators (PN_C): 4 KiB, in L1 as the COLUMN form's block
SOURCE = (
    TEAM_SOURCE
    + r"""
#include <atomic>
#include <ctime>
#include <omp.h>
// This thread's CPU time: what it streamed while it ran (a preemption by another process is not counted).
static double pn_cpu_time() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
// Every thread of the region spins here until all have arrived: the region's entry (a passive
// pool's wake-ups) stays outside the timed window, and the threads start streaming together.
static void pn_gather(std::atomic<int>* ready, int k) {
  ready->fetch_add(1);
  while (ready->load() < k) {
  }
}
extern "C" {
// One region; each thread times `reps` sums of its share of a[0, n); *secs: the slowest thread's time.
double pn_sum(const float* a, long n, int reps, int nt, double* secs) {
  pn_team_place(nt);
  double keep = 0, worst = 0;
  std::atomic<int> ready{0};
#pragma omp parallel num_threads(nt) reduction(+ : keep) reduction(max : worst)
  {
    const long k = omp_get_num_threads(), me = omp_get_thread_num(), nb = n / PN_W;
    const long lo = nb * me / k * PN_W, hi = nb * (me + 1) / k * PN_W;
    pn_gather(&ready, (int)k);
    const double t0 = pn_cpu_time();
    for (int r = 0; r < reps; ++r) {
      __asm__ volatile("" ::: "memory");  // each repetition reads the buffer again
      float acc[PN_W] = {0};
      for (long b = lo; b < hi; b += PN_W) {
#pragma omp simd
        for (int l = 0; l < PN_W; ++l) acc[l] += a[b + l];
      }
      float s = 0;
      for (int l = 0; l < PN_W; ++l) s += acc[l];
      keep += s;
    }
    worst = pn_cpu_time() - t0;
  }
  *secs = worst;
  return keep;
}
// The same with an exp per element (a stream and a compute-bound body at once: `overlap`).
double pn_sum_exp(const float* a, long n, int reps, int nt, double* secs) {
  pn_team_place(nt);
  double keep = 0, worst = 0;
  std::atomic<int> ready{0};
#pragma omp parallel num_threads(nt) reduction(+ : keep) reduction(max : worst)
  {
    const long k = omp_get_num_threads(), me = omp_get_thread_num(), nb = n / PN_W;
    const long lo = nb * me / k * PN_W, hi = nb * (me + 1) / k * PN_W;
    pn_gather(&ready, (int)k);
    const double t0 = pn_cpu_time();
    for (int r = 0; r < reps; ++r) {
      __asm__ volatile("" ::: "memory");
      float acc[PN_W] = {0};
      for (long b = lo; b < hi; b += PN_W) {
#pragma omp simd
        for (int l = 0; l < PN_W; ++l) acc[l] += expf(a[b + l]);
      }
      float s = 0;
      for (int l = 0; l < PN_W; ++l) s += acc[l];
      keep += s;
    }
    worst = pn_cpu_time() - t0;
  }
  *secs = worst;
  return keep;
}
// The same over a as rows of PN_C floats summed into PN_C accumulators kept in L1 (the COLUMN
// form's block: codegen/cpu_kernel.py's pn_blk, a load and a store per vector).
double pn_column(const float* a, long n, int reps, int nt, double* secs) {
  pn_team_place(nt);
  double keep = 0, worst = 0;
  std::atomic<int> ready{0};
#pragma omp parallel num_threads(nt) reduction(+ : keep) reduction(max : worst)
  {
    const long k = omp_get_num_threads(), me = omp_get_thread_num(), nb = n / PN_C;
    const long lo = nb * me / k, hi = nb * (me + 1) / k;
    pn_gather(&ready, (int)k);
    const double t0 = pn_cpu_time();
    for (int r = 0; r < reps; ++r) {
      __asm__ volatile("" ::: "memory");
      float blk[PN_C] = {0};
      for (long j = lo; j < hi; ++j) {
#pragma omp simd
        for (int q = 0; q < PN_C; ++q) blk[q] += a[j * PN_C + q];
      }
      keep += blk[0] + blk[PN_C - 1];
    }
    worst = pn_cpu_time() - t0;
  }
  *secs = worst;
  return keep;
}
// The same for a triad over a, b, c [0, n).
void pn_triad(float* a, const float* b, const float* c, long n, int reps, int nt, double* secs) {
  pn_team_place(nt);
  double worst = 0;
  std::atomic<int> ready{0};
#pragma omp parallel num_threads(nt) reduction(max : worst)
  {
    const long k = omp_get_num_threads(), me = omp_get_thread_num(), nb = n / PN_W;
    const long lo = nb * me / k * PN_W, hi = nb * (me + 1) / k * PN_W;
    pn_gather(&ready, (int)k);
    const double t0 = pn_cpu_time();
    for (int r = 0; r < reps; ++r) {
      __asm__ volatile("" ::: "memory");
#pragma omp simd
      for (long i = lo; i < hi; ++i) a[i] = b[i] + 0.5f * c[i];
    }
    worst = pn_cpu_time() - t0;
  }
  *secs = worst;
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
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  const double end = t.tv_sec + 1e-9 * t.tv_nsec + gap;
  double now;
  do {
    clock_gettime(CLOCK_MONOTONIC, &t);
    now = t.tv_sec + 1e-9 * t.tv_nsec;
  } while (now < end);
  volatile int x = 0;
#pragma omp parallel num_threads(nt)
  { x = 1; }
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec - now;
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
