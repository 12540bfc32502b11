"""A CPU kernel's OpenMP parallel regions where it runs on one thread: none.

Entering a parallel region costs a libgomp team even on one thread, and its closing barrier
wakes a futex (a system call: ~0.5-2 µs on a VM, more than a small kernel's work: a MAP over
256 floats takes ~30 ns). A kernel whose decision runs it on one thread (the mapper's `threads`,
clamped in its entry) has its regions removed once, when it is rendered (`one_thread`); a kernel
the model splits across threads keeps them (its work outweighs a region's entry). The work-sharing constructs inside a region (`omp for`, `omp barrier`,
`omp single`) stay: outside any region they bind to a team of one thread, so the serial form runs
the same iterations in the same order as a region of one thread (the same bits), without the
team or its barrier.

Preconditions of `one_thread` (each refused with LegalityError, one test each in
tests/test_cpu_region.py):
1. every `omp parallel` line is one of `REGION_FORMS` (a form it does not know is not guessed at);
2. a bare region's pragma is followed by a line opening its block (`{`), so the block survives
   as a plain C++ block.
The kernel is called outside any parallel region (the program's entry, the chain's steps; a
region of the caller's would share the orphaned loops out among its team).

>>> print("\\n".join(one_thread(["#pragma omp parallel for simd schedule(static) num_threads(pn_nt)",
...                               "for (long i = 0; i < 8; ++i) y[i] = x[i];"])))
#pragma omp for simd schedule(static)
for (long i = 0; i < 8; ++i) y[i] = x[i];
"""

from __future__ import annotations

import re

from ..errors import LegalityError

REGION_FORMS = {  # a region's pragma (after "#pragma omp parallel") -> its serial form ("" drops the line)
    r"for simd schedule\(static\) num_threads\(pn_nt\)": "#pragma omp for simd schedule(static)",
    r"for schedule\(static\) num_threads\(pn_nt\)": "#pragma omp for schedule(static)",
    r"num_threads\(pn_nt\)": "",
}
_PRAGMA = re.compile(r"^(\s*)#pragma omp parallel\b\s*(.*?)\s*$")


def one_thread(lines: list[str]) -> list[str]:
    """`lines` (a kernel body) with each parallel region made serial: `parallel for [simd]` an
    orphaned `for [simd]`, a bare region's pragma dropped (its block stays)."""
    out = []
    for n, line in enumerate(lines):
        m = _PRAGMA.match(line)
        if m is None:
            out.append(line)
            continue
        form = next((serial for pat, serial in REGION_FORMS.items() if re.fullmatch(pat, m.group(2))), None)
        if form is None:
            raise LegalityError(f"cpu_region: unknown parallel region form {line.strip()!r}")
        if form:
            out.append(m.group(1) + form)
        elif n + 1 >= len(lines) or lines[n + 1].strip() != "{":
            raise LegalityError(f"cpu_region: a bare region's pragma not followed by its block: {line.strip()!r}")
    return out
