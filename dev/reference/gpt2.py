#!/usr/bin/env python3
"""dev/reference/gpt2.py: the PyTorch reference GPT-2 that the GPU parity test (test/model/test_gpt2_parity.cu)
compares llm8 against, and the PyTorch baseline of the benchmarks (--time).

The model is written with our conventions so that no renaming or transposing is needed:
  - parameter names and shapes are those of llm8's ParamTable (Hugging Face GPT-2 names, nn.Linear (out, in)
    layout, wte padded to (Vp, C) with zero rows past the real vocabulary V);
  - lm_head is tied to wte; logits are sliced to [:V] for the loss (padded rows never receive gradient);
  - GELU is the tanh approximation, LayerNorm eps is 1e-5, causal attention with scale 1/sqrt(head size).

Parity mode (default) writes into --out DIR:
  model.safetensors        the initial FP32 weights by name (random GPT-2 init, or the --init file), with the model
                           sizes in the metadata.
  debug_state.safetensors  inputs (I32, B×T), targets (I32, B×T), logits (F32, B×T×V), loss (F32, shape (1,)),
                           grads.<name> (F32, every parameter, padded shape) of one forward/backward, and
                           losses (F32, steps) of `steps` AdamW steps on the same batch; hyperparameters in metadata.
  Precision choice: llm8's BF16 trainer keeps FP32 master weights and computes with their bf16 copies. The reference
  emulates that: every forward runs in FP32 (TF32 disabled) on weights ROUNDED to bf16 from the FP32 master, and the
  gradients are those w.r.t. the rounded weights; AdamW then updates the FP32 master. So the differences the test
  sees come from our bf16 activations only, not from a different set of weights.

Timing mode (--time) trains the same model with torch.compile, BF16 autocast and fused AdamW and prints one JSON
line with tokens/s.

Examples:
  python3 dev/reference/gpt2.py --preset gpt2-tiny --B 4 --T 64 --seed 1 --out /tmp/parity
  python3 dev/reference/gpt2.py --preset gpt2-124m --B 16 --T 1024 --time
"""
import argparse
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the parity test turns this exit code into a skip
    print("gpt2.py: PyTorch is not installed (pip install torch)", file=sys.stderr)
    sys.exit(77)

import harness  # noqa: E402  (after the torch check: it imports torch)

# n_layer, n_head, n_embd; every preset uses the GPT-2 vocabulary (50257 padded to 50304) and 1024 positions,
# except gpt2-tiny (short context for tests). Explicit --n_layer etc. override any of these.
PRESETS = {
    "gpt2-tiny": dict(n_layer=2, n_head=4, n_embd=256, max_seq_len=256),
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, max_seq_len=1024),
    "gpt2-350m": dict(n_layer=24, n_head=16, n_embd=1024, max_seq_len=1024),
    "gpt2-774m": dict(n_layer=36, n_head=20, n_embd=1280, max_seq_len=1024),
    "gpt2-1558m": dict(n_layer=48, n_head=25, n_embd=1600, max_seq_len=1024),
}


def param_shapes(cfg):
    """Our parameter table: (name, shape, weight_decay, init_std) in storage order; init_std 0 = constant."""
    L, C, Vp, maxT, H = cfg["n_layer"], cfg["n_embd"], cfg["padded_vocab_size"], cfg["max_seq_len"], cfg["ffn_hidden"]
    proj_std = 0.02 / math.sqrt(2 * L)
    out = [("transformer.wte.weight", (Vp, C), True, 0.02), ("transformer.wpe.weight", (maxT, C), True, 0.02)]
    for l in range(L):
        p = f"transformer.h.{l}."
        out += [
            (p + "ln_1.weight", (C,), False, 0.0), (p + "ln_1.bias", (C,), False, 0.0),
            (p + "attn.c_attn.weight", (3 * C, C), True, 0.02), (p + "attn.c_attn.bias", (3 * C,), False, 0.0),
            (p + "attn.c_proj.weight", (C, C), True, proj_std), (p + "attn.c_proj.bias", (C,), False, 0.0),
            (p + "ln_2.weight", (C,), False, 0.0), (p + "ln_2.bias", (C,), False, 0.0),
            (p + "mlp.c_fc.weight", (H, C), True, 0.02), (p + "mlp.c_fc.bias", (H,), False, 0.0),
            (p + "mlp.c_proj.weight", (C, H), True, proj_std), (p + "mlp.c_proj.bias", (C,), False, 0.0),
        ]
    out += [("transformer.ln_f.weight", (C,), False, 0.0), ("transformer.ln_f.bias", (C,), False, 0.0)]
    return out


