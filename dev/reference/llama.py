#!/usr/bin/env python3
"""dev/reference/llama.py: the PyTorch reference Llama that the GPU parity test (test/model/test_llama_parity.cu)
compares llm8 against, and the PyTorch peer of the benchmarks (--time, Hugging Face LlamaForCausalLM).

The model is written out with our conventions so that no renaming or transposing is needed:
  - parameter names and shapes are those of llm8's ParamTable for arch "llama" (Hugging Face LlamaForCausalLM names,
    nn.Linear (out, in) layout, embed_tokens / lm_head padded to (Vp, C) with zero rows past the real vocabulary V);
  - RMSNorm y = x / sqrt(mean(x^2) + eps) * weight; RoPE in the Hugging Face "rotate_half" convention (dimension i
    pairs with i + HS/2, inv_freq[i] = theta^(-2i/HS) computed in FP64 and rounded to FP32, angle = t * inv_freq in
    FP32, as llmc/kernels/rope.cu); grouped-query attention by repeating each key/value head for its NH/NKV query heads
    (here only: the CUDA kernel indexes kv head h / (NH/NKV) directly); causal softmax with scale 1/sqrt(HS);
    SwiGLU MLP down(silu(gate(x)) * up(x)); no biases; lm_head tied to embed_tokens unless --untied;
  - logits are sliced to [:V] for the loss (padded rows never receive gradient).

Parity mode (default) writes into --out DIR exactly what dev/reference/gpt2.py writes (same CLI, same files):
  model.safetensors        the initial FP32 weights by name (random init, or the --init file), model sizes in metadata.
  debug_state.safetensors  inputs (I32, B×T), targets (I32, B×T), logits (F32, B×T×V), loss (F32, (1,)),
                           grads.<name> (F32, every parameter, padded shape) of one forward/backward, and
                           losses (F32, steps) of `steps` AdamW steps on the same batch; hyperparameters in metadata.
  Precision choice (as gpt2.py): every forward runs in FP32 (TF32 off) on weights ROUNDED to bf16 from the FP32
  master, gradients are w.r.t. the rounded weights, AdamW updates the FP32 master. The differences the test sees come
  from llm8's bf16 activations only.
  --check_hf additionally loads the same weights into transformers' LlamaForCausalLM (FP32, eager attention) and
  checks that its logits, loss and gradients match this reference (a cross-check of the reference itself; needs the
  transformers package).

Timing mode (--time) trains transformers' LlamaForCausalLM (attn_implementation="sdpa") with torch.compile, BF16
autocast and fused AdamW on random tokens and prints one JSON line with tokens/s (the peer of dev/bench/bench.py).
--impl ours times this file's model the same way instead.

Examples:
  python3 dev/reference/llama.py --preset llama-tiny --B 4 --T 64 --seed 1 --out /tmp/parity
  python3 dev/reference/llama.py --preset llama-tiny --B 2 --T 32 --out /tmp/parity --check_hf --device cpu
  python3 dev/reference/llama.py --preset llama-1b --B 4 --T 2048 --time
"""
import argparse
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the parity test turns this exit code into a skip
    print("llama.py: PyTorch is not installed (pip install torch)", file=sys.stderr)
    sys.exit(77)

import harness  # noqa: E402  (after the torch check: it imports torch)

# The presets of llmc/model/llama/llama_family.cpp (vocabulary 50257 padded to 50304, RMSNorm eps 1e-5). Explicit
# --n_layer etc. override any of these.
PRESETS = {
    "llama-tiny": dict(n_layer=2, n_head=2, n_kv_head=1, n_embd=128, ffn_hidden=512, max_seq_len=256,
                       rope_theta=10000.0, tied=False),
    "llama-125m": dict(n_layer=12, n_head=12, n_kv_head=4, n_embd=768, ffn_hidden=2048, max_seq_len=2048,
                       rope_theta=500000.0, tied=True),
    "llama-350m": dict(n_layer=24, n_head=16, n_kv_head=4, n_embd=1024, ffn_hidden=2816, max_seq_len=2048,
                       rope_theta=500000.0, tied=True),
    "llama-1b": dict(n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, ffn_hidden=8192, max_seq_len=2048,
                     rope_theta=500000.0, tied=True),
    "llama-3b": dict(n_layer=28, n_head=24, n_kv_head=8, n_embd=3072, ffn_hidden=8192, max_seq_len=2048,
                     rope_theta=500000.0, tied=True),
    "llama-7b": dict(n_layer=32, n_head=32, n_kv_head=32, n_embd=4096, ffn_hidden=11008, max_seq_len=4096,
                     rope_theta=10000.0, tied=False),
}


