"""Where a CPU call's OpenMP team runs: never stacked on the caller's core.

Measured on this project's 2-vCPU KVM guest (issue 24): under OMP_WAIT_POLICY=PASSIVE (the CPU bench's
workers, and any pool that sleeps between regions) every parallel region wakes the team's threads, and
Linux places a woken thread beside its waker (wake-affine) whenever the other core is busy, even briefly.
The worker then runs on the caller's core, after the caller's static share: a 24 MiB column sum took
860 us on 1 thread and 866-882 us on 2 (100 regions each, 0 of 100 on different cores), while the
same region on distinct cores took 433-470 us. A2#7, A2#9 and softmax [6144x128] did not scale in
the 06:08 UTC bench for this reason; onnxruntime's pool does (its caller steals the late worker's work).

`pn_team_place(nt)`, called by every program entry (runtime/cpu_call.py) and the probe's regions
(runtime/cpu_probe.py) before their first region, restricts the team's other threads to the allowed
cores *other than the caller's current one* (the caller itself is never pinned). The threads are learnt
once per calling thread (libgomp keeps one pool per calling thread: the table is thread_local) and
re-pinned only when the caller has moved to another core: a `sched_getcpu` per call, `nt - 1`
`pthread_setaffinity_np` calls per move. A forked child forgets the table (`pthread_atfork`). A woken worker then starts on another core (preempting,
or behind, what runs there) instead of queueing behind the caller. Same run, same load: 2 threads
took a median 529-552 us (97-98 of 100 regions on different cores); libgomp's OMP_PROC_BIND=true,
which pins the caller too, took 511-610.

Nothing is placed (the C function returns at once) with one thread, without OpenMP, inside a
parallel region, when the caller is allowed one core only, where the user asked libgomp to bind
threads (`OMP_PROC_BIND`, read through `omp_get_proc_bind`: their placement stands), or with
PANAMERA_CPU_PLACE=0 in the environment (read when a calling thread first runs 2 threads).

The trade-off: on an idle machine the scheduler already wakes the worker on the idle core (earlier idle
probes: a 4.9 us wake, L2 reads 2.1x on 2 threads), so placement changes nothing there (measured
at load 1.8, scripts/cpu_team_ab.py, 2 threads: A2#7 638 us unplaced, 652 placed; softmax [64x30522]
571, 599); in the same C experiment, with one busy process on the other core
placement wins (above); with the cores oversubscribed (load 8 on 2) a placed worker waits for a turn
on the other core: 2 threads took a median 4000-4486 us placed against 1116-3078 unplaced, and 905-921
on one thread. There one thread is the answer; the CPU bench marks such runs untrustworthy (load > 1.5).

>>> "pn_team_place" in TEAM_SOURCE and TEAM_CALL.strip()
'pn_team_place(pn_nt);'
"""

from __future__ import annotations

TEAM_CALL = "  pn_team_place(pn_nt);\n"

# Included once per library (guarded), before the first function that calls pn_team_place.
TEAM_SOURCE = r"""#ifndef PN_TEAM_PLACE
#define PN_TEAM_PLACE
#if defined(_OPENMP) && defined(__linux__)
#include <cstdlib>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
// runtime/cpu_team.py: the team's other threads never wait behind the caller on its core.
static thread_local pthread_t pn_team_threads[256];
static thread_local int pn_team_known = 0, pn_team_cpu = -1, pn_team_off = 0;
static thread_local cpu_set_t pn_team_allowed;
// A forked child has none of the parent's pool threads: the forking thread's table (its only copy
// there) is emptied, so the child never pins a thread id of the parent's
static void pn_team_forked() { pn_team_known = 0, pn_team_cpu = -1; }
static pthread_once_t pn_team_once = PTHREAD_ONCE_INIT;
static void pn_team_atfork() { pthread_atfork(nullptr, nullptr, pn_team_forked); }
static void pn_team_place(int nt) {
  if (nt < 2 || pn_team_off || omp_in_parallel()) return;
  if (nt - 1 > pn_team_known) {  // learn the pool's threads (libgomp: one pool per calling thread)
    pthread_once(&pn_team_once, pn_team_atfork);
    const char* off = getenv("PANAMERA_CPU_PLACE");
    if ((off && off[0] == '0') || omp_get_proc_bind() != omp_proc_bind_false || nt > 256 ||
        sched_getaffinity(0, sizeof(cpu_set_t), &pn_team_allowed) || CPU_COUNT(&pn_team_allowed) < 2) {
      pn_team_off = 1;
      return;
    }
    pthread_t* seen = pn_team_threads;  // the caller's table (thread_local: each thread has its own)
#pragma omp parallel num_threads(nt)
    {
      const int me = omp_get_thread_num();
      if (me > 0) seen[me - 1] = pthread_self();
    }
    pn_team_known = nt - 1;
    pn_team_cpu = -1;
  }
  const int cpu = sched_getcpu();
  if (cpu < 0 || cpu == pn_team_cpu) return;
  cpu_set_t others = pn_team_allowed;
  CPU_CLR(cpu, &others);
  if (CPU_COUNT(&others) == 0) return;
  for (int t = 0; t < pn_team_known; ++t) pthread_setaffinity_np(pn_team_threads[t], sizeof(cpu_set_t), &others);
  pn_team_cpu = cpu;
}
#else
static inline void pn_team_place(int) {}
#endif
#endif
"""
