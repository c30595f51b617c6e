#!/usr/bin/env python3
"""Reference timings for `k3-bench kernels`, measured on the same GPU in the same run.

fla (flash-linear-attention, Triton) chunk_kda / fused_recurrent_kda, FlashMLA (PyPI
`sgl-flash-mla`: its dense bf16 decode, the `use_legacy=True` path, which takes 64 or 128 heads)
and PyTorch references for MLA decode and the LSE merge, on the shapes of
bench/kernels_bench.cpp; writes {key: microseconds} JSON that `k3-bench-kernels --ref` merges.
fla and FlashMLA are only measured against, never vendored: they are installed from wheels at run
time (docs/PERF.md, "Kernels, second pass"). FlashMLA runs 128 heads for our 96-head rows (what a
user of it would run: SGLang pads K3's 96 heads so) and 64 heads beside our 64-head row.

Method: inputs random (never zeros); fla warmed (its autotuning) outside the timed region;
prefill: median of 10 event-timed calls; decode-size: CUDA-graph replays timed one by one,
median of >= 200, rotating over input sets larger than the L2.
"""
import argparse
import json
import math
import sys
import time

import torch


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


# Spin cycles that hold the stream before each timed call (about 100 us at the H200's clock): the start
# event is then taken with the call's work already queued, not as soon as it is queued on an idle
# stream, which would count the host's submission time as the kernel's. k3-bench holds its stream the
# same way (with a host function), so both sides are timed alike.
HOLD_CYCLES = 200_000


def time_eager(fn, warm=2, iters=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOLD_CYCLES)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return median(out)


def time_graphs(fns, replays=300):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:  # warm-up and autotune outside capture
            f()
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graphs = []
    for f in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            f()
        graphs.append(g)
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()
    out = []
    for i in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOLD_CYCLES)
        a.record()
        graphs[i % len(graphs)].replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return median(out)


def kda_chunk(res, T, H, D=128):
    from fla.ops.kda import chunk_kda
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.rand(1, T, H, D, device=dev) * 2 - 1, dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.rand(1, T, H, D, device=dev) * 2 - 1, dim=-1).bfloat16()
    v = (torch.rand(1, T, H, D, device=dev) * 2 - 1).bfloat16()
    g = -0.01 - 4.99 * torch.rand(1, T, H, D, device=dev)
    beta = torch.rand(1, T, H, device=dev)
    h0 = (torch.rand(1, H, D, D, device=dev) - 0.5) * 0.2
    cu = torch.tensor([0, T], device=dev, dtype=torch.long)

    def run():
        return chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, safe_gate=True,
                         lower_bound=-5.0, state_v_first=True, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())

    t0 = time.time()
    run()
    torch.cuda.synchronize()
    print(f"fla chunk_kda T={T} H={H}: first call (tuning) {time.time() - t0:.1f} s", flush=True)
    res[f"kda_chunk_T{T}_H{H}"] = time_eager(run)


def kda_decode(res, B, H, D=128):
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    dev = "cuda"
    state_bytes = B * H * D * D * 4
    R = max(1, math.ceil(256 * 2**20 / state_bytes))
    pool = (torch.rand(B * R, H, D, D, device=dev) - 0.5) * 0.2
    q = (torch.rand(1, B, H, D, device=dev) * 2 - 1).bfloat16()
    k = (torch.rand(1, B, H, D, device=dev) * 2 - 1).bfloat16()
    v = (torch.rand(1, B, H, D, device=dev) * 2 - 1).bfloat16()
    f = (torch.rand(1, B, H, D, device=dev) * 4 - 2).bfloat16()
    b = (torch.rand(1, B, H, device=dev) * 4 - 2).bfloat16()
    a_log = torch.rand(H, device=dev) - 0.5
    dt = torch.rand(H * D, device=dev) - 0.5
    cu = torch.arange(B + 1, device=dev, dtype=torch.long)
    out = torch.empty_like(v)
    idx = [torch.arange(r * B, (r + 1) * B, device=dev, dtype=torch.int32) for r in range(R)]

    def make(r):
        def run():
            fused_recurrent_kda_fwd(q=q, k=k, v=v, g=f, beta=b, A_log=a_log, dt_bias=dt, initial_state=pool,
                                    inplace_final_state=True, state_v_first=True, cu_seqlens=cu,
                                    ssm_state_indices=idx[r], use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                    use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, out=out)
        return run

    res[f"kda_decode_B{B}_H{H}"] = time_graphs([make(r) for r in range(R)])


def mla_decode(res, H, B, ctx, R=512, Dr=64):
    dev = "cuda"
    kv = (torch.rand(B, ctx, R + Dr, device=dev) * 2 - 1).bfloat16()
    q = ((torch.rand(B, H, R + Dr, device=dev) * 2 - 1) * 0.2).bfloat16()
    scale = 192 ** -0.5

    def run():
        s = torch.einsum("bhd,btd->bht", q, kv).float() * scale
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None]).bfloat16()
        o = torch.einsum("bht,btd->bhd", p, kv[..., :R])
        return o, lse

    res[f"mla_decode_H{H}_B{B}_ctx{ctx}"] = time_graphs([run], replays=200)


