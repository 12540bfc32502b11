"""The nvcc backend: compiles the generated CUDA for sm_80 and sm_90 and parses `ptxas -v`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BackendError, CompileError
from .emulator import _explain

ARCHS = ("sm_80", "sm_90")
WARPGROUP_MMA = "pn_wgmma<"  # a source that issues warpgroup MMAs (codegen/wgmma_kernel.py `wgmma_helpers`)


def arch_for(source: str, arch: str) -> str:
    """The target `source` is compiled for on `arch`: sm_90's arch-specific sm_90a where it issues
    warpgroup MMAs (wgmma exists only there; compiled for sm_90 or sm_80 they trap), else `arch`.

    >>> arch_for("pn_wgmma<64, __half>(...)", "sm_90"), arch_for("pn_wgmma<64, __half>(...)", "sm_80")
    ('sm_90a', 'sm_80')
    """
    return arch + "a" if arch == "sm_90" and WARPGROUP_MMA in source else arch


@dataclass(frozen=True)
class Resources:
    kernel: str
    arch: str
    registers: int
    shared_bytes: int
    spill_stores: int
    spill_loads: int


def find_nvcc() -> str:
    for base in map(Path, sys.path):
        for sub in ("nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"):
            if (base / sub).exists():
                return str(base / sub)
    found = shutil.which("nvcc")
    if not found:
        raise BackendError("nvcc backend: nvcc not found (pip install nvidia-cuda-nvcc nvidia-cuda-cccl)")
    return found


def compile_cuda(source: str, archs=ARCHS) -> list[Resources]:
    """Compile for each arch; return the ptxas resource report of every kernel."""
    nvcc = find_nvcc()
    out: list[Resources] = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(source)
        for arch in archs:
            r = subprocess.run(
                [
                    nvcc,
                    "-cubin",
                    f"-arch={arch_for(source, arch)}",
                    "-std=c++17",
                    "-Xptxas",
                    "-v",
                    str(src),
                    "-o",
                    f"{tmp}/k.cubin",
                ],
                capture_output=True,
                text=True,
            )
            if r.returncode:
                raise CompileError(_explain(r.stderr.replace(str(src), "k.cu"), source, f"nvcc {arch}"))
            out += parse_ptxas(r.stderr, arch)
    return out


def sass(source: str, kernel: str, arch: str = "sm_90") -> str:
    """The SASS of one kernel (nvcc, then cuobjdump, which needs nvdisasm: the pip packages
    nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm). Used to check what the model assumes about
    the generated code, such as how many loads a thread keeps in flight."""
    nvcc = Path(find_nvcc())
    tools = nvcc.parent
    cuobjdump = tools / "cuobjdump"
    if not cuobjdump.exists() or not (tools / "nvdisasm").exists():
        raise BackendError(
            "sass: cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(source)
        r = subprocess.run([str(nvcc), "-cubin", f"-arch={arch_for(source, arch)}", "-std=c++17", str(src), "-o", f"{tmp}/k.cubin"],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode:
            raise CompileError(_explain(r.stderr.replace(str(src), "k.cu"), source, f"nvcc {arch}"))
        env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}
        r = subprocess.run(
            [str(cuobjdump), "-sass", "-fun", kernel, f"{tmp}/k.cubin"], capture_output=True, text=True, env=env
        )
        if r.returncode:
            raise BackendError(f"cuobjdump failed: {r.stderr.strip()[:200]}")
        return r.stdout


def parse_ptxas(text: str, arch: str) -> list[Resources]:
    res, name, spills = [], None, (0, 0)
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spills = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", line)
        if m and name:
            res.append(Resources(name, arch, int(m.group(1)), int(m.group(2) or 0), *spills))
            name = None
    return res
