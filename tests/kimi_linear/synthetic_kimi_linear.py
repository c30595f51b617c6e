#!/usr/bin/env python3
"""transformers' KimiLinearForCausalLM with k3serve's synthetic weights (synthetic_weights.py), for
comparing k3serve against transformers at sizes no disk holds (kimi-linear-48b: 98 GB in bf16).

Subcommands:
  prompts     --vocab V --count N --length T --seed S --out FILE
              N random prompts of T token ids as a JSON array (k3-generate --prompts-file takes it).
  check-files --model DIR --seed S --scratch DIR
              fills a model built from DIR/config.json, saves it with save_pretrained (transformers'
              own renaming back to checkpoint names) and requires every tensor to equal, bit for bit,
              what k3-genweights wrote into DIR with the same seed (bf16); exit 1 naming the first
              difference.
  hf-logits   --config DIR --seed S --prompts FILE --out FILE [--device cuda] [--dtype bf16|f32]
              builds the model on the meta device, allocates it on --device (to_empty), fills it and
              writes the teacher-forced logits of every prompt position (float32, prompts end to end,
              the layout of k3-generate --logits-out).
  compare     --ref FILE --got FILE --vocab V [--json FILE]
              max |got - ref|, the largest per-position error relative to that position's max |ref|
              (at least 1), and the fraction of positions whose argmax agrees.
Exit status 77 when torch or transformers cannot be imported (tests report a skip).
"""
import argparse
import json
import os
import sys
import time

try:
    import numpy as np
    import torch
    from transformers import AutoConfig, KimiLinearForCausalLM
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_weights import fill_kimi_linear  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def build(config_dir, seed, device, dtype):
    cfg = AutoConfig.from_pretrained(config_dir)
    cfg._attn_implementation = "eager"
    t0 = time.time()
    torch.set_default_dtype(dtype)  # parameters declared without a dtype; the gate's F32 ones stay F32
    try:
        with torch.device("meta"):
            model = KimiLinearForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    model = model.to_empty(device=device).eval()
    n = fill_kimi_linear(model, seed)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    params = sum(p.numel() for p in model.parameters())
    print(f"built and filled {n} tensors ({params / 1e9:.2f} G parameters) on {device} in {time.time() - t0:.1f} s",
          flush=True)
    return model


def cmd_prompts(a):
    g = torch.Generator().manual_seed(a.seed)
    prompts = torch.randint(0, a.vocab, (a.count, a.length), generator=g).tolist()
    with open(a.out, "w") as f:
        json.dump(prompts, f)


def cmd_check_files(a):
    from safetensors.torch import load_file
    model = build(a.model, a.seed, "cpu", torch.bfloat16)
    model.save_pretrained(a.scratch)
    ours, theirs = {}, {}
    for d, into in ((a.model, ours), (a.scratch, theirs)):
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                into.update(load_file(os.path.join(d, f)))
    # transformers saves a dense layer's MLP under "block_sparse_moe." as well; k3serve writes (and
    # loads either) "mlp." there.
    dense = model.config.first_k_dense_replace
    theirs = {(n.replace(".block_sparse_moe.", ".mlp.") if ".layers." in n and int(n.split(".")[2]) < dense else n): t
              for n, t in theirs.items()}
    if set(ours) != set(theirs):
        print(f"FAIL: names differ: only k3-genweights: {sorted(set(ours) - set(theirs))[:5]}, "
              f"only transformers: {sorted(set(theirs) - set(ours))[:5]}")
        return 1
    for name in sorted(ours):
        x, y = ours[name].float(), theirs[name].float()
        if x.shape != y.shape or not torch.equal(x, y):
            print(f"FAIL: {name}: k3-genweights {tuple(x.shape)} vs mirror {tuple(y.shape)}, "
                  f"max diff {(x - y).abs().max().item() if x.shape == y.shape else 'n/a'}")
            return 1
    print(f"OK: {len(ours)} tensors equal bit for bit")
    return 0


@torch.no_grad()
def cmd_hf_logits(a):
    with open(a.prompts) as f:
        prompts = json.load(f)
    model = build(a.config, a.seed, a.device, DTYPES[a.dtype])
    t0 = time.time()
    rows = []
    for p in prompts:
        rows.append(model(torch.tensor([p], device=a.device)).logits[0].float().cpu())
    out = torch.cat(rows).contiguous()
    out.numpy().tofile(a.out)
    print(f"wrote {a.out}: logits {tuple(out.shape)} of {len(prompts)} prompts in {time.time() - t0:.1f} s"
          + (f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if a.device.startswith("cuda") else ""),
          flush=True)
    return 0


def cmd_compare(a):
    ref = np.fromfile(a.ref, dtype=np.float32).reshape(-1, a.vocab)
    got = np.fromfile(a.got, dtype=np.float32).reshape(-1, a.vocab)
    if ref.shape != got.shape:
        print(f"FAIL: shapes differ: ref {ref.shape}, got {got.shape}")
        return 1
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    scale = np.maximum(1.0, np.abs(ref).max(axis=1))
    r = {
        "positions": int(ref.shape[0]),
        "vocab": a.vocab,
        "max_abs_logit_error": float(err.max()),
        "mean_abs_logit_error": float(err.mean()),
        "max_relative_logit_error": float((err.max(axis=1) / scale).max()),
        "ref_logit_rms": float(np.sqrt((ref.astype(np.float64) ** 2).mean())),
        "ref_max_abs_logit": float(np.abs(ref).max()),
        "top1_agreement": float((ref.argmax(axis=1) == got.argmax(axis=1)).mean()),
    }
    print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p = sub.add_parser("check-files")
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--scratch", required=True)
    p = sub.add_parser("hf-logits")
    p.add_argument("--config", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p = sub.add_parser("compare")
    p.add_argument("--ref", required=True)
    p.add_argument("--got", required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--json", default="")
    a = ap.parse_args()
    if a.cmd != "hf-logits" or a.device == "cpu":
        torch.set_num_threads(int(os.environ.get("K3_TORCH_THREADS", "2")))
    fn = {"prompts": cmd_prompts, "check-files": cmd_check_files, "hf-logits": cmd_hf_logits, "compare": cmd_compare}
    sys.exit(fn[a.cmd](a) or 0)


if __name__ == "__main__":
    main()
