#!/usr/bin/env python3
"""Check the generated samples against out/manifest.json and the eager models.

    .venv/bin/python sample_models/verify.py [--out DIR] [--only NAME,...] [--skip-slow] [--ops]

For every sample:

- <name>.pt: torch.jit.load, compare parameter/buffer names and shapes and the op kinds of the
  inlined forward graph with the manifest (--ops prints them).
- <name>.pt2 (and <name>.core.pt2): torch.export.load, compare parameter names (tied ones
  under every name), shapes and dtypes, buffers, the symbolic dims and their ranges, and the
  serialized graph's ops with the manifest. Stub-weight programs must keep zero-stride weights.
- For samples with real weights (run_forward): run the .pt, the .pt2's module() and the core
  form on the recorded inputs, check output shape/dtype and compare each with the eager model
  rebuilt from models.py, and the .pt with the .pt2 (traced samples were traced with smaller
  example inputs, so this also checks that the traces generalize). Where the batch is dynamic,
  the .pt2 also runs at batch 3 against eager.
"""

import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

if __name__ == "__main__":
    try:
        import torch  # noqa: F401
    except ImportError:  # not the venv: re-run with it (as generate.py does)
        venv_python = os.path.join(os.path.dirname(HERE), ".venv", "bin", "python")
        if os.path.exists(venv_python) and os.path.abspath(sys.executable) != venv_python:
            os.execv(venv_python, [venv_python, os.path.abspath(__file__)] + sys.argv[1:])
        raise

import torch  # noqa: E402
from torch.export.graph_signature import InputKind  # noqa: E402

import generate as G  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

SLOW = {"toy_block"}  # ~17 GFLOP forward
DYN_BATCH = 3  # a batch other than the recorded one, inside every exported range


def tensors_of(dicts):
    return [{"name": n, "shape": list(t.shape), "dtype": G.DTYPE_SHORT[t.dtype]} for n, t in dicts]


def max_rel_err(y, ref):
    """max |y - ref| over all output leaves, relative to max(1, max |ref|); inf if structure differs."""
    ys, yspec = tree_flatten(y)
    rs, rspec = tree_flatten(ref)
    if yspec != rspec or len(ys) != len(rs):
        return float("inf")
    err = 0.0
    for a, b in zip(ys, rs):
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf")
        if a.numel():
            err = max(err, (a - b).abs().max().item() / max(1.0, b.abs().max().item()))
    return err


