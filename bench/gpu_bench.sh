#!/usr/bin/env bash
# On the GPU machine, from the project root, after `bash .gpu/setup.sh`:
# builds, measures the device's peak rates (bench_peak: bandwidth, FP32 FMA,
# tensor-core mma.sync; the floors' denominators), runs `clnsa bench` (NSA per
# branch, dense causal baseline, start-up) and PyTorch's SDPA (dense, causal,
# GQA) in the same command, and prints both side by side. JSON, the plot and
# logs go to $OUT.
#   bash bench/gpu_bench.sh [T list, default 4096,8192,16384,32768,65536] [repeat, default 3]
# CHAIN=N times both sides N calls back to back (clnsa bench --chain, sdpa.py
# --chain): the rate of a loop that keeps the device busy, as triton's
# do_bench measured the anchors; on a power-limited GPU the two regimes differ.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
Ts=${1:-4096,8192,16384,32768,65536}
repeat=${2:-3}
chain=${CHAIN:-1}
(meson setup build-gpu --buildtype=release >/dev/null && ninja -C build-gpu clnsa bench/bench_peak >/dev/null) || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
CLNSA_TEST_DEVICE=nvidia build-gpu/bench/bench_peak --json "$OUT/peak.json" 2>&1 | tee "$OUT/peak.txt"
[ "${PEAK_ONLY:-0}" = 1 ] && exit 0
# the tool's default device is the first GPU
build-gpu/clnsa bench --T "$Ts" --repeat "$repeat" --chain "$chain" \
    --json "$OUT/clnsa_bench.json" --svg "$OUT/clnsa_bench.svg" 2>&1 | tee "$OUT/clnsa_bench.txt"
python3 bench/sdpa.py --T "$Ts" --repeat "$repeat" --chain "$chain" --json "$OUT/sdpa.json" 2>&1 | tee "$OUT/sdpa.txt"
python3 - "$OUT/clnsa_bench.json" "$OUT/sdpa.json" <<'PY' | tee "$OUT/side_by_side.txt"
import json, sys
ours, sdpa = (json.load(open(p)) for p in sys.argv[1:3])
by = {(r["T"], r["method"]): r for r in ours["results"]}
print(f"{ours['device']} / {sdpa['device']}: ms, and SDPA's time over ours (x > 1: ours is faster)")
print(f"{'T':>7} {'SDPA fwd':>9} {'nsa fwd':>9} {'x':>6} {'dense fwd':>10} {'x':>6} | {'SDPA f+b':>9} {'nsa f+b':>9} {'x':>6} {'dense f+b':>10} {'x':>6}")
for s in sdpa["results"]:
    n, d = by.get((s["T"], "nsa"), {}), by.get((s["T"], "dense"), {})
    def cell(r, key, ref):
        v = r.get(key)
        return (f"{v:9.2f}", f"{ref / v:6.2f}") if v else (f"{'-':>9}", f"{'-':>6}")
    nf, nfx = cell(n, "fwd_ms", s["fwd_ms"]); df, dfx = cell(d, "fwd_ms", s["fwd_ms"])
    nb, nbx = cell(n, "fwd_bwd_ms", s["fwd_bwd_ms"]); db, dbx = cell(d, "fwd_bwd_ms", s["fwd_bwd_ms"])
    print(f"{s['T']:>7} {s['fwd_ms']:9.2f} {nf} {nfx} {df:>10} {dfx} | {s['fwd_bwd_ms']:9.2f} {nb} {nbx} {db:>10} {dbx}")
PY