def param_shapes(cfg):
    """Our parameter table: (name, shape, weight_decay, init_std) in storage order; init_std 0 = constant (norms: 1)."""
    L, C, Vp, F_ = cfg["n_layer"], cfg["n_embd"], cfg["padded_vocab_size"], cfg["ffn_hidden"]
    HS = C // cfg["n_head"]
    q, kv = cfg["n_head"] * HS, cfg["n_kv_head"] * HS
    proj_std = 0.02 / math.sqrt(2 * L)
    out = [("model.embed_tokens.weight", (Vp, C), True, 0.02)]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [
            (p + "input_layernorm.weight", (C,), False, 0.0),
            (p + "self_attn.q_proj.weight", (q, C), True, 0.02),
            (p + "self_attn.k_proj.weight", (kv, C), True, 0.02),
            (p + "self_attn.v_proj.weight", (kv, C), True, 0.02),
            (p + "self_attn.o_proj.weight", (C, q), True, proj_std),
            (p + "post_attention_layernorm.weight", (C,), False, 0.0),
            (p + "mlp.gate_proj.weight", (F_, C), True, 0.02),
            (p + "mlp.up_proj.weight", (F_, C), True, 0.02),
            (p + "mlp.down_proj.weight", (C, F_), True, proj_std),
        ]
    out.append(("model.norm.weight", (C,), False, 0.0))
    if not cfg["tied"]:
        out.append(("lm_head.weight", (Vp, C), True, 0.02))
    return out


