#!/usr/bin/env bash
# On the GPU machine, from the project root, after `bash .gpu/setup.sh`:
# tunes FAMILIES on this device, merges the result into tuning/ and rebuilds,
# then times BENCH ROUNDS times with A = the database as it was before the
# merge (given whole as a user tuning file, so every family keeps its old
# pick) and B = the merged database. One command gives the new entries and
# the A/B in the op that says whether to keep them (the tuner times each
# kernel family alone, the op runs them together).
#   FAMILIES=blocksparse_fwd_warp,blocksparse_bwd_warp TUNE="--T 16384,65536 --window 0" \
#   BENCH="build-gpu/bench/bench_blocksparse --T 16384 --HQ 64 --H 4 --D 128 --dtype bf16 --repeat 3" \
#   bash bench/gpu_retune.sh
# BENCH is any command that takes a trailing --json FILE (bench_blocksparse,
# `build-gpu/clnsa bench ...`); it sets an environment through env (`env
# CLNSA_MMA=0 ...`). In $OUT: the tuner's file and log, the database before
# and after, each side's JSON, retune_log.txt. VENDOR (default nvidia) names
# the tuning/ file; BUILD (default build-gpu) the build folder.
# A family that had no entry in the file before falls through to the merged
# database on side A too: for it, the tuner's own list (its safe default's
# time against the pick's) is the comparison.
set -uo pipefail
OUT=${OUT:-/tmp/out}
VENDOR=${VENDOR:-nvidia}
BUILD=${BUILD:-build-gpu}
ROUNDS=${ROUNDS:-2}
TUNE=${TUNE:-} # the tuner's options beyond --family (none: its defaults)
: "${FAMILIES:?name the families to tune}" "${BENCH:?name the command to time}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/retune_log.txt") 2>&1
date -u
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
{ [ -d "$BUILD" ] || meson setup "$BUILD" --buildtype=release >/dev/null; } && ninja -C "$BUILD" >/dev/null || exit 1
db=tuning/$VENDOR.json
cp "$db" "$OUT/before-$VENDOR.json"
rm -f "$OUT/tune.json" # a file left from an earlier run must not pass for this one
echo "== tune $FAMILIES $TUNE"
# shellcheck disable=SC2086 # TUNE is split into options on purpose
"$BUILD/clnsa" tune --family "$FAMILIES" $TUNE --out "$OUT/tune.json" 2>&1 | grep -v '\[#'
[ -s "$OUT/tune.json" ] || { echo "the tuner wrote no file"; exit 1; }
"$BUILD/clnsa" tune --merge "$OUT/tune.json" --into tuning/ || exit 1
cp "$db" "$OUT/after-$VENDOR.json"
ninja -C "$BUILD" >/dev/null || exit 1
for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r, A: the database before the merge"
    # shellcheck disable=SC2086 # BENCH is a command line
    CLNSA_TUNING_FILE=$OUT/before-$VENDOR.json $BENCH --json "$OUT/retune_A_$r.json" | grep -v '^ *$'
    echo "== round $r, B: merged"
    # shellcheck disable=SC2086
    $BENCH --json "$OUT/retune_B_$r.json" | grep -v '^ *$'
done
date -u
