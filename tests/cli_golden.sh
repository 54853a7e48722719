#!/usr/bin/env bash
# cli_golden.sh: `clnsa nsa` against the golden cases of an independent
# implementation (fla-org's naive reference), compared with the hidden
# `clnsa compare` (no numpy needed): the forward's outputs and, with the
# cases' do.npy, the backward's gradients (relative L2 under 1e-4).
#
# usage: tests/cli_golden.sh CLNSA GOLDEN_DIR
#   CLNSA       the built clnsa tool
#   GOLDEN_DIR  a folder holding the unpacked cases (basic/, varlen/) or the
#               golden_<case>.tar.gz archives
# Exit 0: all agree, 1: a mismatch or an error, 77: no golden data (skip).
# CLNSA_DEVICE=P:D picks the device (see clnsa devices).
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 CLNSA GOLDEN_DIR" >&2
    exit 2
fi
clnsa=$1
golden=$2
if [ ! -d "$golden" ]; then
    echo "golden data not found at $golden: skipping"
    exit 77
fi
if [ ! -x "$clnsa" ]; then
    echo "$clnsa: not an executable" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/clnsa_golden.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0

# json_value FILE KEY: a number or a [list] of numbers at KEY (first match),
# without brackets or spaces; empty when absent or null.
json_value() {
    tr -d ' \t\r\n' <"$1" | sed -n "s/.*\"$2\":\(\[[-0-9,]*\]\|-\{0,1\}[0-9.]*\).*/\1/p" | tr -d '[]'
}

# le32 N: four little-endian bytes as a printf escape string.
le32() {
    local v=$(($1 & 0xffffffff))
    printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $((v >> 8 & 255)) $((v >> 16 & 255)) $((v >> 24 & 255))
}

