#!/usr/bin/env python3
"""PyTorch's dense attention (torch.nn.functional.scaled_dot_product_attention,
causal, GQA) at the anchor configuration, as a user would call it: forward and
forward+backward at each T, CUDA-event times, median of --repeat runs after a
warm-up. Prints a table and writes JSON (--json). Used by bench/gpu_bench.sh.

Each timed run starts with the device held busy by a sleep kernel while the
host enqueues the events and the calls, so the events time the device's work,
not Python's launch (on an idle device the start event fires at once and the
launch's 0.03-0.07 ms land inside the 8k forward's time), as `clnsa bench`
holds its commands behind a user event and a busy kernel. --chain N times N calls back to back
(inputs alternating between two sets) and counts the mean: the rate of a loop
that keeps the device busy, where its clocks settle where its power lets them.

  python3 bench/sdpa.py [--T 4096,8192] [--HQ 64] [--H 4] [--D 128] [--repeat 5] [--chain 1] [--json out.json]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

HOLD_CYCLES = 4_000_000  # about 2 ms at the H200's 1.98 GHz: longer than the host takes to enqueue a run


def time_ms(fns, repeat, chain):
    """Median over `repeat` runs of the mean time of `chain` calls, fns[i % 2] the i-th."""
    fns[0]()  # warm-up
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(HOLD_CYCLES)
        start.record()
        for i in range(chain):
            fns[i % 2]()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / chain)
    return statistics.median(times)


def make_set(a, T, dev):
    q = torch.randn(1, a.HQ, T, a.D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, a.H, T, a.D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, a.H, T, a.D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    return q, k, v, torch.randn(1, a.HQ, T, a.D, device=dev, dtype=torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="4096,8192,16384,32768,65536")
    ap.add_argument("--HQ", type=int, default=64)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chain", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda}); "
          f"SDPA causal GQA bf16 B=1 HQ={a.HQ} H={a.H} D={a.D}; median of {a.repeat}, each the mean of {a.chain} back to back")
    print(f"{'T':>8} {'fwd ms':>10} {'fwd+bwd ms':>12}")
    for T in [int(t) for t in a.T.split(",")]:
        sets = [make_set(a, T, dev) for _ in range(2)]

        def fwd(q, k, v, do):
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def fwd_bwd(q, k, v, do):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            o.backward(do)

        f = time_ms([lambda s=s: fwd(*s) for s in sets], a.repeat, a.chain)
        fb = time_ms([lambda s=s: fwd_bwd(*s) for s in sets], a.repeat, a.chain)
        rows.append({"T": T, "fwd_ms": round(f, 4), "fwd_bwd_ms": round(fb, 4)})
        print(f"{T:>8} {f:>10.3f} {fb:>12.3f}", flush=True)
        del sets
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "method": "sdpa_causal_gqa",
                       "dtype": "bf16", "HQ": a.HQ, "H": a.H, "D": a.D, "repeat": a.repeat, "chain": a.chain, "results": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