def flashmla_decode(res, H, B, ctx, R=512, Dr=64, page=64):
    """FlashMLA dense bf16 decode: paged cache [pages, 64, 1, 576] with shuffled pages, q [B, 1, H, 576]."""
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata
    dev = "cuda"
    pages_per = ctx // page
    kv = ((torch.rand(B * pages_per, page, 1, R + Dr, device=dev) * 2 - 1)).bfloat16()
    q = ((torch.rand(B, 1, H, R + Dr, device=dev) * 2 - 1) * 0.2).bfloat16()
    table = torch.randperm(B * pages_per, device=dev, dtype=torch.int64).to(torch.int32).view(B, pages_per)
    lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
    scale = 192 ** -0.5
    sched, _ = get_mla_metadata()

    def run():
        return flash_mla_with_kvcache(q, kv, table, lens, R, sched, softmax_scale=scale, causal=False,
                                      use_legacy=True)

    if B <= 32:  # same function as ours: check once against the PyTorch reference (contiguous KV)
        o, lse = run()
        kvc = kv.view(-1, R + Dr)[(table.long()[..., None] * page + torch.arange(page, device=dev)).view(B, -1)]
        s = torch.einsum("bhd,btd->bht", q[:, 0].float(), kvc.float()) * scale
        ref_lse = torch.logsumexp(s, dim=-1)
        ref_o = torch.einsum("bht,btd->bhd", torch.softmax(s, dim=-1), kvc[..., :R].float())
        err = ((o[:, 0].float() - ref_o).norm() / ref_o.norm()).item()
        lerr = ((lse.view(B, H).float() - ref_lse).norm() / ref_lse.norm()).item()
        print(f"flashmla H={H} B={B} ctx={ctx}: rel L2 error vs torch: out {err:.2e}, lse {lerr:.2e}", flush=True)
        res[f"flashmla_check_H{H}_B{B}_ctx{ctx}"] = {"out_rel_l2": err, "lse_rel_l2": lerr}
    res[f"flashmla_H{H}_B{B}_ctx{ctx}"] = time_graphs([run], replays=200)


def lse_merge(res, N, B, H, D):
    dev = "cuda"
    parts = torch.rand(N, B, H, D, device=dev) * 2 - 1
    lse = torch.rand(N, B, H, device=dev) * 6 - 3

    def run():
        m = lse.max(dim=0).values
        w = torch.exp(lse - m)
        s = w.sum(0)
        o = (w[..., None] * parts).sum(0) / s[..., None]
        return o.bfloat16(), m + torch.log(s)

    res[f"lse_merge_N{N}_B{B}_H{H}_D{D}"] = time_graphs([run], replays=200)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-fla", action="store_true")
    ap.add_argument("--skip-torch-mla", action="store_true", help="FlashMLA only for MLA decode")
    ap.add_argument("--only", default="", help="comma-separated families: flashmla, torch_mla, lse_merge, "
                    "kda_decode, kda_chunk (default: every one not skipped)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    unknown = only - {"flashmla", "torch_mla", "lse_merge", "kda_decode", "kda_chunk"}
    if unknown:
        ap.error("--only: unknown families " + ", ".join(sorted(unknown)))

    def want(family):
        return not only or family in only

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    steps = []
    # FlashMLA: 128 heads for our 96-head rows, 64 beside our 64-head row (it takes no other count).
    if want("flashmla"):
        steps += [lambda H=H, B=B, c=c: flashmla_decode(res, H, B, c) for H, B, c in
                  ((128, 32, 4096), (128, 64, 8192), (128, 128, 16384), (64, 64, 8192))]
    if not args.skip_torch_mla and want("torch_mla"):
        steps += [lambda H=H, B=B, c=c: mla_decode(res, H, B, c) for H, B, c in
                  ((96, 32, 4096), (96, 64, 8192), (96, 128, 16384), (64, 64, 8192), (16, 64, 8192),
                   (16, 128, 16384))]
    if want("lse_merge"):
        steps += [lambda: lse_merge(res, 8, 128, 96, 512)]
    if not args.skip_fla:  # last: fla's autotuning takes ~90 s per prefill shape
        if want("kda_decode"):
            steps += [lambda B=B: kda_decode(res, B, 96) for B in (1, 32, 256)]
        if want("kda_chunk"):
            steps += [lambda: kda_chunk(res, 8192, 96), lambda: kda_chunk(res, 32768, 32)]
    for st in steps:
        try:
            st()
        except Exception as e:  # one failing reference must not lose the others
            print(f"reference step failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        with open(args.out, "w") as fh:  # written after every step: a timeout keeps what finished
            json.dump(res, fh, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
