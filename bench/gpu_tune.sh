#!/usr/bin/env bash
# On the GPU machine, after `bash .gpu/setup.sh`: tunes kernel families for
# the anchor shape class on NVIDIA's OpenCL (a tuning file for tuning/ in
# $OUT, named after the GPU). Start-up (program cache off, cold, warm) is in
# `clnsa bench`.
#   bash bench/gpu_tune.sh [families, default all] [max seconds, default 250]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
families=${1:-all}
seconds=${2:-250}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/NVIDIA //; s/ .*//' | tr 'A-Z' 'a-z')
(meson setup build-gpu --buildtype=release >/dev/null && ninja -C build-gpu clnsa >/dev/null) || exit 1
CLNSA_CACHE_DIR=/tmp/clnsa-cache build-gpu/clnsa tune --family "$families" --T 4096 --budget 24 --repeat 5 \
    --max-seconds "$seconds" --out "$OUT/nvidia-$gpu-$families.json" 2>&1 | grep -v '\[#' | tee "$OUT/tune-$families.log"
