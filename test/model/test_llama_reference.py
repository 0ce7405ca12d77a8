#!/usr/bin/env python3
"""test/model/test_llama_reference.py: dev/reference/llama.py (the PyTorch Llama the GPU parity test trusts), on the CPU.

Runs the reference in parity mode with --check_hf for an untied GQA model and a tied one, so its logits, loss and
every gradient are checked against transformers' LlamaForCausalLM loaded with the same weights (the script exits
non-zero on a mismatch), then checks the debug-state files have the layout test/model/test_llama_parity.cu reads:
every tensor of the parameter table (names, shapes), inputs/targets/logits/loss/losses, the metadata keys, and that
10 AdamW steps on one batch lower the loss.

Exit code 77 (skipped under CTest) when torch, transformers or safetensors is not installed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from safetensors import safe_open
except ImportError as e:
    print(f"test_llama_reference.py: skipped: {e} (pip install torch transformers safetensors)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "dev", "reference", "llama.py")


def expected_names(L, tied):
    names = ["model.embed_tokens.weight"]
    for l in range(L):
        p = f"model.layers.{l}."
        names += [p + s for s in ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                  "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight")]
    names.append("model.norm.weight")
    if not tied:
        names.append("lm_head.weight")
    return names


def run_case(extra, tied, L, C, NH, NKV, F, B, T):
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, SCRIPT, "--preset", "llama-tiny", "--n_embd", str(C), "--n_head", str(NH),
               "--n_kv_head", str(NKV), "--ffn_hidden", str(F), "--B", str(B), "--T", str(T), "--out", out,
               "--check_hf", "--device", "cpu", "--tied" if tied else "--untied"] + extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
        assert "the reference matches transformers' LlamaForCausalLM" in r.stdout, r.stdout
        HS, Vp, V = C // NH, 50304, 50257
        shapes = {"model.embed_tokens.weight": (Vp, C), "model.norm.weight": (C,), "lm_head.weight": (Vp, C)}
        for l in range(L):
            p = f"model.layers.{l}."
            shapes.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                           p + "self_attn.q_proj.weight": (NH * HS, C), p + "self_attn.k_proj.weight": (NKV * HS, C),
                           p + "self_attn.v_proj.weight": (NKV * HS, C), p + "self_attn.o_proj.weight": (C, NH * HS),
                           p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                           p + "mlp.down_proj.weight": (C, F)})
        names = expected_names(L, tied)
        with safe_open(os.path.join(out, "model.safetensors"), "np") as f:
            assert sorted(f.keys()) == sorted(names), sorted(f.keys())
            meta = f.metadata()
            for n in names:
                assert f.get_tensor(n).shape == shapes[n], (n, f.get_tensor(n).shape)
            emb = f.get_tensor("model.embed_tokens.weight")
            assert (emb[V:] == 0).all(), "padded vocabulary rows must be 0"
        for key in ("arch", "n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "vocab_size",
                    "padded_vocab_size", "max_seq_len", "rope_theta", "norm_eps", "tied_embeddings"):
            assert key in meta, key
        assert meta["arch"] == "llama" and meta["tied_embeddings"] == ("true" if tied else "false")
        with safe_open(os.path.join(out, "debug_state.safetensors"), "np") as f:
            keys = set(f.keys())
            for n in names:
                assert "grads." + n in keys, n
                assert f.get_tensor("grads." + n).shape == shapes[n]
            assert f.get_tensor("inputs").shape == (B, T)
            assert f.get_tensor("targets").shape == (B, T)
            assert f.get_tensor("logits").shape == (B, T, V)
            losses = f.get_tensor("losses")
            assert losses.shape == (10,) and losses[-1] < losses[0], losses
            for key in ("B", "T", "steps", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"):
                assert key in f.metadata(), key


def main():
    run_case([], tied=False, L=2, C=128, NH=2, NKV=1, F=512, B=2, T=24)
    run_case(["--rope_theta", "500000"], tied=True, L=2, C=256, NH=4, NKV=2, F=384, B=2, T=33)
    print("test_llama_reference.py: all checks passed")


if __name__ == "__main__":
    main()