def init_weights(cfg, seed):
    """llm8's init scheme in FP32 on the CPU (reproducible, not the same random numbers as llm8's C++ init):
    normal(0, 0.02) matrices and embeddings, o_proj / down_proj 0.02/sqrt(2L), RMSNorm weights 1; padded rows 0."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape, _, std in param_shapes(cfg):
        if std > 0:
            w = torch.randn(shape, generator=gen, dtype=torch.float32) * std
        else:
            w = torch.ones(shape, dtype=torch.float32)
        weights[name] = w
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in weights:
            weights[name][cfg["vocab_size"]:] = 0.0
    return weights


def load_weights(cfg, path):
    return harness.load_weights(param_shapes(cfg), path, "llama.py", f", tied = {cfg['tied']}")


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_cos_sin(T, HS, theta, device):
    """(T, HS) cos and sin of the rotation angles, as llmc/kernels/rope.cu: FP64 inv_freq rounded to FP32, FP32 angle."""
    inv_freq = (float(theta) ** (-torch.arange(0, HS, 2, dtype=torch.float64) / HS)).to(torch.float32)
    angle = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (T, HS/2), FP32 products
    emb = torch.cat([angle, angle], dim=-1).to(device)  # dimension i and i + HS/2 share an angle
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def forward(w, cfg, idx, targets=None, use_sdpa=False):
    """idx, targets (B, T) int64. Returns logits (B, T, Vp) and the mean loss over targets != -1 on logits[:V]."""
    B, T = idx.shape
    L, NH, NKV, C, V = cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["n_embd"], cfg["vocab_size"]
    HS, eps = C // NH, cfg["norm_eps"]
    cos, sin = rope_cos_sin(T, HS, cfg["rope_theta"], idx.device)  # (T, HS)
    cos, sin = cos.to(w["model.norm.weight"].dtype), sin.to(w["model.norm.weight"].dtype)
    x = w["model.embed_tokens.weight"][idx]  # (B, T, C)
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(B, T, NH, HS).transpose(1, 2)   # (B, NH, T, HS)
        k = F.linear(h, w[p + "self_attn.k_proj.weight"]).view(B, T, NKV, HS).transpose(1, 2)  # (B, NKV, T, HS)
        v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(B, T, NKV, HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)  # query head h uses kv head h // (NH / NKV)
        v = v.repeat_interleave(NH // NKV, dim=1)
        if use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))  # (B, NH, T, T)
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = att @ v  # (B, NH, T, HS)
        y = y.transpose(1, 2).contiguous().view(B, T, NH * HS)
        x = x + F.linear(y, w[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        h = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(h, w[p + "mlp.up_proj.weight"])  # (B, T, F)
        x = x + F.linear(h, w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tied"] else w["lm_head.weight"]
    logits = F.linear(x, head)  # (B, T, Vp)
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits[..., :V].reshape(-1, V).float(), targets.reshape(-1), ignore_index=-1)
    return logits, loss


def resolve_config(args):
    cfg = dict(PRESETS[args.preset]) if args.preset else {}
    for key in ("n_layer", "n_head", "n_kv_head", "n_embd", "max_seq_len", "vocab_size", "padded_vocab_size",
                "ffn_hidden"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    for key in ("rope_theta", "norm_eps"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.untied:
        cfg["tied"] = False
    if args.tied:
        cfg["tied"] = True
    for key in ("n_layer", "n_head", "n_embd"):
        if key not in cfg:
            sys.exit(f"llama.py: give --preset or --{key}")
    cfg.setdefault("n_kv_head", cfg["n_head"])
    cfg.setdefault("max_seq_len", 2048)
    cfg.setdefault("vocab_size", 50257)
    cfg.setdefault("padded_vocab_size", ((cfg["vocab_size"] + 127) // 128) * 128)
    cfg.setdefault("ffn_hidden", ((8 * cfg["n_embd"] // 3 + 255) // 256) * 256)
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("norm_eps", 1e-5)
    cfg.setdefault("tied", True)
    if cfg["n_embd"] % cfg["n_head"] != 0 or (cfg["n_embd"] // cfg["n_head"]) % 2 != 0:
        sys.exit("llama.py: n_embd must be a multiple of n_head with an even head size")
    if cfg["n_head"] % cfg["n_kv_head"] != 0:
        sys.exit("llama.py: n_head must be a multiple of n_kv_head")
    if cfg["padded_vocab_size"] < cfg["vocab_size"]:
        sys.exit("llama.py: padded_vocab_size must be >= vocab_size")
    return cfg


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face


def hf_model(cfg, weights, device, attn_implementation, dtype=torch.float32):
    """transformers' LlamaForCausalLM with our sizes and (when given) our weights; the padded vocabulary is its
    vocabulary (the padded rows are 0)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        sys.exit("llama.py: the transformers package is needed here (pip install transformers)")
    C, NH = cfg["n_embd"], cfg["n_head"]
    kwargs = dict(vocab_size=cfg["padded_vocab_size"], hidden_size=C, intermediate_size=cfg["ffn_hidden"],
                  num_hidden_layers=cfg["n_layer"], num_attention_heads=NH, num_key_value_heads=cfg["n_kv_head"],
                  head_dim=C // NH, max_position_embeddings=cfg["max_seq_len"], rms_norm_eps=cfg["norm_eps"],
                  tie_word_embeddings=cfg["tied"], attention_bias=False, mlp_bias=False, hidden_act="silu",
                  rope_theta=cfg["rope_theta"], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = LlamaConfig(**kwargs)
    # transformers >= 5 keeps the base in rope_parameters; older versions read config.rope_theta
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        rope["rope_theta"] = cfg["rope_theta"]
        rope.setdefault("rope_type", "default")
    config._attn_implementation = attn_implementation
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    if weights is not None:
        state = {n: t.to(device=device, dtype=dtype) for n, t in weights.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (cfg["tied"] and m == "lm_head.weight") and "rotary_emb" not in m]
        if missing or unexpected:
            sys.exit(f"llama.py: loading our weights into LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
        if cfg["tied"] and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            sys.exit("llama.py: transformers did not tie lm_head to embed_tokens")
    return model


def check_against_hf(cfg, w_ref, logits_ref, loss_ref, inputs, targets, device):
    """Runs LlamaForCausalLM (FP32, eager attention) on the same bf16-rounded weights and inputs and compares logits,
    loss and every gradient with this file's reference. The only expected difference is HF's FP32 inv_freq
    (1 / base^(2i/HS) in FP32, ours FP64 rounded): a few ulp of the angle, far below the thresholds."""
    weights = {n: t.detach().cpu() for n, t in w_ref.items()}
    model = hf_model(cfg, weights, device, "eager")
    V = cfg["vocab_size"]
    out = model(input_ids=inputs)
    logits = out.logits
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V).float(), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    ref = logits_ref[..., :V].detach()
    diff = (logits[..., :V].detach() - ref).abs().max().item()
    scale = ref.abs().max().item()
    print(f"check_hf: logits max |hf - ours| {diff:.3e} (max |logit| {scale:.3e}), loss hf {loss.item():.6f} "
          f"ours {loss_ref:.6f}")
    ok = diff <= 1e-4 * max(1.0, scale) and abs(loss.item() - loss_ref) <= 1e-5 * max(1.0, abs(loss_ref))
    params = dict(model.named_parameters())
    worst = 0.0
    for name, t in w_ref.items():
        if cfg["tied"] and name == "lm_head.weight":
            continue
        g_hf = params[name].grad
        g_ref = t.grad
        rel = ((g_hf - g_ref).norm() / g_ref.norm().clamp_min(1e-30)).item()
        worst = max(worst, rel)
        if rel > 1e-3:
            print(f"check_hf: gradient of {name}: relative difference {rel:.3e}")
            ok = False
    print(f"check_hf: worst gradient relative difference {worst:.3e}")
    if not ok:
        sys.exit("llama.py: the reference does not match transformers' LlamaForCausalLM (see above)")
    print("check_hf: the reference matches transformers' LlamaForCausalLM")


# ----------------------------------------------------------------------------------------------------------------
# modes


def run_parity(args, cfg, device):
    if args.T > cfg["max_seq_len"]:
        sys.exit(f"llama.py: --T {args.T} exceeds max_seq_len {cfg['max_seq_len']}")
    master = load_weights(cfg, args.init) if args.init else init_weights(cfg, args.seed)
    decay = {name: wdflag for name, _, wdflag, _ in param_shapes(cfg)}
    meta = {k: str(v) for k, v in cfg.items() if k != "tied"}
    meta.update(arch="llama", preset=args.preset or "", seed=str(args.seed),
                tied_embeddings="true" if cfg["tied"] else "false", rope_theta=repr(float(cfg["rope_theta"])),
                norm_eps=repr(float(cfg["norm_eps"])))

    def check(w, logits, loss, idx, tgt):
        check_against_hf(cfg, w, logits, loss.item(), idx, tgt, device)

    harness.parity(args, master, lambda w, idx, tgt: forward(w, cfg, idx, tgt), decay, cfg["vocab_size"], meta,
                   device, check if args.check_hf else None)


def run_timing(args, cfg, device):
    if device.type != "cuda":
        sys.exit("llama.py: --time needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    V = cfg["vocab_size"]
    if args.T > cfg["max_seq_len"]:
        sys.exit(f"llama.py: --T {args.T} exceeds max_seq_len {cfg['max_seq_len']}")
    decay_names = {name for name, _, wdflag, _ in param_shapes(cfg) if wdflag}
    if args.impl == "hf":
        # transformers' model with our init scheme and sizes (padded vocabulary as its vocabulary), FP32 weights
        model = hf_model(cfg, init_weights(cfg, args.seed), device, "sdpa")
        named = dict(model.named_parameters())  # tied: lm_head is embed_tokens, listed once

        def loss_fn(idx, tgt):
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                logits = model(input_ids=idx).logits
            return F.cross_entropy(logits[..., :V].reshape(-1, V).float(), tgt.reshape(-1))
    else:
        named = {n: torch.nn.Parameter(t.to(device)) for n, t in init_weights(cfg, args.seed).items()}

        def loss_fn(idx, tgt):
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                return forward(named, cfg, idx, tgt, use_sdpa=True)[1]

    harness.time_training(named, decay_names, loss_fn, args, V, device,
                          "pytorch-hf-llama" if args.impl == "hf" else "pytorch")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="model size preset")
    for key in ("n_layer", "n_head", "n_kv_head", "n_embd", "max_seq_len", "vocab_size", "padded_vocab_size",
                "ffn_hidden"):
        ap.add_argument("--" + key, type=int, help="override the preset's " + key)
    ap.add_argument("--rope_theta", type=float, help="override the preset's RoPE base")
    ap.add_argument("--norm_eps", type=float, help="override the preset's RMSNorm epsilon")
    tie = ap.add_mutually_exclusive_group()
    tie.add_argument("--untied", action="store_true", help="separate lm_head.weight")
    tie.add_argument("--tied", action="store_true", help="lm_head tied to model.embed_tokens.weight")
    harness.add_common_flags(ap)
    ap.add_argument("--check_hf", action="store_true",
                    help="parity mode: also check the reference against transformers' LlamaForCausalLM")
    ap.add_argument("--time", action="store_true", help="benchmark: torch.compile + bf16 autocast + fused AdamW")
    ap.add_argument("--impl", choices=("hf", "ours"), default="hf",
                    help="--time: transformers' LlamaForCausalLM with sdpa (default) or this file's model")
    harness.add_timing_flags(ap)
    args = ap.parse_args()
    cfg = resolve_config(args)
    device = torch.device(args.device)
    if args.time:
        run_timing(args, cfg, device)
    else:
        if not args.out:
            sys.exit("llama.py: give --out DIR (or --time)")
        run_parity(args, cfg, device)


if __name__ == "__main__":
    main()
