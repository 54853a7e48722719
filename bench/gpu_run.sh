#!/usr/bin/env bash
# On the GPU machine, from the project root, after `bash .gpu/setup.sh`: builds,
# checks and times in one command. Stages (STAGES, default all, in order):
#   tests    the device tests on NVIDIA's OpenCL: test_warp (the tensor-core
#            path against the reference, every kernel and dtype it has),
#            test_warpgroup (wgmma through the sm_90a path, on an H100/H200),
#            test_split_fwd (the split forward, with its wgmma kernels on such
#            a device) and the suites whose bf16 / f16 cases now take that
#            path; test_golden
#            needs the golden cases carried: after ../shared/gpu/stage.sh,
#            mkdir -p .gpu/golden && cp ../shared/golden/*.tar.gz .gpu/golden/
#   ptx      the warp kernels' PTX (the program binaries NVIDIA's OpenCL
#            returns) for the anchor configuration, in $OUT/ptx.tgz, and
#            their registers and spills (bench/ptxas_report.py, with the
#            ptxas of the machine's Triton) in the log and ptxas.json
#   bench    `clnsa bench` at the T sweep, window 512 and 0
#   portable the portable path (CLNSA_MMA=0) at the smaller T, window 0
#   sdpa     PyTorch's scaled_dot_product_attention at the same T
#   variants the NSA forward at T=$VT, window 0, under register caps and
#            key chunks (VKC, VWG, VCAPS, VFAMILY, VMETHODS, VARGS)
#   fused    the NSA forward and training step at T=$FT with the top-k run
#            inside the forward kernel (the default) and as its own kernel
#            (CLNSA_FUSED_TOPK=0), each kernel's time (--profile)
#   tf32     f32 inputs at T=$TT: the TF32 mode (CLNSA_TF32=1) against the
#            exact FMA kernels
# CHAIN=N times every clnsa bench run and SDPA N ops back to back (--chain):
# the rate of a loop that keeps the device busy (bench/RESULTS_ROUNDS_2026-11-29.md:
# SDPA slows at the H200's power limit there, the NSA kernels do not).
# The log goes to $OUT/log.txt, JSON and plots to $OUT/results.tgz (re-made
# after each stage, so a run cut short keeps what it measured), the PTX to
# $OUT/ptx.tgz.   STAGES="tests bench" bash bench/gpu_run.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
R=${RESULTS:-/tmp/gpu_results}
mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
save() { tar -czf "$OUT/results.tgz" -C "$R" .; }
STAGES=${STAGES:-tests ptx bench portable sdpa variants fused tf32}
WINDOWS=${WINDOWS:-512 0}
FT=${FT:-65536}
TT=${TT:-16384}
Ts=${TS:-4096,8192,16384,32768,65536}
PTs=${PORTABLE_TS:-4096,16384}
VT=${VT:-16384}
repeat=${REPEAT:-3}
chain=${CHAIN:-1}
BENCH_ARGS=${BENCH_ARGS:---no-dense}
METHODS=${METHODS:-cmp,topk+slc,slc,swa,nsa}
on() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }

meson setup build-gpu --buildtype=release >/dev/null && ninja -C build-gpu >/dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export CLNSA_TEST_DEVICE=nvidia CLNSA_REQUIRE_DEVICE=1 CLNSA_CACHE_DIR=$PWD/build-gpu/clnsa-cache
build-gpu/clnsa devices 2>&1 | head -30

