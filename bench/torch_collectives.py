#!/usr/bin/env python3
"""PyTorch's NCCL collectives (torch.distributed), the anchor `k3-bench collectives` is read beside.

One process per GPU, the same sizes and columns as `k3-bench collectives` (nccl-tests' convention):
size = bytes of one rank's whole buffer; time = the slowest rank's mean over --iters calls after --warmup,
the calls queued back to back and synchronised once (as nccl-tests times them); algbw = size / time;
busbw = algbw x (n - 1) / n (all_reduce: 2 (n - 1) / n). all_to_allv sends the uneven blocks k3-bench does.

    python3 bench/torch_collectives.py --gpus 8 --min-bytes 1K --max-bytes 256M
"""
import argparse
import os
import sys
import time


def parse_bytes(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def uneven_block(even, src, dst, n):
    units = max(1, even // 16)
    k = (src * 7 + dst * 3) % n
    return 16 * max(1, units // 2 + units * k // max(1, n - 1))


def worker(rank, args, port, queue):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.gpus)
    n = args.gpus
    dev = torch.device("cuda", rank)
    size = parse_bytes(args.min_bytes)
    hi = parse_bytes(args.max_bytes)
    rows = []
    while size <= hi:
        block = max(16, size // n // 16 * 16)
        whole = block * n
        u8_in = torch.zeros(whole, dtype=torch.uint8, device=dev)
        u8_out = torch.zeros(whole, dtype=torch.uint8, device=dev)
        f_in = torch.zeros(whole // 4, dtype=torch.float32, device=dev)
        f_out = torch.zeros(block // 4, dtype=torch.float32, device=dev)
        send = [uneven_block(block, rank, q, n) for q in range(n)]
        recv = [uneven_block(block, q, rank, n) for q in range(n)]
        v_in = torch.zeros(sum(send), dtype=torch.uint8, device=dev)
        v_out = torch.zeros(sum(recv), dtype=torch.uint8, device=dev)
        ops = {
            "all_gather": (lambda: dist.all_gather_into_tensor(u8_out, u8_in[:block]), whole),
            "reduce_scatter": (lambda: dist.reduce_scatter_tensor(f_out, f_in), whole),
            "all_reduce": (lambda: dist.all_reduce(f_in), whole),
            "all_to_all": (lambda: dist.all_to_all_single(u8_out, u8_in), whole),
            "all_to_allv": (lambda: dist.all_to_all_single(v_out, v_in, recv, send), sum(send)),
        }
        for name, (call, nbytes) in ops.items():
            for _ in range(args.warmup):
                call()
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                call()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / args.iters * 1e6
            rows.append((name, nbytes, us))
        size *= args.factor
    queue.put((rank, rows))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--min-bytes", default="1K")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=0, help="rendezvous port (0: pick a free one)")
    args = p.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIPPED: torch is not importable here ({e})")
        return 0
    if torch.cuda.device_count() < args.gpus:
        print(f"SKIPPED: {args.gpus} GPU(s) asked, {torch.cuda.device_count()} visible")
        return 0
    port = args.port
    if port == 0:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, queue)) for r in range(args.gpus)]
    for pr in procs:
        pr.start()
    results = [queue.get() for _ in procs]
    for pr in procs:
        pr.join()
    if any(pr.exitcode != 0 for pr in procs):
        print("torch_collectives: a rank failed", file=sys.stderr)
        return 1
    slowest = {}
    order = []
    for _, rows in results:
        for name, nbytes, us in rows:
            key = (name, nbytes)
            if key not in slowest:
                order.append(key)
            slowest[key] = max(slowest.get(key, 0.0), us)
    n = args.gpus
    print(f"# torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} GPU(s), "
          f"one process each, {args.iters} iterations after {args.warmup} warm-up; time = slowest rank")
    print(f"{'op':<15} {'size_B':>12} {'time_us':>12} {'algbw_GB/s':>12} {'busbw_GB/s':>12}")
    for key in order:
        name, nbytes = key
        us = slowest[key]
        alg = nbytes / us / 1e3
        f = 2.0 * (n - 1) / n if name == "all_reduce" else (n - 1) / n
        print(f"{name:<15} {nbytes:>12} {us:>12.2f} {alg:>12.2f} {alg * f:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
