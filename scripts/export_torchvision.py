#!/usr/bin/env python3
"""export_torchvision.py: torchvision models as torch.export programs, for the benchmarks.

    .venv-cuda/bin/python3 scripts/export_torchvision.py [--out DIR] [--models a,b] [--batch 8]
        [--size 64] [--no-dropout]

Models we did not write, for scripts/bench_fidelity.py's --model NAME=PATH (and anything else that
takes a .pt2): each torchvision builder with random weights (no download), in training mode (batch
norm's batch statistics, as a user trains it), exported with torch.export on one example batch of
B x 3 x S x S and saved as DIR/tv_<name>.pt2. One line per model written; nothing is written for a
model that fails to build or export (its error is printed and the exit code is 1).

torchvision does not import beside the project venv's CPU torch 2.13 on this machine kind ('operator
torchvision::nms does not exist'); its pair is torch 2.14.1 with torchvision 0.29.1, which
scripts/torchvision_models.sh installs into .venv-cuda (the CUDA build runs on the CPU too). apc
reads the programs that torch 2.14.1 writes (docs/TOOLCHAIN.md).
"""
import argparse
import os
import sys
import time

DEFAULT_MODELS = "resnet18,mobilenet_v3_small,shufflenet_v2_x0_5"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "sample_models", "out", "torchvision"))
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help=f"torchvision.models builders, comma-separated (default {DEFAULT_MODELS})")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=64, help="image height and width")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--no-dropout", action="store_true",
                    help="set every dropout's p to 0 (files named tv_<name>_nodrop.pt2): a program "
                         "that draws no random numbers, which a sharded run reproduces number for "
                         "number (apc-train --compare-single)")
    args = ap.parse_args()

    import torch
    import torchvision

    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for name in filter(None, args.models.split(",")):
        t0 = time.time()
        try:
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, weights=None, num_classes=args.classes)
            model.train()
            if args.no_dropout:
                for m in model.modules():
                    if isinstance(m, torch.nn.modules.dropout._DropoutNd):
                        m.p = 0.0
                    # torchvision's stochastic depth (efficientnet, convnext, swin)
                    if type(m).__name__ == "StochasticDepth":
                        m.p = 0.0
            x = torch.randn(args.batch, 3, args.size, args.size)
            ep = torch.export.export(model, (x,))
            path = os.path.join(args.out, f"tv_{name}{'_nodrop' if args.no_dropout else ''}.pt2")
            torch.export.save(ep, path)
        except Exception as e:  # one model's failure leaves the others
            print(f"export_torchvision: {name}: {type(e).__name__}: {str(e).splitlines()[0]}",
                  file=sys.stderr)
            failed += 1
            continue
        params = sum(p.numel() for p in model.parameters())
        print(f"{path}: torchvision {torchvision.__version__} {name}, {params / 1e6:.2f} M parameters, "
              f"input {args.batch}x3x{args.size}x{args.size}, torch {torch.__version__}, "
              f"{time.time() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
