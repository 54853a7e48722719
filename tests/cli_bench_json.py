#!/usr/bin/env python3
"""`clnsa bench --json`: every result carries its median and the range of
its runs, the median inside the range (forward, and forward+backward where
the backward ran). Usage: cli_bench_json.py CLNSA_EXE"""
import json
import os
import subprocess
import sys
import tempfile


def check(result):
    for key in ("fwd", "fwd_bwd"):
        if key + "_ms" not in result:
            continue
        lo, hi = result[key + "_range_ms"]
        med = result[key + "_ms"]
        # the JSON rounds each figure to 1e-4 ms
        if not (0 < lo <= med + 1e-4 and med <= hi + 1e-4):
            sys.exit(f"{result['method']} T={result['T']}: {key} median {med} outside its range [{lo}, {hi}]")


def main():
    exe = sys.argv[1]
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        subprocess.run([exe, "bench", "--methods", "nsa,dense", "--T", "100", "--HQ", "4", "--H", "2", "--D", "32",
                        "--block", "16", "--S", "2", "--window", "0", "--repeat", "3", "--no-startup", "--json", path],
                       check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            results = json.load(f)["results"]
    finally:
        os.remove(path)
    if sorted(r["method"] for r in results) != ["dense", "nsa"]:
        sys.exit(f"expected the nsa and dense results, got {results}")
    for r in results:
        if "fwd_bwd_range_ms" not in r:
            sys.exit(f"{r['method']}: no fwd_bwd_range_ms")
        check(r)
    print("ok:", ", ".join(f"{r['method']} fwd {r['fwd_range_ms']} fwd+bwd {r['fwd_bwd_range_ms']}" for r in results))


main()
