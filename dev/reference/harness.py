"""dev/reference/harness.py: what the PyTorch reference models (dev/reference/gpt2.py, dev/reference/llama.py) share
around their forward passes, written once: the command-line flags of both modes, the weights from a safetensors file,
parity mode (one forward/backward of the parity batch on the bf16-rounded FP32 master, the reference AdamW steps,
the parity files) and the timed training loop of --time.

Each model file keeps what is its own: presets, parameter table, init, forward, config checks, and in --time the
model and loss it measures.
"""
import json
import os
import sys
import time

import numpy as np
import torch
from safetensors.numpy import load_file, save_file


def add_common_flags(ap):
    """The flags of both references after their model-size flags (parity mode, then --time)."""
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--out", help="output directory (parity mode)")
    ap.add_argument("--init", help="load the initial weights from this safetensors file (our names)")
    ap.add_argument("--steps", type=int, default=10, help="AdamW steps on the same batch (parity mode)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--grad_clip", type=float, default=1.0)


def add_timing_flags(ap):
    """The flags of --time (each model adds --time itself), then --device."""
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps (--time)")
    ap.add_argument("--iters", type=int, default=20, help="timed steps (--time)")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (--time; default 1)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def load_weights(shapes, path, who, hint=""):
    """FP32 CPU tensors by name from a safetensors file, checked against the parameter table shapes = [(name, shape,
    weight_decay, init_std)]; a missing tensor or a wrong shape exits with the name ("who: ..."; hint follows "of
    this size")."""
    tensors = load_file(path)
    weights = {}
    for name, shape, _, _ in shapes:
        if name not in tensors:
            sys.exit(f"{who}: {path} has no tensor '{name}' (is it a model of this size{hint}?)")
        w = torch.from_numpy(tensors[name].astype(np.float32))
        if tuple(w.shape) != tuple(shape):
            sys.exit(f"{who}: {path}: '{name}' has shape {tuple(w.shape)}, expected {tuple(shape)}")
        weights[name] = w
    return weights


def bf16_round(master, device):
    """Leaf FP32 tensors holding bf16(master): the weights our BF16 trainer computes with."""
    return {n: t.to(torch.bfloat16).to(torch.float32).to(device).requires_grad_(True) for n, t in master.items()}


def adamw_steps(master, loss_of, decay, args, device):
    """args.steps AdamW steps on the FP32 master (not modified: a copy on device is updated), each forward on its bf16
    rounding, as llm8's optimizer with bf16 parameters: global-norm clipping to args.grad_clip (the norm in FP64),
    bias-corrected moments, decoupled weight decay on the names decay marks. loss_of(w) is the loss of the leaf
    weights w. Prints each step; returns the losses."""
    b1, b2, eps, wd, lr, clip = args.beta1, args.beta2, args.eps, args.weight_decay, args.lr, args.grad_clip
    m_master = {n: t.clone().to(device) for n, t in master.items()}
    m1 = {n: torch.zeros_like(t) for n, t in m_master.items()}
    m2 = {n: torch.zeros_like(t) for n, t in m_master.items()}
    losses = []
    for step in range(1, args.steps + 1):
        w = bf16_round(m_master, device)
        loss = loss_of(w)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            norm = torch.sqrt(sum((w[n].grad.double() ** 2).sum() for n in w)).item()
            scale = clip / norm if (clip > 0 and norm > clip) else 1.0
            for n in m_master:
                g = w[n].grad * scale
                m1[n].mul_(b1).add_(g, alpha=1 - b1)
                m2[n].mul_(b2).addcmul_(g, g, value=1 - b2)
                mhat = m1[n] / (1 - b1 ** step)
                vhat = m2[n] / (1 - b2 ** step)
                update = mhat / (vhat.sqrt() + eps) + (wd if decay[n] else 0.0) * m_master[n]
                m_master[n].sub_(lr * update)
        print(f"step {step:2d} loss {losses[-1]:.6f} grad_norm {norm:.4f}")
    return losses