def init_weights(cfg, seed):
    """GPT-2 init in FP32 on the CPU (reproducible): normal(0, 0.02) matrices and embeddings, residual projections
    0.02/sqrt(2L), biases 0, norm weights 1; padded vocabulary rows 0."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape, _, std in param_shapes(cfg):
        if std > 0:
            w = torch.randn(shape, generator=gen, dtype=torch.float32) * std
        elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            w = torch.ones(shape, dtype=torch.float32)
        else:
            w = torch.zeros(shape, dtype=torch.float32)
        weights[name] = w
    weights["transformer.wte.weight"][cfg["vocab_size"]:] = 0.0
    return weights


def load_weights(cfg, path):
    return harness.load_weights(param_shapes(cfg), path, "gpt2.py")


def forward(w, cfg, idx, targets=None, use_sdpa=False):
    """idx, targets (B, T) int64. Returns logits (B, T, Vp) and the mean loss over targets != -1 on logits[:V]."""
    B, T = idx.shape
    L, NH, C, V = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"]
    HS = C // NH
    eps = 1e-5
    pos = torch.arange(T, device=idx.device)
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][pos]  # (B, T, C)
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    for l in range(L):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])  # (B, T, 3C)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, HS)
        if use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))  # (B, NH, T, T)
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = att @ v  # (B, NH, T, HS)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.linear(y, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]), approximate="tanh")  # (B, T, 4C)
        x = x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    logits = F.linear(x, w["transformer.wte.weight"])  # (B, T, Vp), tied lm_head
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits[..., :V].reshape(-1, V).float(), targets.reshape(-1), ignore_index=-1)
    return logits, loss


def resolve_config(args):
    cfg = dict(PRESETS[args.preset]) if args.preset else {}
    for key in ("n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size", "padded_vocab_size", "ffn_hidden"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    for key in ("n_layer", "n_head", "n_embd"):
        if key not in cfg:
            sys.exit(f"gpt2.py: give --preset or --{key}")
    cfg.setdefault("max_seq_len", 1024)
    cfg.setdefault("vocab_size", 50257)
    cfg.setdefault("padded_vocab_size", ((cfg["vocab_size"] + 127) // 128) * 128)
    cfg.setdefault("ffn_hidden", 4 * cfg["n_embd"])
    if cfg["n_embd"] % cfg["n_head"] != 0:
        sys.exit("gpt2.py: n_embd must be a multiple of n_head")
    if cfg["padded_vocab_size"] < cfg["vocab_size"]:
        sys.exit("gpt2.py: padded_vocab_size must be >= vocab_size")
    return cfg


def run_parity(args, cfg, device):
    if args.T > cfg["max_seq_len"]:
        sys.exit(f"gpt2.py: --T {args.T} exceeds max_seq_len {cfg['max_seq_len']}")
    master = load_weights(cfg, args.init) if args.init else init_weights(cfg, args.seed)
    decay = {name: wdflag for name, _, wdflag, _ in param_shapes(cfg)}
    meta = {k: str(v) for k, v in cfg.items()}
    meta.update(arch="gpt2", preset=args.preset or "", seed=str(args.seed))
    harness.parity(args, master, lambda w, idx, tgt: forward(w, cfg, idx, tgt), decay, cfg["vocab_size"], meta,
                   device)


def run_timing(args, cfg, device):
    if device.type != "cuda":
        sys.exit("gpt2.py: --time needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    params = {n: torch.nn.Parameter(t.to(device)) for n, t in init_weights(cfg, args.seed).items()}
    decay_names = {name for name, _, wdflag, _ in param_shapes(cfg) if wdflag}

    def loss_fn(idx, tgt):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            return forward(params, cfg, idx, tgt, use_sdpa=True)[1]

    harness.time_training(params, decay_names, loss_fn, args, cfg["vocab_size"], device, "pytorch")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="model size preset")
    for key in ("n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size", "padded_vocab_size", "ffn_hidden"):
        ap.add_argument("--" + key, type=int, help="override the preset's " + key)
    harness.add_common_flags(ap)
    ap.add_argument("--time", action="store_true", help="benchmark: torch.compile + bf16 autocast + fused AdamW")
    harness.add_timing_flags(ap)
    args = ap.parse_args()
    cfg = resolve_config(args)
    device = torch.device(args.device)
    if args.time:
        run_timing(args, cfg, device)
    else:
        if not args.out:
            sys.exit("gpt2.py: give --out DIR (or --time)")
        run_parity(args, cfg, device)


if __name__ == "__main__":
    main()
