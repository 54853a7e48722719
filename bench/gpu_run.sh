#!/usr/bin/env bash
# On the GPU machine, from the project root, after `bash .gpu/setup.sh`:
# builds, runs the device tests on NVIDIA's OpenCL, then times the portable
# NSA in the anchor configuration with `clnsa bench`. Logs and JSON go to $OUT.
#   bash bench/gpu_run.sh [T list, default 4096,8192,16384,32768,65536]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
Ts=${1:-4096,8192,16384,32768,65536}
repeat=${REPEAT:-3}
meson setup build-gpu --buildtype=release >/dev/null && ninja -C build-gpu >/dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
export CLNSA_TEST_DEVICE=nvidia CLNSA_REQUIRE_DEVICE=1
# golden cases: the kit may carry them (.gpu/golden/*.tar.gz); shared/ does not travel
golden=$PWD/build-gpu/tests/golden
if [ ! -d "$golden" ] && ls .gpu/golden/*.tar.gz >/dev/null 2>&1; then
    mkdir -p "$golden" && for f in .gpu/golden/*.tar.gz; do tar -xzf "$f" -C "$golden"; done
fi
build-gpu/clnsa devices > "$OUT/devices.txt" 2>&1 || true
for t in build-gpu/tests/test_nsa_fwd build-gpu/tests/test_nsa_bwd build-gpu/tests/test_golden build-gpu/tests/test_api \
         build-gpu/tests/test_blocksparse build-gpu/tests/test_guard build-gpu/tests/test_faults build-gpu/tests/test_tuning; do
    [ -x "$t" ] || continue
    echo "== $t (NVIDIA OpenCL)"
    [ -d "$golden" ] && export CLNSA_GOLDEN_DIR=$golden # else test_golden skips
    (cd build-gpu && CLNSA_EXE=$PWD/clnsa timeout 300 "../$t" 2>&1 | tail -6) | tee -a "$OUT/tests.txt"
done
# the tensor-core products (opt-in, cl/mma_nv.h) against the reference too
for t in build-gpu/tests/test_nsa_fwd build-gpu/tests/test_blocksparse build-gpu/tests/test_guard; do
    echo "== $t (NVIDIA OpenCL, CLNSA_MMA=1)"
    (cd build-gpu && CLNSA_MMA=1 timeout 300 "../$t" 2>&1 | tail -3) | tee -a "$OUT/tests.txt"
done
echo "== clnsa bench (portable path, NVIDIA OpenCL; SDPA beside it: bench/gpu_bench.sh)"
build-gpu/clnsa bench --T "$Ts" --repeat "$repeat" --json "$OUT/bench_nvidia.json" 2>&1 | tee "$OUT/bench.txt"
