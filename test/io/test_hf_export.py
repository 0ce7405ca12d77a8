#!/usr/bin/env python3
"""test/io/test_hf_export.py: train_gpt's Hugging Face export and import against the real `transformers`, on the CPU.

Export: a freshly initialised model written by `train_gpt --export-hf` (and the same weights by `--export-llmc`) loads
with transformers as GPT2LMHeadModel: the config (sizes, epsilon, activation, tied embeddings, dtype), every tensor by
name against the llm.c file read here independently (so the Conv1D transposes and the unpadded vocabulary are checked
against a layout that has neither), lm_head tied to wte, and the logits of a batch against a NumPy float64
re-implementation of GPT-2 run on the llm.c file's weights. BF16 exports load with the bf16-rounded values.

Llama: the llama-tiny export (GQA, untied) and a tied head-size-128 variant load as LlamaForCausalLM, every tensor
as written, the logits against a NumPy Llama (RMSNorm, rotate_half RoPE with rope_theta, grouped-query heads, SwiGLU).

Import: models created and saved by transformers itself (save_pretrained: F32, BF16, sharded with an index; GPT-2 and
Llama, tied and untied) are read by `train_gpt --set train.init_from=DIR --export-llmc / --export-hf` and the result
holds exactly the transformers tensors, with the same logits.

The binary is $LLM8_TRAIN_GPT (CTest sets it) or build/train_gpt. Exit code 77 (skipped under CTest) when numpy, torch
or transformers is missing, or the binary is not built.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the Hub
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:
    import numpy as np
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"test_hf_export.py: skipped: {e} (pip install numpy torch transformers)")
    sys.exit(77)

import json
import shutil
import struct
import subprocess
import tempfile
import unittest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_GPT = os.environ.get("LLM8_TRAIN_GPT") or os.path.join(REPO_ROOT, "build", "train_gpt")
if not os.path.exists(TRAIN_GPT):
    print(f"test_hf_export.py: skipped: {TRAIN_GPT} is not built (set LLM8_TRAIN_GPT)")
    sys.exit(77)

TINY = os.path.join(REPO_ROOT, "configs", "gpt2_tiny_bf16.json")  # L2, H2, C128, T256, vocab 50257
LLAMA_TINY = os.path.join(REPO_ROOT, "configs", "llama_tiny_bf16.json")  # L2, H2, KV1, C128, F512, untied, theta 1e4

LLMC_TENSORS = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb",
                "fcprojw", "fcprojb", "lnfw", "lnfb"]


def train_gpt(*args, config=TINY):
    """Runs the binary (config gpt2-tiny + args) on the CPU; returns stdout, fails the test with stderr otherwise."""
    cmd = [TRAIN_GPT, "--config", config, *args]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def read_llmc(path):
    """llm.c model file -> (header ints, {name: float32 array in llm.c's stacked (out, in) layout})."""
    with open(path, "rb") as f:
        raw = f.read()
    h = struct.unpack("<256i", raw[:1024])
    assert h[0] == 20240326 and h[1] in (3, 5), h[:2]
    maxT, V, L, NH, C, Vp = h[2:8]
    shapes = [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C), (L, C), (L, C),
              (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]
    if h[1] == 3:
        flat = np.frombuffer(raw, dtype="<f4", offset=1024)
    else:  # bf16: the upper 16 bits of a float32
        flat = (np.frombuffer(raw, dtype="<u2", offset=1024).astype(np.uint32) << 16).view(np.float32)
    out, at = {}, 0
    for name, shape in zip(LLMC_TENSORS, shapes):
        n = int(np.prod(shape))
        out[name] = flat[at:at + n].reshape(shape)
        at += n
    assert at == flat.size, (at, flat.size)
    return h, out


def layernorm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_forward(header, w, idx):
    """NumPy float64 GPT-2 on llm.c-layout weights: logits (B, T, V)."""
    V, L, NH, C = header[3], header[4], header[5], header[6]
    w = {k: v.astype(np.float64) for k, v in w.items()}
    B, T = idx.shape
    hs = C // NH
    x = w["wte"][idx] + w["wpe"][:T]
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    for l in range(L):
        h = layernorm(x, w["ln1w"][l], w["ln1b"][l])
        qkv = h @ w["qkvw"][l].T + w["qkvb"][l]
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, NH, hs).transpose(0, 2, 1, 3) for i in range(3))
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
        att[..., mask] = -np.inf
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ w["attprojw"][l].T + w["attprojb"][l]
        h = layernorm(x, w["ln2w"][l], w["ln2b"][l])
        h = gelu_tanh(h @ w["fcw"][l].T + w["fcb"][l])
        x = x + h @ w["fcprojw"][l].T + w["fcprojb"][l]
    x = layernorm(x, w["lnfw"], w["lnfb"])
    return x @ w["wte"][:V].T


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def llama_forward(cfg, w, idx):
    """NumPy float64 Llama on Hugging Face-named weights (nn.Linear (out, in)): logits (B, T, V). RoPE with the
    rotate_half pairing (i, i + HS/2), grouped-query heads: query head h reads key/value head h // (NH / NKV)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    L, eps, theta = cfg["num_hidden_layers"], cfg["rms_norm_eps"], cfg["rope_theta"]
    hs = C // NH
    B, T = idx.shape
    inv_freq = 1.0 / theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
    angles = np.outer(np.arange(T), inv_freq)
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    x = w["model.embed_tokens.weight"][idx]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(B, T, NH, hs).transpose(0, 2, 1, 3)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(B, T, NKV, hs).transpose(0, 2, 1, 3)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(B, T, NKV, hs).transpose(0, 2, 1, 3)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, NH // NKV, axis=1), np.repeat(v, NH // NKV, axis=1)
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
        att[..., mask] = -np.inf
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return x @ head.T


def hf_state_as_llmc(model, Vp):
    """A GPT2LMHeadModel's tensors in llm.c's stacked (out, in) layout (Conv1D transposed, wte zero-padded to Vp)."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    L = model.config.n_layer
    layer = lambda suffix, t=False: np.stack([sd[f"transformer.h.{l}.{suffix}"].T if t else
                                              sd[f"transformer.h.{l}.{suffix}"] for l in range(L)])
    wte = sd["transformer.wte.weight"]
    return {
        "wte": np.concatenate([wte, np.zeros((Vp - wte.shape[0], wte.shape[1]), np.float32)]),
        "wpe": sd["transformer.wpe.weight"],
        "ln1w": layer("ln_1.weight"), "ln1b": layer("ln_1.bias"),
        "qkvw": layer("attn.c_attn.weight", True), "qkvb": layer("attn.c_attn.bias"),
        "attprojw": layer("attn.c_proj.weight", True), "attprojb": layer("attn.c_proj.bias"),
        "ln2w": layer("ln_2.weight"), "ln2b": layer("ln_2.bias"),
        "fcw": layer("mlp.c_fc.weight", True), "fcb": layer("mlp.c_fc.bias"),
        "fcprojw": layer("mlp.c_proj.weight", True), "fcprojb": layer("mlp.c_proj.bias"),
        "lnfw": sd["transformer.ln_f.weight"], "lnfb": sd["transformer.ln_f.bias"],
    }


