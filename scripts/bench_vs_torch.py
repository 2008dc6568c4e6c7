#!/usr/bin/env python3
"""bench_vs_torch.py: apc's plans beside what a user would run instead, PyTorch's DDP and FSDP2.

Per model (sample models with real weights: ours and a Hugging Face decoder), on the same CPU ranks
(Gloo, one intra-op thread each): torch DDP and torch FSDP2 (scripts/bench_vs_torch_worker.py under
torchrun), and apc's ddp, fsdp and optimizer's plans (apc plan, then apc-train --profile --json).
Prints per case the median step and the peak resident set per rank, and the ratios apc/torch.

A step is forward + loss + backward + optimizer (SGD) for both. apc-train computes the loss on the
gathered full output on every rank (its forward outputs are gathered first); torch's DDP and FSDP2
on the local batch: apc's step is shown both ways (program = forward + backward + optimizer, and
with the trainer's gather and loss). Rounds are interleaved (--repeats), the median kept.
--overlap on|off|both runs apc's plans with the gradient buckets overlapped with backward (on, the
default), blocking at the end of backward (off: apc-train --no-overlap, labelled "-ovl"), or both;
the "hidden" column is the share of apc's collective time in flight that ran behind compute
(apc-train's comm_overlap_ms.hidden_fraction). --plans picks apc's plans (ddp, fsdp, auto).
--checkpoint checkpoints every repeated layer on both sides (apc plan --checkpoint all; torch's
apply_activation_checkpointing on every ModuleList element).

--device cuda runs every case on CUDA ranks (one GPU per rank, LOCAL_RANK; NCCL): apc calibrate
and apc-train with --device cuda (a CUDA build: --build build-cuda, scripts/build_cuda.sh), torch's
DDP and FSDP2 on the same GPUs, and the peak column is each rank's CUDA caching allocator peak
(allocated bytes over the measured steps) instead of the resident set. Run it where GPUs are at
hand; never in CI.

Run by scripts/bench_vs_torch.sh (which builds first); figures only, no pass/fail.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["mlp_stack", "cnn_small", "hf_llama_tiny", "gpt2_tiny"]


def run(cmd, timeout=1800):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    return p


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cluster", default="", help="a cluster profile for apc plan (else calibrate)")
    ap.add_argument("--json", default="", help="also write every case here")
    ap.add_argument("--overlap", choices=["on", "off", "both"], default="on",
                    help="apc's gradient buckets overlapped with backward (on), not (off), or both")
    ap.add_argument("--plans", default="ddp,fsdp,auto", help="apc's plans to run")
    ap.add_argument("--checkpoint", action="store_true",
                    help="every repeated layer checkpointed on both sides: apc plan --checkpoint "
                         "all, torch's apply_activation_checkpointing on every ModuleList element")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="CPU ranks (Gloo) or one CUDA GPU per rank (NCCL)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    device_flags = ["--device", args.device]
    # The peak compared: the resident set on CPU, the CUDA caching allocator's peak on GPUs.
    peak_key = "peak_memory_bytes" if cuda else "peak_rss_bytes"
    peak_label = "peak GPU MiB" if cuda else "peak RSS MiB"
    apc = os.path.join(args.build, "tools", "apc")
    train = os.path.join(args.build, "tools", "apc-train")
    # torch's side runs under the Python that runs this script (.venv's on CPU; a CUDA torch's,
    # such as .venv-cuda's, for --device cuda).
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    work = tempfile.mkdtemp(prefix="apc-vs-torch-")
    cluster = args.cluster
    if not cluster:
        cluster = os.path.join(work, "cluster.json")
        run([apc, "calibrate", "--nproc", str(args.nproc), "--threads", str(args.threads),
             "-o", cluster] + device_flags)
    print(f"# {args.nproc} {'CUDA' if cuda else 'CPU'} ranks, {args.threads} thread(s) each, "
          f"{'every repeated layer checkpointed, ' if args.checkpoint else ''}"
          f"{args.steps} steps after "
          f"{args.warmup} warm-up, median of {args.repeats} interleaved rounds; apc plans priced "
          f"with {cluster}")
    print(f"{'model':<15} {'run':<16} {'step ms':>9} {'with loss':>10} {peak_label:>13}"
          f"  {'vs torch ddp':>12} {'vs torch fsdp2':>14} {'hidden':>7}")
    plans = [p for p in args.plans.split(",") if p]
    for p in plans:
        if p not in ("ddp", "fsdp", "auto"):
            ap.error(f"--plans: unknown plan '{p}' (ddp, fsdp or auto)")
    overlaps = {"on": [True], "off": [False], "both": [True, False]}[args.overlap]
    cases = []
    for name in filter(None, args.models.split(",")):
        model = os.path.join(ROOT, "sample_models", "out", name + ".pt2")
        runs = {}
        apc_plans = {"ddp": ["--strategy", "ddp"], "fsdp": ["--strategy", "fsdp"],
                     "auto": ["--memory-budget", "0,1"]}
        for plan in plans:
            art = os.path.join(work, f"{name}_{plan}")
            run([apc, "plan", model, "--mesh", str(args.nproc), "--cluster", cluster, "--quiet",
                 "-o", art + ".plan.json", "--artifact", art] + apc_plans[plan] +
                (["--checkpoint", "all"] if args.checkpoint else []))
            for overlap in overlaps:
                label = f"apc {plan}" + ("" if overlap else " -ovl")
                runs[label] = ("apc", (art, overlap))
        runs["torch ddp"] = ("torch", "ddp")
        runs["torch fsdp2"] = ("torch", "fsdp2")
        results = {label: [] for label in runs}
        for _ in range(args.repeats):
            for label, (kind, what) in runs.items():
                try:
                    if kind == "apc":
                        art, overlap = what
                        p = run([apc, "run", art, "--nproc", str(args.nproc), "--", train, art,
                                 "--steps", str(args.steps), "--warmup", str(args.warmup),
                                 "--threads", str(args.threads), "--profile", "--json"] +
                                device_flags + ([] if overlap else ["--no-overlap"]))
                        j = last_json(p.stdout)
                        ovl = j.get("comm_overlap_ms", {})
                        results[label].append({
                            "step_ms": j["measured_step_ms"],
                            "with_loss_ms": j["measured_step_ms"] +
                            j["measured_ms"]["loss_outside_program"],
                            "peak_bytes": j[peak_key],
                            "peak_rss_bytes": j["peak_rss_bytes"],
                            "predicted_step_ms": j["predicted_step_ms"],
                            "comm_in_flight_ms": ovl.get("in_flight", 0.0),
                            "comm_exposed_ms": ovl.get("exposed", 0.0),
                            "hidden_fraction": ovl.get("hidden_fraction", 0.0)})
                    else:
                        p = run([torchrun, "--standalone", "--nproc-per-node", str(args.nproc),
                                 os.path.join(ROOT, "scripts", "bench_vs_torch_worker.py"),
                                 "--model", name, "--mode", what, "--steps", str(args.steps),
                                 "--warmup", str(args.warmup), "--threads", str(args.threads)] +
                                device_flags + (["--checkpoint"] if args.checkpoint else []))
                        j = last_json(p.stdout)
                        results[label].append({"step_ms": j["measured_step_ms"],
                                               "with_loss_ms": j["measured_step_ms"],
                                               "peak_bytes": j[peak_key],
                                               "peak_rss_bytes": j["peak_rss_bytes"]})
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                    print(f"{name:<15} {label:<16} failed: {str(e)[-300:]}", flush=True)
        med = {}
        for label, rs in results.items():
            if rs:
                med[label] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for label, m in med.items():
            def ratio(base):
                return (f"{m['with_loss_ms'] / med[base]['with_loss_ms']:.2f}x"
                        if base in med and label.startswith("apc") else "")
            hidden = f"{m['hidden_fraction'] * 100:6.0f}%" if "hidden_fraction" in m else ""
            print(f"{name:<15} {label:<16} {m['step_ms']:9.1f} {m['with_loss_ms']:10.1f} "
                  f"{m['peak_bytes'] / 2**20:13.1f}  {ratio('torch ddp'):>12} "
                  f"{ratio('torch fsdp2'):>14} {hidden:>7}", flush=True)
            cases.append({"model": name, "run": label, **m,
                          "rounds": results[label]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cases, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
