#!/usr/bin/env bash
# On the GPU machine, after `bash .gpu/setup.sh`: tunes the NSA kernel families
# for the anchor shape class on NVIDIA's OpenCL (JSON for tuning/ in $OUT),
# then measures start-up with the program cache cold and warm.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
(meson setup build-gpu --buildtype=release >/dev/null && ninja -C build-gpu clnsa bench/bench_startup >/dev/null) || exit 1
CLNSA_CACHE_DIR=/tmp/clnsa-cache build-gpu/clnsa tune --family all --T 4096 --budget 24 --repeat 5 --max-seconds 250 \
    --out "$OUT/nvidia-h200.json" 2>&1 | grep -v '\[#' | tee "$OUT/tune.log"
CLNSA_TEST_DEVICE=nvidia build-gpu/bench/bench_startup --T 4096 --HQ 64 --H 4 --json "$OUT/startup-h200.json"