if on tests; then
    golden=$PWD/build-gpu/tests/golden # the kit may carry the golden cases
    if [ ! -d "$golden" ] && ls .gpu/golden/*.tar.gz >/dev/null 2>&1; then
        mkdir -p "$golden" && for f in .gpu/golden/*.tar.gz; do tar -xzf "$f" -C "$golden"; done
    fi
    [ -d "$golden" ] && export CLNSA_GOLDEN_DIR=$golden # else test_golden skips
    for t in ${TESTS:-test_warp test_warpgroup test_split_fwd test_blocksparse test_nsa_fwd test_nsa_bwd test_golden test_api test_guard test_robust test_faults}; do
        echo "== $t (NVIDIA OpenCL)"
        # the first 20 figures, then always the verdict (a long figure list hid it)
        (cd build-gpu && CLNSA_EXE=$PWD/clnsa timeout 300 "tests/$t" > "$R/$t.log" 2>&1; echo "exit status $?" >> "$R/$t.log")
        grep -E "rel L2|error|Error|differ|warp kernels" "$R/$t.log" | head -20
        grep -E "FAILED|PASSED|exit status" "$R/$t.log"
    done
fi

bench() { build-gpu/clnsa bench --repeat "$repeat" --chain "$chain" --no-startup "$@"; }

if on ptx; then
    P=/tmp/ptx_cache; rm -rf "$P" && mkdir -p "$P"
    CLNSA_CACHE_DIR=$P bench --T 4096 --methods nsa,slc --repeat 1 --no-bwd --no-dense >/dev/null 2>&1
    CLNSA_CACHE_DIR=$P bench --T 4096 --methods nsa --repeat 1 --no-dense >/dev/null 2>&1
    tar -czf "$OUT/ptx.tgz" -C "$P" .
    python3 bench/ptxas_report.py "$P" --json "$R/ptxas.json" || echo "ptxas report: no usable ptxas"
    save
fi

if on bench; then
    for w in $WINDOWS; do
        echo "== clnsa bench, window $w (the tensor-core path on bf16)"
        bench --T "$Ts" $BENCH_ARGS --window "$w" --methods "$METHODS" --json "$R/bench_w$w.json" --svg "$R/bench_w$w.svg"
        save
    done
fi

if on portable; then
    echo "== clnsa bench, portable path (CLNSA_MMA=0), window 0"
    CLNSA_MMA=0 bench --T "$PTs" $BENCH_ARGS --window 0 --methods "$METHODS" --json "$R/bench_portable.json"
    save
fi

if on sdpa; then
    python3 bench/sdpa.py --T "$Ts" --repeat "$repeat" --chain "$chain" --json "$R/sdpa.json"
    save
fi

if on variants; then
    # key chunk KC and warps per group of the families in VFAMILY (default:
    # the forward kernel's three) through a user tuning file, register caps
    # through build options
    families=${VFAMILY:-nsa_fwd_warp nsa_fwd_cmp_warp nsa_fwd_fused_warp}
    for kc in ${VKC:-64 32}; do
        for wg in ${VWG:-128 64}; do
            f=$R/tune_variant.json
            entries=""
            for fam in $families; do
                entries="$entries${entries:+, }{\"family\": \"$fam\", \"params\": {\"WG\": $wg, \"KC\": $kc}}"
            done
            printf '{"clnsa_tuning": 1, "entries": [%s]}\n' "$entries" > "$f"
            for cap in ${VCAPS:-none 128 168}; do
                opts=""; [ "$cap" != none ] && opts="-cl-nv-maxrregcount=$cap"
                echo "== variant $families KC=$kc WG=$wg regcap=$cap"
                CLNSA_TUNING_FILE=$f CLNSA_BUILD_OPTIONS=$opts bench --T "$VT" --window 0 --methods ${VMETHODS:-slc,nsa} ${VARGS:---no-bwd} --no-dense 2>&1 | tail -1
            done
        done
    done
fi

if on fused; then
    for f in 1 0; do
        echo "== NSA at T=$FT, window 0, top-k fused into the forward: $f"
        CLNSA_FUSED_TOPK=$f bench --T "$FT" --window 0 --methods nsa,topk+slc --no-dense --profile --json "$R/fused$f.json"
        save
    done
fi

if on tf32; then
    echo "== f32 at T=$TT, window 512: TF32 mode"
    CLNSA_TF32=1 bench --T "$TT" --dtype f32 --methods nsa,slc --no-dense --json "$R/tf32.json"
    echo "== f32 at T=$TT, window 512: exact (FMA)"
    bench --T "$TT" --dtype f32 --methods nsa,slc --no-dense --json "$R/f32_exact.json"
    save
fi