def hf_logits(model, idx):
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(idx).long()).logits.double().numpy()


class Gpt2Export(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.tmp = tempfile.mkdtemp(prefix="llm8_hf_export_")
        cls.idx = np.random.default_rng(0).integers(0, 1000, size=(2, 24))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def export(self, name, *args):
        hf, bin_ = os.path.join(self.tmp, name), os.path.join(self.tmp, name + ".bin")
        out = train_gpt("--export-hf", hf, "--export-llmc", bin_, *args)
        self.assertIn("export: weights from fresh initialisation", out)
        return hf, bin_

    def check_against_llmc(self, model, bin_path, exact=True):
        header, w = read_llmc(bin_path)
        ours = hf_state_as_llmc(model, header[7])
        for name in LLMC_TENSORS:
            self.assertEqual(ours[name].shape, w[name].shape, name)
            if exact:
                np.testing.assert_array_equal(ours[name], w[name], err_msg=name)
        return header, w

    def test_float32_export_loads_as_gpt2(self):
        for vocab, heads in ((50257, 2), (1000, 1)):  # head size 64 and 128
            with self.subTest(vocab=vocab, heads=heads):
                hf, bin_ = self.export(f"f32_{vocab}", "--set", f"model.vocab_size={vocab}",
                                       "--set", f"model.n_head={heads}", "--set", "train.seed=3")
                model = GPT2LMHeadModel.from_pretrained(hf, dtype=torch.float32)
                cfg = model.config
                self.assertEqual((cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head),
                                 (vocab, 256, 128, 2, heads))
                self.assertEqual(cfg.activation_function, "gelu_new")
                self.assertEqual(cfg.layer_norm_epsilon, 1e-5)
                self.assertTrue(cfg.tie_word_embeddings)
                # lm_head is the embedding (the same storage), never a padded copy.
                self.assertEqual(model.lm_head.weight.data_ptr(), model.transformer.wte.weight.data_ptr())
                self.assertEqual(tuple(model.transformer.wte.weight.shape), (vocab, 128))
                # Conv1D weights are (in, out) in transformers.
                self.assertEqual(tuple(model.transformer.h[0].attn.c_attn.weight.shape), (128, 384))
                self.assertEqual(tuple(model.transformer.h[0].mlp.c_proj.weight.shape), (512, 128))
                header, w = self.check_against_llmc(model, bin_)
                ref = gpt2_forward(header, w, self.idx)
                got = hf_logits(model, self.idx)
                self.assertEqual(got.shape, (2, 24, vocab))
                err = np.abs(got - ref).max()
                self.assertLess(err, 1e-4, f"logits differ from the NumPy GPT-2 by {err}")

    def test_bfloat16_export_loads_rounded_values(self):
        hf, bin_ = self.export("bf16", "--export-dtype", "bfloat16", "--set", "model.vocab_size=1000")
        with open(os.path.join(hf, "config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
        model = GPT2LMHeadModel.from_pretrained(hf, dtype=torch.bfloat16)
        self.assertEqual(model.transformer.h[1].attn.c_attn.weight.dtype, torch.bfloat16)
        self.check_against_llmc(model, bin_)  # the bf16 values exactly as in the llm.c version 5 file
        _, w32 = read_llmc(self.export("bf16_as_f32", "--set", "model.vocab_size=1000")[1])
        _, w16 = read_llmc(bin_)
        rel = np.linalg.norm(w16["qkvw"] - w32["qkvw"]) / np.linalg.norm(w32["qkvw"])
        self.assertTrue(0 < rel < 4e-3, rel)  # rounded once to bf16 (8 significant bits)


class LlamaExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="llm8_hf_llama_")
        cls.idx = np.random.default_rng(2).integers(0, 1000, size=(2, 24))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_float32_export_loads_as_llama(self):
        # llama-tiny: GQA 2:1, head size 64, untied; a variant with head size 128, tied embeddings, other theta.
        cases = (("untied_hs64", []),
                 ("tied_hs128", ["--set", "model.n_head=2", "--set", "model.n_kv_head=2", "--set", "model.n_embd=256",
                                 "--set", "model.tied_embeddings=true", "--set", "model.rope_theta=500000"]))
        for label, sets in cases:
            with self.subTest(label):
                hf = os.path.join(self.tmp, label)
                out = train_gpt("--set", "model.vocab_size=1000", "--set", "train.seed=5", *sets, "--export-hf", hf,
                                config=LLAMA_TINY)
                self.assertIn("export: Hugging Face model (llama", out)
                with open(os.path.join(hf, "config.json")) as f:
                    cfg = json.load(f)
                model = LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
                mc = model.config
                self.assertEqual((mc.vocab_size, mc.hidden_size, mc.num_hidden_layers, mc.num_attention_heads,
                                  mc.num_key_value_heads, mc.intermediate_size, mc.max_position_embeddings),
                                 (1000, cfg["hidden_size"], 2, cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                  cfg["intermediate_size"], 256))
                self.assertEqual(mc.hidden_act, "silu")
                self.assertEqual(mc.rms_norm_eps, 1e-5)
                tied = label.startswith("tied")
                self.assertEqual(mc.tie_word_embeddings, tied)
                self.assertEqual(model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), tied)
                theta = getattr(mc, "rope_theta", None) or mc.rope_parameters["rope_theta"]
                self.assertEqual(theta, 500000.0 if tied else 10000.0)
                weights = load_file(os.path.join(hf, "model.safetensors"))
                sd = model.state_dict()
                for name, value in weights.items():  # every tensor as written, in the model (no transposes)
                    np.testing.assert_array_equal(sd[name].numpy(), value, err_msg=name)
                self.assertEqual(tuple(model.model.embed_tokens.weight.shape), (1000, cfg["hidden_size"]))
                cfg["rope_theta"] = theta
                ref = llama_forward(cfg, weights, self.idx)
                got = hf_logits(model, self.idx)
                err = np.abs(got - ref).max()
                self.assertLess(err, 1e-4, f"logits differ from the NumPy Llama by {err}")

    def test_import_save_pretrained(self):
        for tied in (False, True):
            with self.subTest(tied=tied):
                torch.manual_seed(3)
                config = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                     rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied)
                model = LlamaForCausalLM(config).eval()
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        if p.dim() == 1:
                            p.add_(torch.randn_like(p) * 0.1)
                d = os.path.join(self.tmp, f"saved_tied{tied}")
                model.to(torch.bfloat16).save_pretrained(d)
                model = model.float()
                back = os.path.join(self.tmp, f"back_tied{tied}")
                sets = ["--set", "model.vocab_size=1000"]
                if tied:
                    sets += ["--set", "model.tied_embeddings=true"]
                out = train_gpt(*sets, "--set", f"train.init_from={d}", "--export-hf", back, config=LLAMA_TINY)
                self.assertIn(f"Hugging Face directory {d} (llama)", out)
                weights = load_file(os.path.join(back, "model.safetensors"))
                sd = model.state_dict()
                self.assertEqual(set(weights), {k for k in sd if not (tied and k == "lm_head.weight")})
                for name, value in weights.items():  # the bf16 values, widened exactly, in float32
                    np.testing.assert_array_equal(sd[name].numpy(), value, err_msg=name)


