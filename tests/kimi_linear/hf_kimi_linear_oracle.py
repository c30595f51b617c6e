#!/usr/bin/env python3
"""Reference outputs for the Kimi Linear tests, from the `transformers` package's own implementation.

For each variant below this builds a tiny random KimiLinearForCausalLM with transformers (fp32, CPU),
saves it with save_pretrained into OUT/<variant>/ (one variant sharded, with
model.safetensors.index.json), copies the tokenizer files from --tokenizer-dir next to it, and writes
OUT/<variant>/oracle.json:
  prompts:       8 random prompts of 64 token ids
  logits_file:   "logits.f32": float32 [8, 64, vocab], teacher-forced logits of every position
  gen_prompts:   2 shorter prompts;  greedy: 32 greedy tokens after each (transformers' generate)

With --load DIR (repeatable) it also loads an existing directory with from_pretrained (e.g. what
k3-genweights --preset kimi-linear-tiny wrote) and writes the same oracle files into it.

Usage: hf_kimi_linear_oracle.py --out DIR --tokenizer-dir DIR --vocab N [--variants a,b] [--load DIR]
Exit status 77 when torch or transformers cannot be imported (the test reports it as skipped).
"""
import argparse
import json
import math
import os
import shutil
import time
import sys

try:
    import torch
    from transformers import KimiLinearConfig, KimiLinearForCausalLM
except ImportError as e:  # the venv of tools/test.sh has them (tests/requirements.txt)
    print(f"SKIP: {e}")
    sys.exit(77)

# The layer schedules are 1-based, as config.json writes them. q_lora_rank None is the released
# model's choice (a plain q_proj); an int adds the q_a/q_b bottleneck.
VARIANTS = {
    # 4 layers: KDA, KDA, KDA, MLA (the 3:1 rule); one dense layer; no query bottleneck.
    "qnull_dense1": dict(layers=4, kda=[1, 2, 3], mla=[4], q_lora=None, dense=1, shards=False),
    # 6 layers, MLA first and in the middle; two dense layers; a query bottleneck; sharded files.
    "qlora_dense2": dict(layers=6, kda=[2, 3, 5, 6], mla=[1, 4], q_lora=24, dense=2, shards=True),
}


def build(v, vocab, seed):
    cfg = KimiLinearConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=v["layers"], num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=32, q_lora_rank=v["q_lora"], qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        num_experts=8, num_experts_per_token=2, num_shared_experts=1, routed_scaling_factor=2.446,
        first_k_dense_replace=v["dense"], rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, tie_word_embeddings=False,
        linear_attn_config={"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
                            "kda_layers": v["kda"], "full_attn_layers": v["mla"]},
        attn_implementation="eager")
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(cfg).eval()
    # transformers' init (std 0.02) leaves the logits near zero, which would make a relative check
    # weak: redraw so every layer moves the residual stream and the logits are O(1).
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue  # FLA's init: decay rates in [1, 16], dt in [1e-3, 1e-1]
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif "conv1d" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return model


@torch.no_grad()
def greedy(model, prompt, n):
    # transformers' own generation loop: prefill, then its recurrent KDA / cached MLA decode steps.
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--load", action="append", default=[])
    a = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    jobs = [(name, os.path.join(a.out, name)) for name in a.variants.split(",") if name]
    jobs += [(None, d) for d in a.load]
    for k, (name, d) in enumerate(jobs):
        if name is None:
            model = KimiLinearForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        else:
            v = VARIANTS[name]
            model = build(v, a.vocab, a.seed + 100 * k)
            # Small shards exercise model.safetensors.index.json as transformers writes it.
            model.save_pretrained(d, max_shard_size="100KB" if v["shards"] else "10GB")
            for f in ("tiktoken.model", "tokenizer_config.json"):
                shutil.copy(os.path.join(a.tokenizer_dir, f), os.path.join(d, f))
        g = torch.Generator().manual_seed(a.seed + k)
        prompts = torch.randint(0, a.vocab, (8, 64), generator=g)
        with torch.no_grad():
            logits = model(prompts).logits.float().contiguous()
        logits.numpy().tofile(os.path.join(d, "logits.f32"))
        gen_prompts = [prompts[0, :16].tolist(), prompts[1, :5].tolist()]
        oracle = {"prompts": prompts.tolist(), "logits_file": "logits.f32", "vocab": a.vocab,
                  "gen_prompts": gen_prompts, "greedy": [greedy(model, p, 32) for p in gen_prompts]}
        with open(os.path.join(d, "oracle.json"), "w") as f:
            json.dump(oracle, f)
        print(f"wrote {d}")
        print(f"{d}: {time.time() - t0:.1f} s since start", file=sys.stderr)


if __name__ == "__main__":
    main()
