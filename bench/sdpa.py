#!/usr/bin/env python3
"""PyTorch's dense attention (torch.nn.functional.scaled_dot_product_attention,
causal, GQA) at the anchor configuration, as a user would call it: forward and
forward+backward at each T, CUDA-event times, median of --repeat runs after a
warm-up. Prints a table and writes JSON (--json). Used by bench/gpu_bench.sh.

  python3 bench/sdpa.py [--T 4096,8192] [--HQ 64] [--H 4] [--D 128] [--repeat 5] [--json out.json]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def time_ms(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="4096,8192,16384,32768,65536")
    ap.add_argument("--HQ", type=int, default=64)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda}); "
          f"SDPA causal GQA bf16 B=1 HQ={a.HQ} H={a.H} D={a.D}; median of {a.repeat}")
    print(f"{'T':>8} {'fwd ms':>10} {'fwd+bwd ms':>12}")
    for T in [int(t) for t in a.T.split(",")]:
        q = torch.randn(1, a.HQ, T, a.D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, a.H, T, a.D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, a.H, T, a.D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(1, a.HQ, T, a.D, device=dev, dtype=torch.bfloat16)

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def fwd_bwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            o.backward(do)

        f, fb = time_ms(fwd, a.repeat), time_ms(fwd_bwd, a.repeat)
        rows.append({"T": T, "fwd_ms": round(f, 4), "fwd_bwd_ms": round(fb, 4)})
        print(f"{T:>8} {f:>10.3f} {fb:>12.3f}", flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "method": "sdpa_causal_gqa",
                       "dtype": "bf16", "HQ": a.HQ, "H": a.H, "D": a.D, "repeat": a.repeat, "results": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