class Gpt2Import(unittest.TestCase):
    """Directories written by transformers itself, read by train_gpt through train.init_from."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="llm8_hf_import_")
        torch.manual_seed(1)
        config = GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2, n_head=2,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cls.model = GPT2LMHeadModel(config).eval()
        with torch.no_grad():  # non-trivial norms and biases, so a misplaced one shows
            for name, p in cls.model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        cls.idx = np.random.default_rng(1).integers(0, 1000, size=(2, 20))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def import_to_llmc(self, hf_dir):
        bin_ = hf_dir + ".bin"
        out = train_gpt("--set", "model.vocab_size=1000", "--set", f"train.init_from={hf_dir}",
                        "--export-llmc", bin_)
        self.assertIn(f"train.init_from: Hugging Face directory {hf_dir} (gpt2)", out)
        return read_llmc(bin_)

    def test_float32_save_pretrained(self):
        d = os.path.join(self.tmp, "f32")
        self.model.save_pretrained(d)
        header, w = self.import_to_llmc(d)
        ref = hf_state_as_llmc(self.model, header[7])
        for name in LLMC_TENSORS:
            np.testing.assert_array_equal(w[name], ref[name], err_msg=name)
        err = np.abs(gpt2_forward(header, w, self.idx) - hf_logits(self.model, self.idx)).max()
        self.assertLess(err, 1e-4)

    def test_sharded_save_pretrained(self):
        d = os.path.join(self.tmp, "sharded")
        self.model.save_pretrained(d, max_shard_size="300KB")
        self.assertTrue(os.path.exists(os.path.join(d, "model.safetensors.index.json")), os.listdir(d))
        _, w = self.import_to_llmc(d)
        _, w_single = self.import_to_llmc(self._single())
        for name in LLMC_TENSORS:
            np.testing.assert_array_equal(w[name], w_single[name], err_msg=name)

    def test_bfloat16_save_pretrained(self):
        d = os.path.join(self.tmp, "bf16")
        model16 = GPT2LMHeadModel(self.model.config)
        model16.load_state_dict(self.model.state_dict())
        model16.to(torch.bfloat16).save_pretrained(d)
        header, w = self.import_to_llmc(d)
        ref = hf_state_as_llmc(model16, header[7])  # the bf16 values, widened exactly
        for name in LLMC_TENSORS:
            np.testing.assert_array_equal(w[name], ref[name], err_msg=name)

    def _single(self):
        d = os.path.join(self.tmp, "single")
        if not os.path.exists(d):
            self.model.save_pretrained(d)
        return d


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, binary {TRAIN_GPT}")
    unittest.main()
