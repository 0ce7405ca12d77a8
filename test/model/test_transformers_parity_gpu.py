#!/usr/bin/env python3
"""test/model/test_transformers_parity_gpu.py: our GPU model against Hugging Face transformers, through our own export.

For each model family: `train_gpt --export-hf DIR --export-dtype bfloat16` writes a freshly initialised model (bf16
weights, so both sides compute with exactly the same weights: ours are bf16 working weights, transformers upcasts the
same values to float32); transformers loads DIR (GPT2LMHeadModel / LlamaForCausalLM) and runs one batch on the GPU in
float32 (TF32 off); `dev/tools/debug_state` runs our BF16 model on the same batch and writes its logits, mean loss and
every parameter gradient. Compared: the loss (absolute), the logits and the gradient of every tensor (cosine and
relative norm error ||ours - ref|| / ||ref||; Conv1D gradients transposed, the padded vocabulary rows of our
gradients must be 0). The differences come from our BF16 activations only; the thresholds are below.

Needs a CUDA GPU, torch, transformers, safetensors and the built binaries ($LLM8_TRAIN_GPT and
$LLM8_BUILD_DIR/dev/tools/debug_state, set by CTest; else build/). Exit 77 (skipped) when any is missing.
Set LLM8_KEEP_PARITY=1 to keep the working directory.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as e:
    print(f"test_transformers_parity.py: skipped: {e} (pip install numpy torch transformers safetensors)")
    sys.exit(77)

if not torch.cuda.is_available():
    print("test_transformers_parity.py: skipped: no CUDA GPU visible to torch")
    sys.exit(77)

import shutil
import subprocess
import tempfile
import unittest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_DIR = os.environ.get("LLM8_BUILD_DIR") or os.path.join(REPO_ROOT, "build")
TRAIN_GPT = os.environ.get("LLM8_TRAIN_GPT") or os.path.join(BUILD_DIR, "train_gpt")
DEBUG_STATE = os.path.join(BUILD_DIR, "dev", "tools", "debug_state")
for binary in (TRAIN_GPT, DEBUG_STATE):
    if not os.path.exists(binary):
        print(f"test_transformers_parity.py: skipped: {binary} is not built")
        sys.exit(77)

# Thresholds (BF16 activations against an FP32 reference on the same weights).
LOSS_ABS = 1e-2       # |our mean loss - reference|
MIN_COSINE = 0.999    # logits and every gradient tensor
MAX_RELERR = 1e-2     # ||ours - ref|| / ||ref||, logits and every gradient tensor

B, T = 4, 64

# The families: the config the export starts from, the transformers class, and which tensors are GPT-2 Conv1D
# (stored (in, out) by transformers, (out, in) by us).
GPT2_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
FAMILIES = {
    "gpt2": dict(config="configs/gpt2_tiny_bf16.json", sets=[], cls="GPT2LMHeadModel", conv1d=GPT2_CONV1D),
    # llama-tiny: GQA 2:1, head size 64, untied lm_head, rope_theta 10000.
    "llama": dict(config="configs/llama_tiny_bf16.json", sets=[], cls="LlamaForCausalLM", conv1d=()),
}
# What debug_state says for an architecture it has no GPU model for (it uses GPT2 until make_model lands).
NO_GPU_MODEL = "needs the Model interface"
VOCAB_ROWS = ("transformer.wte.weight", "model.embed_tokens.weight", "lm_head.weight")


def compare(ours, ref):
    ours, ref = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    ref_norm, our_norm = np.linalg.norm(ref), np.linalg.norm(ours)
    diff = np.linalg.norm(ours - ref)
    relerr = diff / ref_norm if ref_norm > 0 else diff
    cosine = float(ours @ ref / (ref_norm * our_norm)) if ref_norm > 0 and our_norm > 0 else float(diff == 0)
    return relerr, cosine, ref_norm


class TransformersParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="llm8_tf_parity_")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")

    @classmethod
    def tearDownClass(cls):
        if os.environ.get("LLM8_KEEP_PARITY"):
            print(f"kept {cls.tmp}")
        else:
            shutil.rmtree(cls.tmp)

    def run_tool(self, *cmd):
        r = subprocess.run(list(cmd), capture_output=True, text=True, cwd=REPO_ROOT)
        if r.returncode != 0 and NO_GPU_MODEL in r.stderr:
            self.skipTest(r.stderr.strip())
        if r.returncode != 0:
            self.fail(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def check_family(self, family):
        spec = FAMILIES[family]
        work = os.path.join(self.tmp, family)
        os.makedirs(work)
        hf_dir = os.path.join(work, "hf")
        sets = [a for s in spec["sets"] for a in ("--set", s)]
        self.run_tool(TRAIN_GPT, "--config", spec["config"], *sets, "--export-hf", hf_dir, "--export-dtype", "bfloat16")

        model_cls = getattr(transformers, spec["cls"])
        model = model_cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").cuda().eval()
        V = model.config.vocab_size
        rng = np.random.default_rng(1234)
        tokens = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)
        inputs, targets = np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])
        batch_path, state_path = os.path.join(work, "batch.safetensors"), os.path.join(work, "state.safetensors")
        save_file({"inputs": inputs, "targets": targets}, batch_path)
        print(self.run_tool(DEBUG_STATE, "--model", hf_dir, "--batch", batch_path, "--out", state_path).strip())

        # The reference: float32 forward/backward of the same weights on the same batch.
        x = torch.from_numpy(inputs).long().cuda()
        y = torch.from_numpy(targets).long().cuda()
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        loss.backward()

        with safe_open(state_path, framework="numpy") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
        failures = []
        our_loss = float(state["loss"][0])
        print(f"[{family}] loss ours {our_loss:.6f} ref {loss.item():.6f} diff {abs(our_loss - loss.item()):.2e}")
        if abs(our_loss - loss.item()) > LOSS_ABS:
            failures.append(f"loss differs by {abs(our_loss - loss.item()):.3e}")
        relerr, cosine, _ = compare(state["logits"], logits.detach().cpu().numpy())
        print(f"[{family}] logits relerr {relerr:.3e} cosine {cosine:.6f}")
        if relerr > MAX_RELERR or cosine < MIN_COSINE:
            failures.append(f"logits: relerr {relerr:.3e}, cosine {cosine:.6f}")

        print(f"{'gradient':<48} {'|ref|':>12} {'relerr':>10} {'cosine':>10}")
        seen = set()
        for name, p in model.named_parameters():  # tied lm_head appears once, as the embedding
            key = "grads." + name
            if key not in state:
                failures.append(f"transformers parameter {name} has no gradient in our state")
                continue
            seen.add(key)
            ref = p.grad.detach().float().cpu().numpy()
            ours = state[key]
            if name.endswith(spec.get("conv1d", ())):
                ours = ours.T
            if name in VOCAB_ROWS:
                if np.any(ours[V:] != 0):
                    failures.append(f"{name}: gradient of the padded vocabulary rows is not 0")
                ours = ours[:V]
            if ours.shape != ref.shape:
                failures.append(f"{name}: our gradient has shape {ours.shape}, transformers' {ref.shape}")
                continue
            relerr, cosine, ref_norm = compare(ours, ref)
            print(f"{name:<48} {ref_norm:>12.4e} {relerr:>10.3e} {cosine:>10.6f}")
            if relerr > MAX_RELERR or cosine < MIN_COSINE:
                failures.append(f"{name}: relerr {relerr:.3e}, cosine {cosine:.6f}")
        missing = sorted(k for k in state if k.startswith("grads.") and k not in seen)
        if missing:
            failures.append(f"our tensors without a transformers parameter: {missing}")
        self.assertEqual(failures, [], f"{family}: " + "; ".join(failures))

    def test_gpt2(self):
        self.check_family("gpt2")

    def test_llama(self):
        self.check_family("llama")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    unittest.main()
