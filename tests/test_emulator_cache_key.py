"""The emulator's and the CPU backend's library cache keys hash every header g++ reads: the headers
cuda_emulation.h includes (wmma_emulation.h, wgmma_emulation.h) as well as itself, so an edited
header never hands back a stale compiled library."""

from __future__ import annotations

import shutil

import pytest

from panamera.runtime import cpu, emulator

SOURCE = '#include "cuda_emulation.h"\n__global__ void k(float *x) { x[threadIdx.x] = 1.0f; }\n'


@pytest.fixture
def headers(tmp_path, monkeypatch):
    """A copy of the emulator's headers that the keys read instead of the shipped ones."""
    for h in emulator.headers():
        shutil.copy(h, tmp_path / h.name)
    monkeypatch.setattr(emulator, "HEADER", tmp_path / emulator.HEADER.name)
    return tmp_path


def test_the_header_list_is_the_headers_own_includes(headers):
    assert [h.name for h in emulator.headers()] == ["cuda_emulation.h", "wmma_emulation.h", "wgmma_emulation.h"]
    (headers / "extra_emulation.h").write_text("// new\n")
    with open(headers / "wgmma_emulation.h", "a") as f:
        f.write('#include "extra_emulation.h"\n')
    assert emulator.headers()[-1] == headers / "extra_emulation.h"  # a new include joins the key by itself


@pytest.mark.parametrize("name", ["cuda_emulation.h", "wmma_emulation.h", "wgmma_emulation.h"])
def test_changing_any_header_changes_both_keys(headers, name):
    before = emulator.library_key(SOURCE), cpu.library_path(SOURCE)
    with open(headers / name, "a") as f:
        f.write("// edited\n")
    after = emulator.library_key(SOURCE), cpu.library_path(SOURCE)
    assert before[0] != after[0] and before[1] != after[1]


def test_another_compiler_version_changes_both_keys(tmp_path, monkeypatch):
    """A g++ upgraded in place (same path, another `--version`) or another $CXX builds apart: a library
    from one compiler is never loaded for another."""
    fake = tmp_path / "g++"
    fake.write_text("#!/bin/sh\necho 'g++ (GCC) 12.2.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    emulator._identity.cache_clear()
    before = emulator.library_key(SOURCE), cpu.library_path(SOURCE)
    fake.write_text("#!/bin/sh\necho 'g++ (GCC) 13.1.0'\n")
    emulator._identity.cache_clear()  # a later process
    after = emulator.library_key(SOURCE), cpu.library_path(SOURCE)
    assert before[0] != after[0] and before[1] != after[1]
    monkeypatch.delenv("CXX")
    assert emulator.library_key(SOURCE) not in (before[0], after[0])  # the system g++ is a third
