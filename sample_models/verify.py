#!/usr/bin/python3
"""Check the generated samples against out/manifest.json and the eager models.

    /usr/bin/python3 sample_models/verify.py [--out DIR] [--only NAME,...] [--skip-slow] [--ops]

For every sample: torch.jit.load, compare parameter/buffer names and shapes
with the manifest, print the op kinds of the inlined forward graph (--ops).
For samples with real weights (run_forward): run the loaded module on the
default inputs, check output shape/dtype and compare with the eager model
rebuilt from models.py (traced samples were traced with smaller example
inputs, so this also checks that the traces generalize).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import generate as G  # noqa: E402

SLOW = {"toy_block"}  # ~17 GFLOP forward; slow with the reference BLAS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--only", default="")
    ap.add_argument("--skip-slow", action="store_true", help=f"do not run forward of {sorted(SLOW)}")
    ap.add_argument("--ops", action="store_true", help="print op kinds of each inlined graph")
    args = ap.parse_args()

    with open(os.path.join(args.out, "manifest.json")) as f:
        manifest = json.load(f)
    table = {s.name: s for s in G.sample_table()}
    only = set(n for n in args.only.split(",") if n)
    ok = True
    for e in manifest["samples"]:
        name = e["name"]
        if only and name not in only:
            continue
        path = os.path.join(args.out, e["file"])
        m = torch.jit.load(path)
        params = [{"name": n, "shape": list(p.shape), "dtype": G.DTYPE_SHORT[p.dtype]}
                  for n, p in m.named_parameters()]
        bufs = [{"name": n, "shape": list(b.shape), "dtype": G.DTYPE_SHORT[b.dtype]}
                for n, b in m.named_buffers()]
        assert params == e["parameters"], name
        assert bufs == e["buffers"], name
        assert sum(p.numel() for _, p in m.named_parameters()) == e["param_count"], name
        ops = G.graph_ops(m)
        assert ops == e["graph_ops"], name
        bad = [o for o in ops if o in ("prim::If", "prim::Loop", "prim::PythonOp")]
        line = f"{name:22s} {e['kind']:8s} {os.path.getsize(path):>10d} B  params {e['param_count']:>13,d}"
        inputs = [G.InputSpec(i["name"], i["dtype"], i["shape"], i.get("range", [0, 0])[1]) for i in e["inputs"]]
        if e["run_forward"] and not (args.skip_slow and name in SLOW):
            xs = [i.make() for i in inputs]
            t0 = time.time()
            with torch.no_grad():
                y = m(*xs)
            dt = time.time() - t0
            assert list(y.shape) == e["output"]["shape"], (name, y.shape)
            assert G.DTYPE_SHORT[y.dtype] == e["output"]["dtype"], (name, y.dtype)
            with torch.no_grad():
                ref = table[name].build()(*xs)
            err = (y - ref).abs().max().item()
            good = err <= 1e-5 * max(1.0, ref.abs().max().item())
            ok &= good
            line += f"  out {list(y.shape)} {e['output']['dtype']}  fwd {dt:.2f}s  max|diff| {err:.1e}"
            line += "" if good else "  MISMATCH"
        else:
            line += f"  out {e['output']['shape']} (forward not run)"
        if bad:
            line += f"  CONTROL FLOW: {bad}"
        print(line, flush=True)
        if args.ops:
            print("    ops:", " ".join(ops))
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
