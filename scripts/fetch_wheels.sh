#!/usr/bin/env bash
# Download every wheel `make gpu-check` needs into wheels/ (ignored by git), on a machine that has a
# package registry, for a GPU machine that may have none: x86-64, CPython 3.12, manylinux. Copy or
# rsync the checkout with its wheels/ to the GPU machine; gpu-check installs from there
# (pip install --no-index --find-links wheels).
#
#   scripts/fetch_wheels.sh            # into ./wheels
#   scripts/fetch_wheels.sh /some/dir  # elsewhere
#
# pip resolves the dependencies of each package for the target platform, so wheels/ holds the
# whole closure (protobuf for onnx, fastrlock for CuPy, the NVRTC/headers wheels of CuPy's [ctk]).
set -euo pipefail

DEST="${1:-wheels}"
PIP="${PIP:-python3 -m pip}"

# One requirement per line. tests/test_gpu_check.py checks that these cover pyproject.toml's
# dependencies, so keep the names as they are spelled there.
PACKAGES=(
  "islpy>=2024.1"
  "numpy>=1.26"
  "networkx>=3.0"
  "ml_dtypes>=0.4"
  "onnx>=1.16"
  "click>=8.1"
  "rich>=13"
  "threadpoolctl>=3.1"
  "pytest>=8"
  "pytest-xdist>=3"
  "cupy-cuda12x[ctk]>=14"
)

mkdir -p "$DEST"
$PIP download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d "$DEST" "${PACKAGES[@]}"
echo "wheels for CPython 3.12 x86-64 in $DEST ($(ls "$DEST" | wc -l) files, $(du -sh "$DEST" | cut -f1))"