def check_pt2(e, path, core=False):
    """Load an exported program and compare it with the manifest entry; returns (ep, problems)."""
    ex = e["exported"]
    bad = []
    if e.get("config", {}).get("experts_implementation") == "grouped_mm":
        import transformers.integrations.moe  # noqa: F401  registers transformers::grouped_mm_fallback
    ep = torch.export.load(path)
    sig = ep.graph_signature
    sd = ep.state_dict
    tied = dict((a, c) for a, c in e["tied_parameters"])
    want_names = [p["name"] for p in e["parameters"]] + list(tied)
    if list(sig.parameters) != want_names:
        bad.append("parameter names")
    by_name = {p["name"]: p for p in e["parameters"]}
    for n in sig.parameters:
        p = sd[n]
        m = by_name.get(tied.get(n, n))
        if m is None or list(p.shape) != m["shape"] or G.DTYPE_SHORT[p.dtype] != m["dtype"]:
            bad.append(f"parameter {n}")
        if e["stub_weights"] and any(s != 0 for s in p.stride()):
            bad.append(f"stub parameter {n} is not zero-stride")
    for a, c in tied.items():
        if sd[a].data_ptr() != sd[c].data_ptr():
            bad.append(f"tied {a} does not share {c}'s storage")
    consts = {**sd, **ep.constants}
    bufs = sorted(tensors_of((n, consts[n]) for n in sig.buffers), key=lambda b: b["name"])
    if bufs != sorted(e["buffers"], key=lambda b: b["name"]):
        bad.append("buffers")
    if G.dynamic_dims(ep) != ex["dynamic"]:
        bad.append("dynamic dims")
    ops = G.pt2_graph_ops(path)
    if ops != ex["core_graph_ops" if core else "graph_ops"]:
        bad.append("graph ops")
    user = [i.arg.name for i in sig.input_specs if i.kind == InputKind.USER_INPUT]
    if user != [i["name"] for i in e["inputs"]]:
        bad.append("input names")
    return ep, ops, bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--only", default="")
    ap.add_argument("--skip-slow", action="store_true", help=f"do not run forward of {sorted(SLOW)}")
    ap.add_argument("--ops", action="store_true", help="print op kinds of each graph")
    args = ap.parse_args()
    G.quiet_warnings()
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)

    with open(os.path.join(args.out, "manifest.json")) as f:
        manifest = json.load(f)
    table = {s.name: s for s in G.sample_table()}
    only = set(n for n in args.only.split(",") if n)
    ok = True
    for e in manifest["samples"]:
        name = e["name"]
        if only and name not in only:
            continue
        problems = []
        path = os.path.join(args.out, e["file"])
        m = torch.jit.load(path)
        if tensors_of(m.named_parameters()) != e["parameters"]:
            problems.append("parameters")
        if tensors_of(m.named_buffers()) != e["buffers"]:
            problems.append("buffers")
        if sum(p.numel() for _, p in m.named_parameters()) != e["param_count"]:
            problems.append("param_count")
        ops = G.graph_ops(m)
        if ops != e["graph_ops"]:
            problems.append("graph ops")
        flow = [o for o in ops if o in ("prim::If", "prim::Loop", "prim::PythonOp")]
        line = f"{name:20s} {e['kind']:8s} {os.path.getsize(path):>10d} B  params {e['param_count']:>13,d}"

        ex = e.get("exported")
        programs = []  # (label, ExportedProgram)
        pt2_ops = core_ops = None
        if ex:
            t0 = time.time()
            ep, pt2_ops, bad = check_pt2(e, os.path.join(args.out, ex["file"]))
            problems += [f".pt2 {b}" for b in bad]
            programs.append(("pt2", ep))
            if ex["core_file"]:
                cep, core_ops, bad = check_pt2(e, os.path.join(args.out, ex["core_file"]), core=True)
                problems += [f".core.pt2 {b}" for b in bad]
                programs.append(("core", cep))
            dyn = ",".join(f"{i}[{d}]:{r['min']}..{r['max']}" for i, dims in ex["dynamic"].items()
                           for d, r in dims.items())
            line += f"  pt2 {ex['file_size']:>9d} B load {time.time() - t0:.1f}s dyn {dyn or 'static'}"

        inputs = [G.InputSpec(i["name"], i["dtype"], i["shape"], i.get("range", [0, 0])[1]) for i in e["inputs"]]
        if e["run_forward"] and not (args.skip_slow and name in SLOW):
            xs = [i.make() for i in inputs]
            t0 = time.time()
            with torch.no_grad():
                y = m(*xs)
            dt = time.time() - t0
            first = tree_flatten(y)[0][0]
            if list(first.shape) != e["output"]["shape"] or G.DTYPE_SHORT[first.dtype] != e["output"]["dtype"]:
                problems.append(f"output {list(first.shape)} {first.dtype}")
            eager = table[name].build()
            with torch.no_grad():
                ref = eager(*xs)
            err = max_rel_err(y, ref)
            line += f"  fwd {dt:.2f}s |pt-eager| {err:.0e}"
            if err > 1e-5:
                problems.append(f".pt differs from eager ({err:.1e})")
            for label, ep in programs:
                mod = ep.module()
                with torch.no_grad():
                    yp = mod(*xs)
                err_e, err_pt = max_rel_err(yp, ref), max_rel_err(yp, y)
                line += f" |{label}-eager| {err_e:.0e} |{label}-pt| {err_pt:.0e}"
                if max(err_e, err_pt) > 1e-5:
                    problems.append(f".{label} differs (eager {err_e:.1e}, pt {err_pt:.1e})")
                if ex["dynamic"]:
                    xb = [i.make([DYN_BATCH] + i.shape[1:]) for i in inputs]
                    with torch.no_grad():
                        err_b = max_rel_err(mod(*xb), eager(*xb))
                    line += f" b{DYN_BATCH} {err_b:.0e}"
                    if err_b > 1e-5:
                        problems.append(f".{label} at batch {DYN_BATCH} differs from eager ({err_b:.1e})")
        else:
            line += "  (forward not run)"
        if flow:
            line += f"  CONTROL FLOW: {flow}"
        if problems:
            ok = False
            line += "  FAILED: " + "; ".join(problems)
        print(line, flush=True)
        if args.ops:
            print("    pt ops:", " ".join(ops))
            if pt2_ops:
                print("    pt2 ops:", " ".join(o.replace("torch.ops.", "") for o in pt2_ops))
            if core_ops:
                print("    core ops:", " ".join(o.replace("torch.ops.", "") for o in core_ops))
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
