#!/usr/bin/env bash
# Installs what clnsa needs on Debian 12 (run as root). Links only against
# the OpenCL ICD loader; PoCL is the CPU device used when there is no GPU.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    build-essential meson ninja-build pkg-config python3 \
    ocl-icd-opencl-dev opencl-c-headers clinfo \
    libclblast-dev libcmocka-dev pocl-opencl-icd \
    mesa-opencl-icd oclgrind clang libclang-rt-14-dev >/dev/null
# mesa-opencl-icd (rusticl on llvmpipe, enabled by RUSTICL_ENABLE=llvmpipe),
# oclgrind, clang and its libFuzzer / sanitizer runtimes: the reliability
# matrix of .ci/matrix.sh (docs/RELIABILITY.md).
echo "install-deps: done ($(meson --version) meson, $(pkg-config --modversion clblast) CLBlast)"