# write_i32_npy PATH V1 V2 ...: a 1-D int32 .npy (format 1.0).
write_i32_npy() {
    local path=$1
    shift
    local header="{'descr': '<i4', 'fortran_order': False, 'shape': ($#,), }"
    while [ $(((10 + ${#header} + 1) % 64)) -ne 0 ]; do header="$header "; done
    local hl=$((${#header} + 1)) data="" v
    for v in "$@"; do data="$data$(le32 "$v")"; done
    {
        printf '\x93NUMPY\x01\x00'
        printf '%b' "\\x$(printf %02x $((hl & 255)))\\x$(printf %02x $((hl >> 8)))"
        printf '%s\n' "$header"
        printf '%b' "$data"
    } >"$path"
}

# make_input DIR CASE_DIR FILE...: DIR with copies of the given files
# (paths relative to CASE_DIR) and cu_seqlens.npy for a varlen case.
make_input() {
    local dir=$1 case_dir=$2
    shift 2
    mkdir -p "$dir"
    local f
    for f in "$@"; do cp "$case_dir/$f" "$dir/" || return 1; done
    if [ -n "$cu" ]; then
        # shellcheck disable=SC2086
        write_i32_npy "$dir/cu_seqlens.npy" ${cu//,/ }
    fi
}

# check NAME A B [compare options]: one comparison.
check() {
    local name=$1 a=$2 b=$3
    shift 3
    checks=$((checks + 1))
    printf '%-28s ' "$name"
    if ! "$clnsa" compare "$a" "$b" "$@"; then
        failures=$((failures + 1))
    fi
}

# nsa NAME ARGS...: runs clnsa nsa, counting a failure when it fails.
nsa() {
    local name=$1
    shift
    if ! "$clnsa" nsa "$@" >"$tmp/$name.log" 2>&1; then
        echo "$name: clnsa nsa $*: failed:"
        cat "$tmp/$name.log"
        checks=$((checks + 1))
        failures=$((failures + 1))
        return 1
    fi
}

cases=0
for c in basic varlen; do
    case_dir=$golden/$c
    if [ ! -d "$case_dir" ] && [ -f "$golden/golden_$c.tar.gz" ]; then
        mkdir -p "$tmp/golden"
        tar -xzf "$golden/golden_$c.tar.gz" -C "$tmp/golden" || exit 1
        case_dir=$tmp/golden/$c
    fi
    if [ ! -d "$case_dir" ]; then
        echo "$c: not in $golden, skipped"
        continue
    fi
    cases=$((cases + 1))
    bs=$(json_value "$case_dir/inputs/case.json" block_size)
    S=$(json_value "$case_dir/inputs/case.json" S)
    cu=$(json_value "$case_dir/inputs/case.json" cu_seqlens)
    window=$(json_value "$case_dir/nsa/case.json" window_size)
    w=$tmp/work/$c
    echo "== $c: block_size $bs, S $S, window $window${cu:+, cu_seqlens [$cu]}"

    # compression: forward and backward (dk, dv through the mean pooling)
    make_input "$w/in_cmp" "$case_dir" inputs/q.npy inputs/k.npy inputs/v.npy inputs/do.npy || exit 1
    if nsa "$c-cmp" --in "$w/in_cmp" --out "$w/cmp" --block-size "$bs" --only cmp; then
        check "$c compression o" "$w/cmp/o.npy" "$case_dir/compression/o.npy"
        check "$c compression lse" "$w/cmp/lse_cmp.npy" "$case_dir/compression/lse.npy"
        for g in dq dk dv; do
            check "$c compression $g" "$w/cmp/$g.npy" "$case_dir/compression/$g.npy"
        done
    fi

    make_input "$w/in_kc" "$case_dir" inputs/q.npy inputs/k.npy inputs/v.npy \
        compression/k_cmp.npy compression/v_cmp.npy || exit 1
    # given k_cmp/v_cmp: the same o and dq; their gradient goes to dk_cmp/dv_cmp
    cp "$case_dir/inputs/do.npy" "$w/in_kc/" || exit 1
    if nsa "$c-given-cmp" --in "$w/in_kc" --out "$w/kc" --block-size "$bs" --only cmp; then
        check "$c given k_cmp/v_cmp o" "$w/kc/o.npy" "$case_dir/compression/o.npy"
        check "$c given k_cmp/v_cmp dq" "$w/kc/dq.npy" "$case_dir/compression/dq.npy"
        for g in dk_cmp dv_cmp; do
            if [ ! -f "$w/kc/$g.npy" ]; then
                echo "$c given k_cmp/v_cmp: $g.npy not written"
                checks=$((checks + 1))
                failures=$((failures + 1))
            fi
        done
    fi

    make_input "$w/in_topk" "$case_dir" inputs/q.npy inputs/k.npy inputs/v.npy || exit 1
    if nsa "$c-topk" --in "$w/in_topk" --out "$w/topk" --block-size "$bs" --block-count "$S" --only topk; then
        # near-ties may legitimately differ: allow 1% of the rows
        check "$c top-k (as sets)" "$w/topk/block_indices.npy" "$case_dir/topk/block_indices.npy" --sets --tol 0.01
    fi

    # selection with the given indices: forward and backward
    make_input "$w/in_slc" "$case_dir" inputs/q.npy inputs/k.npy inputs/v.npy inputs/do.npy \
        selection/block_indices.npy || exit 1
    if nsa "$c-slc" --in "$w/in_slc" --out "$w/slc" --block-size "$bs" --only slc; then
        check "$c selection o" "$w/slc/o.npy" "$case_dir/selection/o.npy"
        for g in dq dk dv; do
            check "$c selection $g" "$w/slc/$g.npy" "$case_dir/selection/$g.npy"
        done
    fi

    # full NSA with the reference's own top-k: forward and backward
    make_input "$w/in_nsa" "$case_dir" inputs/q.npy inputs/k.npy inputs/v.npy inputs/g_cmp.npy \
        inputs/g_slc.npy inputs/g_swa.npy inputs/do.npy nsa/block_indices.npy || exit 1
    if nsa "$c-nsa" --in "$w/in_nsa" --out "$w/nsa" --block-size "$bs" --window "$window"; then
        check "$c nsa o" "$w/nsa/o.npy" "$case_dir/nsa/o.npy"
        for g in dq dk dv dg_cmp dg_slc dg_swa; do
            check "$c nsa $g" "$w/nsa/$g.npy" "$case_dir/nsa/$g.npy"
        done
    fi
done

if [ "$cases" -eq 0 ]; then
    echo "no golden case found in $golden: skipping"
    exit 77
fi
echo "$((checks - failures)) of $checks checks passed"
[ "$failures" -eq 0 ]