def parity(args, master, forward, decay, V, meta, device, check=None):
    """Parity mode on the FP32 master (name -> CPU tensor): one forward/backward of the parity batch on the
    bf16-rounded weights, check(w, logits, loss, inputs, targets) if given (on device), args.steps reference AdamW
    steps, and the parity files (meta: the model's metadata). forward(w, inputs, targets) -> (logits, loss) with
    logits (B, T, Vp) of which the first V columns are the vocabulary."""
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 products, no TF32
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    # The batch: B x (T + 1) tokens below V from torch's CPU generator seeded with seed + 1 (the weights take seed).
    gen = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, V, (args.B, args.T + 1), generator=gen, dtype=torch.int64)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    inputs_d, targets_d = inputs.to(device), targets.to(device)
    w = bf16_round(master, device)
    logits, loss = forward(w, inputs_d, targets_d)
    loss.backward()
    state = {
        "inputs": inputs.numpy().astype(np.int32),
        "targets": targets.numpy().astype(np.int32),
        "logits": np.ascontiguousarray(logits[..., :V].detach().float().cpu().numpy()),
        "loss": np.array([loss.item()], dtype=np.float32),
    }
    for name, t in w.items():
        state["grads." + name] = t.grad.detach().float().cpu().numpy()
    if check is not None:
        check(w, logits, loss, inputs_d, targets_d)
    losses = adamw_steps(master, lambda w: forward(w, inputs_d, targets_d)[1], decay, args, device)
    write_parity_files(args, master, state, losses, meta)


def write_parity_files(args, master, state, losses, meta):
    """--out DIR/model.safetensors (the initial FP32 master, metadata meta) and debug_state.safetensors (state and the
    losses, metadata meta plus the batch and the optimizer's hyperparameters)."""
    state["losses"] = np.array(losses, dtype=np.float32)
    os.makedirs(args.out, exist_ok=True)
    save_file({n: np.ascontiguousarray(t.numpy()) for n, t in master.items()},
              os.path.join(args.out, "model.safetensors"), metadata=meta)
    meta.update(B=str(args.B), T=str(args.T), steps=str(args.steps), lr=repr(args.lr), beta1=repr(args.beta1),
                beta2=repr(args.beta2), eps=repr(args.eps), weight_decay=repr(args.weight_decay),
                grad_clip=repr(args.grad_clip), weight_decay_on="2-D tensors (matrices, embeddings)",
                precision="FP32 compute on bf16-rounded FP32 master weights; TF32 off")
    save_file(state, os.path.join(args.out, "debug_state.safetensors"), metadata=meta)
    print(f"wrote {args.out}/model.safetensors and debug_state.safetensors: loss {state['loss'][0]:.6f}, "
          f"losses {losses[0]:.4f} -> {losses[-1]:.4f}")


def time_training(named, decay_names, loss_fn, args, V, device, impl):
    """--time: torch.compile(loss_fn) trained with fused AdamW (weight decay on decay_names) over the parameters named
    (name -> Parameter) on random batches, args.accum micro-batches per step, args.warmup untimed then args.iters
    timed steps; prints one JSON line (impl, tokens/s, step ms, peak memory, the last loss, device)."""
    B, T = args.B, args.T
    params = list(named.values())
    groups = [{"params": [p for n, p in named.items() if n in decay_names], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named.items() if n not in decay_names], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, fused=True)
    compiled = torch.compile(loss_fn)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def step():  # one optimizer step over args.accum micro-batches (gradient accumulation)
        for _ in range(args.accum):
            tokens = torch.randint(0, V, (B, T + 1), generator=gen, device=device)
            loss = compiled(tokens[:, :-1], tokens[:, 1:])
            (loss / args.accum).backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        loss = step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(json.dumps({
        "impl": impl, "preset": args.preset or "", "B": B, "T": T, "iters": args.iters,
        "step_ms": 1000.0 * elapsed / args.iters, "tokens_per_s": B * T * args.accum * args.iters / elapsed,
        "accum": args.accum,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30, "loss": loss.item(),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
    }))
