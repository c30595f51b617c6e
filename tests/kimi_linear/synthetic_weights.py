"""The weight generator of k3serve (common/core/counter_random.h, common/model/weights_init.cpp) in
PyTorch, for filling a transformers KimiLinearForCausalLM with the numbers `--model synthetic:...`
and k3-genweights produce, without files.

Element i of the tensor named N (k3serve's Hugging Face checkpoint name) is
    uniform(tensor_seed(seed, N), i, scale(std of N's rule)),
computed with 64-bit integer arithmetic (int64 tensors, which wrap like uint64 for +, *, ^ and
masked shifts) and one float32 multiply, then rounded to bf16 (the matrix dtype of synthetic
models). dt_bias uses double-precision exp/log as the C++ does (Python's math calls the same libm).
"""
import math

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def _i64(u):
    """A uint64 as the int64 with the same bits."""
    u &= MASK64
    return u - (1 << 64) if u >= (1 << 63) else u


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def fnv1a(s):
    h = 1469598103934665603
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) & MASK64
    return h


def tensor_seed(seed, name):
    return splitmix64((seed ^ splitmix64(fnv1a(name))) & MASK64)


def _lsr(x, k):
    """Logical right shift of int64 tensors holding uint64 bits."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _splitmix64_t(x):
    x = x + _i64(0x9E3779B97F4A7C15)
    x = (x ^ _lsr(x, 30)) * _i64(0xBF58476D1CE4E5B9)
    x = (x ^ _lsr(x, 27)) * _i64(0x94D049BB133111EB)
    return x ^ _lsr(x, 31)


def uniform_scale(std32):
    return np.float32(float(np.float32(std32)) * math.sqrt(3.0) / 16777216.0)


def uniform(seeds, n, scale, device):
    """float32 [len(seeds), n]: row r is counter_random::uniform(seeds[r], i, scale) for i < n."""
    s = torch.tensor([_i64(v) for v in seeds], dtype=torch.int64, device=device).view(-1, 1)
    x = _splitmix64_t(s + torch.arange(n, dtype=torch.int64, device=device).view(1, -1))
    c = _lsr(x, 40) - (1 << 23)
    return (2 * c + 1).to(torch.float32) * torch.tensor(float(scale), dtype=torch.float32, device=device)


def dt_bias_values(ts, n):
    out = np.empty(n, dtype=np.float32)
    lo, hi = math.log(1e-3), math.log(1e-1)
    for i in range(n):
        u = (float(splitmix64((ts + i) & MASK64) >> 11) + 1.0) * 2.0 ** -53
        dt = max(1e-4, math.exp(lo + u * (hi - lo)))
        out[i] = np.float32(dt + math.log(-math.expm1(-dt)))
    return torch.from_numpy(out)


def init_rule(cfg, name, shape):
    """('uniform', std32) | ('constant', v) | ('dt_bias', None): weights_init.cpp's init_rule for the
    Kimi Linear family (plain residual, no latent MoE); `cfg` is a transformers KimiLinearConfig."""
    d = cfg.hidden_size
    out_scale = 1.0 / math.sqrt(2.0 * cfg.num_hidden_layers)
    if name == "model.embed_tokens.weight":
        return "uniform", np.float32(1.0)
    if name == "lm_head.weight":
        return "uniform", np.float32(1.0 / math.sqrt(d))
    if name.endswith("norm.weight"):
        return "constant", 1.0
    if name.endswith("_conv1d.weight"):
        return "uniform", np.float32(1.0 / math.sqrt(cfg.linear_attn_config["short_conv_kernel_size"]))
    if name.endswith(".A_log"):
        return "constant", 0.0
    if name.endswith(".dt_bias"):
        return "dt_bias", None
    if name.endswith(".e_score_correction_bias"):
        return "uniform", np.float32(0.01)
    assert len(shape) == 2, f"no init rule for {name} of shape {shape}"
    fan_in_std = 1.0 / math.sqrt(float(shape[1]))
    residual = any(name.endswith(s) for s in ("self_attn.o_proj.weight", "mlp.down_proj.weight",
                                              "routed_expert_up_proj.weight", "shared_experts.down_proj.weight",
                                              ".w2.weight"))
    return "uniform", np.float32(fan_in_std * out_scale if residual else fan_in_std)


def draw(cfg, names, shape, seed, device):
    """bf16-rounded float32 [len(names), *shape]: the tensors `names` (all of one shape and rule kind)."""
    n = int(np.prod(shape))
    kind, arg = init_rule(cfg, names[0], shape)
    if kind == "uniform":
        out = []
        step = max(1, (1 << 27) // max(n, 1))  # bound the int64 temporaries
        for k in range(0, len(names), step):
            group = names[k:k + step]
            scales = {init_rule(cfg, nm, shape)[1] for nm in group}
            assert len(scales) == 1, f"mixed rules in {group}"
            v = uniform([tensor_seed(seed, nm) for nm in group], n, uniform_scale(arg), device)
            out.append(v.to(torch.bfloat16).to(torch.float32))
        return torch.cat(out).view(len(names), *shape)
    if kind == "constant":
        return torch.full((len(names), *shape), float(arg), dtype=torch.float32, device=device)
    vals = [dt_bias_values(tensor_seed(seed, nm), n).to(torch.bfloat16).to(torch.float32) for nm in names]
    return torch.stack(vals).view(len(names), *shape).to(device)


def _layer(name):
    return int(name.split(".")[2])


@torch.no_grad()
def fill_kimi_linear(model, seed):
    """Fills every parameter and buffer of a transformers KimiLinearForCausalLM (any device, any
    dtype, e.g. after to_empty) with k3serve's synthetic weights for `seed`. Returns the number of
    k3serve tensors drawn."""
    cfg = model.config
    dense = cfg.first_k_dense_replace
    drawn = 0
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    for hf, t in tensors.items():
        dev = t.device
        # k3serve's (Hugging Face checkpoint) names; transformers keeps some tensors fused in memory.
        name = hf.replace(".forget_gate.", ".")
        if ".layers." in name and ".mlp." in name and _layer(name) >= dense:
            name = name.replace(".mlp.", ".block_sparse_moe.")
        if name.endswith(".self_attn.conv1d.weight"):
            base = name[: -len("conv1d.weight")]
            P = t.shape[0] // 3
            v = draw(cfg, [base + z + "_conv1d.weight" for z in ("q", "k", "v")], (P, 1, t.shape[2]), seed, dev)
            t.copy_(v.reshape(t.shape))
            drawn += 3
        elif name.endswith(".experts.gate_up_proj"):
            E, f2, dm = t.shape
            f = f2 // 2
            base = name[: -len("gate_up_proj")]
            for half, w in ((0, "w1"), (1, "w3")):
                v = draw(cfg, [f"{base}{e}.{w}.weight" for e in range(E)], (f, dm), seed, dev)
                t[:, half * f:(half + 1) * f, :].copy_(v)
            drawn += 2 * E
        elif name.endswith(".experts.down_proj"):
            E = t.shape[0]
            base = name[: -len("down_proj")]
            t.copy_(draw(cfg, [f"{base}{e}.w2.weight" for e in range(E)], tuple(t.shape[1:]), seed, dev))
            drawn += E
        else:
            t.copy_(draw(cfg, [name], tuple(t.shape), seed, dev)[0])
            drawn += 1
    return drawn
