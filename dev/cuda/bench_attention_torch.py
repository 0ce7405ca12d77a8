#!/usr/bin/env python3
"""dev/cuda/bench_attention_torch.py: PyTorch SDPA (flash / cuDNN backends) on the shapes of bench_attention.cu, for
comparison. Same layout and FLOP convention (causal: forward 2*2*B*NH*T*T*HS/2, backward 2.5x forward).
Usage: python3 dev/cuda/bench_attention_torch.py [reps]   (needs torch with CUDA; median of reps after warm-up)."""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [("gpt2-124M", 16, 1024, 12, 12, 64), ("gpt2-350M", 8, 1024, 16, 16, 64), ("hs128-gqa8", 4, 2048, 16, 8, 128)]


def median_ms(fn, reps):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, median of {reps} reps")
    for name, B, T, NH, NKV, HS in SHAPES:
        q = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
        fwd_flops = 2 * 2 * B * NH * T * T * HS / 2
        print(f"{name}: B={B} T={T} NH={NH} NKV={NKV} HS={HS}")
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    def forward():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=NKV != NH)
                    out = forward()
                    fwd_ms = median_ms(forward, reps)
                    bwd_ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps)
                print(f"  {backend.name:16s} forward {fwd_ms:8.3f} ms {fwd_flops / fwd_ms / 1e9:6.1f} TFLOP/s   "
                      f"backward {bwd_ms:8.3f} ms {2.5 * fwd_flops / bwd_ms / 1e9:6.1f} TFLOP/s")
            except RuntimeError as err:  # backend not available for this shape / build
                print(f"  {backend.name:16s} unavailable: {str(err).splitlines()[0]}")


if __name__ == "__main__":
    main()
