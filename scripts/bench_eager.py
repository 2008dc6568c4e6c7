#!/usr/bin/env python3
"""bench_eager.py: a sample model's training step in eager PyTorch, beside apc-train's.

    bench_eager.py MODEL [--shape 64,128] [--device cuda] [--steps 20] [--warmup 3]
                   [--apc-profile FILE]

What a PyTorch user runs instead of apc on one device: the model of sample_models/models.py (the
code the samples were traced and exported from, with random weights), one step = forward, the
loss apc-train computes (cross-entropy over the last dim of the output against random targets),
backward and torch.optim.SGD's step (PyTorch's default implementation for the device: foreach
kernels on CUDA), in train mode where the sample was traced in train mode, else eval mode as the
sample. Prints the median step time over --steps steps after --warmup (CUDA synchronized at step
boundaries). With --apc-profile (apc-train --profile --json's output on the same model, batch and
device) it prints apc's measured step (forward + backward + optimizer + the trainer's loss) and
the ratio apc / eager. Benchmarks print figures; correctness lives in the tests.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sample_models"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models as M  # noqa: E402

# name -> (builder, input dtype, default input shape, integer input bound or None)
CASES = {
    "mlp_stack": (lambda: M.MlpStack(M.MLP_STACK), torch.float32, [8, 64, 128], None),
    "toy_block": (lambda: M.ToyBlock(M.TOY_BLOCK), torch.float32, [8, 128, 1024], None),
    "llama_small": (lambda: M.Llama(M.LLAMA_SMALL), torch.int64, [8, 128], M.LLAMA_SMALL.vocab_size),
    "llama_tiny": (lambda: M.Llama(M.LLAMA_TINY), torch.int64, [8, 64], M.LLAMA_TINY.vocab_size),
    "gpt2_small": (lambda: M.GPT2(M.GPT2_SMALL), torch.int64, [8, 128], M.GPT2_SMALL.vocab_size),
    "cnn_small": (lambda: M.CnnSmall(M.CNN_SMALL), torch.float32, [8, 3, 32, 32], None),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(CASES))
    ap.add_argument("--shape", help="input shape, comma separated (default: the sample's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (apc-train's default: 1)")
    ap.add_argument("--apc-profile", help="apc-train --profile --json output to compare with")
    a = ap.parse_args()

    build, dtype, shape, bound = CASES[a.model]
    if a.shape:
        shape = [int(s) for s in a.shape.split(",")]
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build().to(dev).eval()  # the samples are traced in eval mode (BN uses its statistics)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    times = []
    for step in range(a.warmup + a.steps):
        if bound:
            x = torch.randint(0, bound, shape, generator=gen).to(dev)
        else:
            x = torch.randn(shape, generator=gen).to(dev, dtype)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        if isinstance(out, (tuple, list)):
            out = out[0]
        logits = out.reshape(-1, out.shape[-1]).float()
        targets = torch.randint(0, out.shape[-1], (logits.shape[0],), device=dev)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        opt.step()
        sync()
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    eager = statistics.median(times)
    line = (f"{a.model} [{','.join(map(str, shape))}] on {a.device}: eager PyTorch {torch.__version__} "
            f"step {eager:.3f} ms (median of {a.steps}, min {min(times):.3f})")
    if a.apc_profile:
        p = json.loads(open(a.apc_profile).read().strip().splitlines()[-1])
        apc = p["measured_step_ms"] + p["measured_ms"].get("loss_outside_program", 0.0)
        line += f", apc-train {apc:.3f} ms, ratio apc/eager {apc / eager:.3f}"
    print(line, flush=True)


if __name__ == "__main__":
    main()
