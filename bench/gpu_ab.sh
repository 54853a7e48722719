#!/usr/bin/env bash
# On the GPU machine, from the project root, after `bash .gpu/setup.sh`: an
# A/B comparison in one command, so that both sides share one machine state.
# First the device tests named in TESTS (bench/gpu_run.sh's tests stage, and
# its ptx stage too with PTX=1; their log in $OUT/tests/), then `clnsa bench` at T (window 0, the methods in
# METHODS, every kernel's time with --profile) with the option sets A and B
# in turn, ROUNDS times, then PyTorch's SDPA at SDPA_T (none: skipped).
# Each run's JSON is $OUT/ab_<A|B>_<round>.json; the log is $OUT/ab_log.txt.
#   A="--keep-ds 0" B="--keep-ds 1" TESTS="test_warp" bash bench/gpu_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/ab_log.txt") 2>&1
T=${T:-65536}
ROUNDS=${ROUNDS:-2}
METHODS=${METHODS:-nsa}
SDPA_T=${SDPA_T:-$T}
meson setup build-gpu --buildtype=release >/dev/null && ninja -C build-gpu >/dev/null || exit 1
if [ -n "${TESTS:-}${PTX:-}" ]; then
    stages=tests; [ "${PTX:-0}" = 1 ] && stages="tests ptx"
    OUT=$OUT/tests STAGES=$stages TESTS=${TESTS:-none} bash bench/gpu_run.sh >/dev/null 2>&1
    grep -E "^==|FAILED|PASSED|exit status|nsa_bwd" "$OUT/tests/log.txt"
fi
export CLNSA_CACHE_DIR=$PWD/build-gpu/clnsa-cache
for r in $(seq 1 "$ROUNDS"); do
    for side in A B; do
        args=${!side-}
        echo "== round $r, $side: $args"
        # shellcheck disable=SC2086 # the option set is split on purpose
        build-gpu/clnsa bench --T "$T" --window 0 --methods "$METHODS" --no-dense --no-startup --repeat 3 --profile \
            $args --json "$OUT/ab_${side}_$r.json" 2>&1 | grep -vE "^ *$"
    done
done
[ "$SDPA_T" = none ] || python3 bench/sdpa.py --T "$SDPA_T" --repeat 3 --json "$OUT/sdpa.json"
