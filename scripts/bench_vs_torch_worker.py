#!/usr/bin/env python3
"""One rank of PyTorch's own data parallelism on a sample model, for scripts/bench_vs_torch.py.

    torchrun --nproc-per-node 2 scripts/bench_vs_torch_worker.py --model mlp_stack --mode ddp

Builds the sample's eager module (sample_models/generate.py, the same weights as its .pt/.pt2),
wraps it in DistributedDataParallel (--mode ddp) or FSDP2's fully_shard (--mode fsdp2: every
element of every ModuleList, then the root), trains on random data as apc-train does (the global
batch split over the ranks; cross-entropy over the last dim of float outputs of rank >= 2 against
random targets, else the mean square; SGD), and prints on rank 0 one JSON line: the median step
(forward + loss + backward + optimizer, the slowest rank's), its spread and the peak resident set.
Gloo on CPU, one intra-op thread per rank unless --threads. --device cuda: NCCL, the model and the
batch on GPU LOCAL_RANK, each step timed to its end on the device, and also the CUDA caching
allocator's peak over the measured steps (peak_memory_bytes, as apc-train --profile reports it).
--checkpoint: every element of every ModuleList runs under activation checkpointing (torch's
apply_activation_checkpointing, applied before DDP or fully_shard, as torchtitan does).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "sample_models"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import generate  # noqa: E402


def build(name):
    for s in generate.sample_table():
        if s.name == name:
            if s.stub_weights:
                raise SystemExit(f"{name} has stub weights; pick a sample with real weights")
            return s, s.build()
    raise SystemExit(f"unknown sample {name}")


def inputs(sample, rank, world, gen, device):
    out = []
    for spec in sample.inputs:
        shape = list(spec.shape)
        if shape[0] % world:
            raise SystemExit(f"batch {shape[0]} does not split over {world} ranks")
        shape[0] //= world
        if spec.dtype in ("i64", "i32"):
            vocab = sample.config.vocab_size if hasattr(sample.config, "vocab_size") else \
                sample.config["vocab_size"]
            out.append(torch.randint(0, vocab, shape, generator=gen).to(device))
        else:
            dtype = {"f32": torch.float32, "f64": torch.float64}[spec.dtype]
            out.append(torch.randn(shape, generator=gen, dtype=dtype).to(device))
    return out


def loss_of(out, gen):
    if isinstance(out, (tuple, list)):
        out = out[0]
    if out.numel() == 1:
        return out.reshape(())
    if out.is_floating_point() and out.dim() >= 2:
        logits = out.reshape(-1, out.shape[-1])
        targets = torch.randint(0, out.shape[-1], (logits.shape[0],), generator=gen)
        targets = targets.to(logits.device)
        return torch.nn.functional.cross_entropy(logits, targets)
    return out.pow(2).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["ddp", "fsdp2"], required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--checkpoint", action="store_true",
                    help="activation checkpointing of every element of every ModuleList "
                         "(apply_activation_checkpointing, non-reentrant), before DDP or FSDP2")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sample, model = build(args.model)
    model = model.to(device)
    if args.checkpoint:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing)
        layers = {id(child) for m in model.modules() if isinstance(m, torch.nn.ModuleList)
                  for child in m}
        if not layers:
            raise SystemExit(f"{args.model} has no ModuleList to checkpoint")
        apply_activation_checkpointing(model, check_fn=lambda m: id(m) in layers)
    if args.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None)
    else:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(args.device, (world,))
        for m in list(model.modules()):
            if isinstance(m, torch.nn.ModuleList):
                for child in m:
                    fully_shard(child, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1234 + rank)
    times = []
    for step in range(args.warmup + args.steps):
        xs = inputs(sample, rank, world, gen, device)
        if cuda and step == args.warmup:
            torch.cuda.reset_peak_memory_stats(device)
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = loss_of(model(*xs), gen)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        if step >= args.warmup:
            times.append((t1 - t0) * 1e3)
    peak_device = float(torch.cuda.max_memory_allocated(device)) if cuda else 0.0
    figures = torch.tensor([statistics.median(times), min(times), max(times),
                            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,
                            peak_device], dtype=torch.float64, device=device)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    figures = figures.cpu()
    if rank == 0:
        print(json.dumps({"model": args.model, "mode": args.mode, "ranks": world,
                          "checkpoint": args.checkpoint,
                          "device": args.device,
                          "measured_step_ms": figures[0].item(), "min_ms": figures[1].item(),
                          "max_ms": figures[2].item(), "peak_rss_bytes": int(figures[3].item()),
                          "peak_memory_bytes": int(figures[4].item()),
                          "torch": torch.__version__}), flush=True)
    dist.barrier()
    # Gloo's teardown at interpreter exit aborts now and then in torch 2.13 ("terminate called
    # without an active exception") after the figures are out: leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
