"""Long rows against QuACK's measured bandwidth (issue 25): Panamera's modeled plan of each
workload of the `long_rows` suite, in QuACK's own byte counts, next to what QuACK measured on an
H100 at the same shape (CALIBRATION.md Q: bf16 RMSNorm, softmax and cross-entropy at 32Kx65K,
16Kx131K, 8Kx262K; the QuACK blog's fp32 softmax at 16Kx131K and 8Kx262K, 3.01 TB/s).

Modeled figures only: no timed test asserts them (docs/GPU_MODEL.md). `versus_quack()` is what
the issue's target (at least 0.95x QuACK's bandwidth at every QuACK shape) is read from.

>>> quack_bytes("softmax", 1, 4, "bfloat16")
16
"""

from __future__ import annotations

from ..compiler import compile as pn_compile
from ..model.estimate import estimate
from ..model.gpu import H100, GPUSpec
from .calibration import Q_GBPS, Q_SHAPES
from .suites import LONG_ROW_PATTERNS, LONG_ROW_SHAPES, long_row

ITEMSIZE = {"bfloat16": 2, "float32": 4}
# The QuACK blog (media/2025-07-10-membound-sol.md): fp32 softmax at 16Kx131K and 8Kx262K, 3.01 TB/s.
QUACK_FP32 = {("softmax", (16384, 131072)): 3010.0, ("softmax", (8192, 262144)): 3010.0}


def quack_bytes(pattern: str, M: int, N: int, dtype: str) -> int:
    """QuACK's byte count of one call (benchmarks/benchmark_*.py): the row read and written
    (RMSNorm: and its weight read), cross-entropy the row read and the per-row outputs."""
    e = ITEMSIZE[dtype]
    if pattern == "rms_norm":
        return 2 * M * N * e + 2 * N
    if pattern == "cross_entropy":
        return (M * N + 2 * M) * e
    return 2 * M * N * e


def quack_measured(pattern: str, shape: tuple[int, int], dtype: str) -> float | None:
    """QuACK's measured GB/s at this workload, or None where it published none."""
    if dtype == "float32":
        return QUACK_FP32.get((pattern, shape))
    if shape not in Q_SHAPES or (pattern, "quack") not in Q_GBPS:
        return None
    return Q_GBPS[(pattern, "quack")][Q_SHAPES.index(shape)]


def modeled(pattern: str, shape: tuple[int, int], dtype: str, gpu: GPUSpec = H100) -> dict:
    """Panamera's plan of one long-row workload as the model chooses it: its mapping, the modeled
    time and bandwidth (QuACK's byte count), the limit, and QuACK's measured bandwidth."""
    k = pn_compile(long_row(pattern, shape, dtype)(), target="emulator", gpu=gpu, use_database=False, cache=False)
    e = estimate(k.plan, gpu)
    gbps = quack_bytes(pattern, *shape, dtype) / (e.total_us * 1e3)
    q = quack_measured(pattern, shape, dtype)
    return {
        "pattern": pattern,
        "shape": shape,
        "dtype": dtype,
        "mapping": " / ".join(m.describe() for m in k.mappings),
        "modeled_us": e.total_us,
        "limit_us": e.limit_us,
        "modeled_gbps": gbps,
        "quack_gbps": q,
        "vs_quack": gbps / q if q else None,
    }


def versus_quack(gpu: GPUSpec = H100, measured_only: bool = False) -> list[dict]:
    """Every workload of the `long_rows` suite (or only those QuACK measured), modeled."""
    return [
        modeled(p, s, dt, gpu)
        for p in LONG_ROW_PATTERNS
        for dt in ("bfloat16", "float32")
        for s in LONG_ROW_SHAPES
        if not measured_only or quack_measured(p, s, dt)
    ]


def table(rows: list[dict]) -> str:
    """A markdown table of `versus_quack`'s rows."""
    out = [
        "| workload | dtype | mapping | modeled us | limit us | modeled GB/s | QuACK GB/s | vs QuACK |",
        "|---" * 8 + "|",
    ]
    for r in rows:
        q = f"{r['quack_gbps']:.0f}" if r["quack_gbps"] else "-"
        v = f"{r['vs_quack']:.3f}x" if r["vs_quack"] else "-"
        out.append(
            f"| {r['pattern']} {r['shape'][0]}x{r['shape'][1]} | {r['dtype']} | {r['mapping']} | "
            f"{r['modeled_us']:.1f} | {r['limit_us']:.1f} | {r['modeled_gbps']:.0f} | {q} | {v} |"
        )
    return "\n".join(out)


if __name__ == "__main__":  # python -m panamera.bench.long_rows
    print(table(versus_quack()))
