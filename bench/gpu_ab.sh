#!/usr/bin/env bash
# On the GPU machine, from the project root, after `bash .gpu/setup.sh`: an
# A/B comparison in one command, so that both sides share one machine state.
# First the device tests named in TESTS (bench/gpu_run.sh's tests stage, and
# its ptx stage too with PTX=1; their log in $OUT/tests/), then `clnsa bench` at T (window 0, the methods in
# METHODS, every kernel's time with --profile) with the option sets A and B
# (and C to G where set) in turn, ROUNDS times, then PyTorch's SDPA at SDPA_T
# (none: skipped). REF_SRC names another source tree (an earlier commit's,
# say `git archive` into a carried folder), built into build-ref; a side
# whose options begin with "ref" runs that build's clnsa with the rest.
# Each run's JSON is $OUT/ab_<side>_<round>.json; the log is $OUT/ab_log.txt.
#   A="--keep-ds 0" B="--keep-ds 1" TESTS="test_warp" bash bench/gpu_ab.sh
#   REF_SRC=build-ref-src A="ref" B="" bash bench/gpu_ab.sh
# A side's leading VAR=value words are set in its environment:
#   A="" B="CLNSA_FUSED_TOPK=0" bash bench/gpu_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/ab_log.txt") 2>&1
T=${T:-65536}
ROUNDS=${ROUNDS:-2}
METHODS=${METHODS:-nsa}
SDPA_T=${SDPA_T:-$T}
meson setup build-gpu --buildtype=release >/dev/null && ninja -C build-gpu >/dev/null || exit 1
if [ -n "${REF_SRC:-}" ]; then
    (cd "$REF_SRC" && meson setup "$OLDPWD/build-ref" --buildtype=release >/dev/null && ninja -C "$OLDPWD/build-ref" >/dev/null) || exit 1
fi
if [ -n "${TESTS:-}${PTX:-}" ]; then
    stages=tests; [ "${PTX:-0}" = 1 ] && stages="tests ptx"
    OUT=$OUT/tests STAGES=$stages TESTS=${TESTS:-none} bash bench/gpu_run.sh >/dev/null 2>&1
    grep -E "^==|FAILED|PASSED|exit status|nsa_bwd" "$OUT/tests/log.txt"
fi
sides="A B"
for s in C D E F G; do [ -n "${!s+x}" ] && sides="$sides $s"; done
for r in $(seq 1 "$ROUNDS"); do
    for side in $sides; do
        args=${!side-}
        bin=build-gpu/clnsa
        if [ "${args%% *}" = ref ]; then
            bin=build-ref/clnsa args=${args#ref}
            export CLNSA_CACHE_DIR=$PWD/build-ref/clnsa-cache
        else
            export CLNSA_CACHE_DIR=$PWD/build-gpu/clnsa-cache
        fi
        # leading VAR=value words of a side are its environment
        envs=()
        read -ra words <<<"$args"
        while [ ${#words[@]} -gt 0 ] && [[ ${words[0]} == [A-Z]*=* ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
        args="${words[*]}"
        echo "== round $r, $side: ${envs[*]} $bin $args"
        # shellcheck disable=SC2086 # the option set is split on purpose
        env "${envs[@]}" $bin bench --T "$T" --window 0 --methods "$METHODS" --no-dense --no-startup --repeat 3 --profile \
            $args --json "$OUT/ab_${side}_$r.json" 2>&1 | grep -vE "^ *$"
    done
done
[ "$SDPA_T" = none ] || python3 bench/sdpa.py --T "$SDPA_T" --repeat 3 --json "$OUT/sdpa.json"
