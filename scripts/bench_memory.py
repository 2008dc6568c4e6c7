#!/usr/bin/env python3
"""bench_memory.py: the predicted peak memory per rank beside the measured one (issue 29).

For every model x plan x optimizer: plans (`apc plan --artifact`), trains on N CPU ranks with
`apc-train --profile --json` (apc's host caching allocator counts the tensor bytes: the measured
peak), and prints the plan's predicted peak (include/apc/plan/memory.h) beside the measured one,
per phase too, with the error; then the mean absolute percentage error per model and overall.

Then the device-memory plans of --device-models (default llama3_8b on 8x8, tokens [16, 2048], at
80, 40, 24 and 16 GiB): solve time, status, the predicted peak and the checkpointed layers.

Plans per model: the optimizer's under the default budget ("auto"), the optimizer's with room
("auto-1": --memory-budget 0,1), ddp, fsdp, and auto-1 with every repeated layer checkpointed
("ckpt": --checkpoint all). Figures only, no pass/fail; run by
scripts/bench_memory.sh, which builds first.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = ["llama_tiny.pt", "gpt2_tiny.pt", "mlp_stack.pt", "cnn_small.pt",
          "resnet_bottleneck.pt", "hf_llama_tiny.pt2", "hf_gpt2_tiny.pt2"]
PLANS = [("auto", []), ("auto-1", ["--memory-budget", "0,1"]), ("ddp", ["--strategy", "ddp"]),
         ("fsdp", ["--strategy", "fsdp"]),
         # Activation checkpointing of every repeated layer (a model without one says so).
         ("ckpt", ["--memory-budget", "0,1", "--checkpoint", "all"])]


def run(cmd, timeout=1800):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p


def mib(b):
    return b / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--samples", default=os.path.join(ROOT, "sample_models", "out"))
    ap.add_argument("--models", nargs="*", default=MODELS,
                    help="model files under --samples, or paths")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--optimizers", nargs="*", default=["adamw", "sgd"])
    ap.add_argument("--device-models", nargs="*", default=["llama3_8b.pt:8x8"],
                    help="MODEL:MESH planned with --device-memory 80, 40, 24 and 16 GiB")
    ap.add_argument("--device-input", default="tokens:i64[16,2048]",
                    help="the --input of the device-memory plans ('' for the model's own)")
    args = ap.parse_args()
    apc = os.path.join(args.build, "tools", "apc")
    train = os.path.join(args.build, "tools", "apc-train")
    tmp = tempfile.mkdtemp(prefix="apc-bench-memory-")
    print(f"{'model':<22} {'plan':<7} {'opt':<6} {'measured':>10} {'predicted':>10} {'error':>7}"
          f"   by phase measured / predicted (forward, loss, backward, optimizer), MiB")
    errors_all = []
    for m in args.models:
        path = m if os.path.sep in m else os.path.join(args.samples, m)
        name = os.path.basename(path)
        errors = []
        for plan_name, flags in PLANS:
            art = os.path.join(tmp, "art")
            try:
                run([apc, "plan", path, "--mesh", str(args.nproc), "--device", "cpu", "-q",
                     "-o", os.path.join(tmp, "p.json"), "--artifact", art] + flags)
            except RuntimeError as e:
                print(f"{name:<22} {plan_name:<7} plan failed: {str(e)[-160:]}")
                continue
            for opt in args.optimizers:
                cmd = [apc, "run", art, "--nproc", str(args.nproc), "--", train, art,
                       "--steps", str(args.steps), "--profile", "--json", "--threads", "1",
                       "--optimizer", "adamw" if opt == "adamw" else "sgd"]
                if opt == "momentum":
                    cmd += ["--momentum", "0.9"]
                try:
                    out = run(cmd).stdout
                except RuntimeError as e:
                    print(f"{name:<22} {plan_name:<7} {opt:<6} run failed: {str(e)[-160:]}")
                    continue
                j = [json.loads(line) for line in out.splitlines() if line.startswith("{")][-1]
                meas = j["peak_memory_bytes"]
                pred = j.get("predicted_peak_memory_bytes")
                if pred is None or meas <= 0:
                    print(f"{name:<22} {plan_name:<7} {opt:<6} {mib(meas):>9.2f}M (no prediction)")
                    continue
                err = (pred - meas) / meas * 100
                errors.append(abs(err))
                mp = j.get("peak_memory_by_phase_bytes", {})
                pp = j.get("predicted_peak_memory_by_phase_bytes", {})
                phases = " ".join(f"{mib(mp.get(k, 0)):.1f}/{mib(pp.get(k, 0)):.1f}"
                                  for k in ("forward", "loss", "backward", "optimizer"))
                print(f"{name:<22} {plan_name:<7} {opt:<6} {mib(meas):>9.2f}M {mib(pred):>9.2f}M "
                      f"{err:>+6.1f}%   {phases}", flush=True)
        if errors:
            errors_all += errors
            print(f"{name:<22} mean absolute error {sum(errors) / len(errors):.1f}% "
                  f"over {len(errors)} runs", flush=True)
    if errors_all:
        print(f"all models: mean absolute error {sum(errors_all) / len(errors_all):.1f}% over "
              f"{len(errors_all)} runs; within 10%: "
              f"{sum(e <= 10 for e in errors_all)}/{len(errors_all)}")

    print()
    print(f"{'model':<16} {'mesh':<6} {'device memory':<14} {'wall s':>8} {'status':<10} "
          f"{'predicted peak':>15}  note")
    for spec in args.device_models:
        model, mesh = spec.rsplit(":", 1)
        path = model if os.path.sep in model else os.path.join(args.samples, model)
        for mem in ("80GiB", "40GiB", "24GiB", "16GiB"):
            t0 = time.monotonic()
            extra = ["--input", args.device_input] if args.device_input else []
            p = subprocess.run([apc, "plan", path, "--mesh", mesh, "--device-memory", mem,
                                "--json", "-o", os.path.join(tmp, "d.json")] + extra,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wall = time.monotonic() - t0
            if p.returncode != 0:
                print(f"{os.path.basename(path):<16} {mesh:<6} {mem:<14} {wall:>8.2f} "
                      f"{'error':<10} {'-':>15}  {p.stderr.strip()[-200:]}")
                continue
            s = json.loads(p.stdout)
            plan = json.load(open(os.path.join(tmp, "d.json")))
            peak = plan["memory"]["adamw"]["peak_bytes"]
            ck = len(plan.get("checkpoint", []))
            print(f"{os.path.basename(path):<16} {mesh:<6} {mem:<14} {wall:>8.2f} "
                  f"{s['status']:<10} {peak / 2**30:>13.2f}Gi  checkpointed {ck}; "
                  f"{s.get('note', '')[:120]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
