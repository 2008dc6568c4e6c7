#!/usr/bin/env python3
"""bench_fidelity.py: how well apc's cost model predicts measured training steps.

Calibrates the ranks once (`apc calibrate`, with every benchmarked model's op nodes: --model), then
for every model x plan: plans with the cluster
profile (`apc plan --cluster`), lowers, trains on N CPU ranks with `apc-train --profile --json`, and
prints predicted beside measured step time; per model the mean absolute percentage error (MAPE) and
Kendall's tau between the predicted and the measured order of the plans, and whether the
optimizer's plan was measured fastest (or within 5% of the fastest). The order is over distinct
plans: cases that planned the same placements (the optimizer's plan is often ddp's) count once, at
the median of all their rounds, where MAPE counts every case.

Plans per model: the optimizer's (memory budget 0,1: the fastest plan that fits, as a user with
enough memory wants; "auto"), the optimizer's under the default budget of 1/world of the parameters
("auto-budget"), the classic ddp, fsdp and tp, and --random random feasible plans: a few parameters
pinned to random placements, the rest optimized around them.

Models: the samples of MODELS (--models picks some), and any model file given by --model NAME=PATH,
e.g. torchvision's, which scripts/torchvision_models.sh exports to sample_models/out/torchvision/.

Run by scripts/bench_fidelity.sh (which builds first); figures only, no pass/fail.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, model file under sample_models/out, extra plan flags)
MODELS = [
    ("llama_small", "llama_small.pt2", []),
    ("gpt2_small", "gpt2_small.pt2", []),
    ("hf_llama_tiny", "hf_llama_tiny.pt2", []),
    ("hf_gpt2_tiny", "hf_gpt2_tiny.pt2", []),
    ("cnn_small", "cnn_small.pt2", []),
    ("resnet_bottleneck", "resnet_bottleneck.pt2", []),
    ("mlp_stack", "mlp_stack.pt2", []),
]


def run(cmd, timeout=1800, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p


def kendall_tau(a, b):
    """Kendall's tau-b of two equally long lists."""
    n = len(a)
    conc = disc = ties_a = ties_b = 0
    for i in range(n):
        for j in range(i + 1, n):
            da = (a[i] > a[j]) - (a[i] < a[j])
            db = (b[i] > b[j]) - (b[i] < b[j])
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif da == db:
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + ties_a) * (conc + disc + ties_b))
    return (conc - disc) / denom if denom > 0 else float("nan")


def plan_identity(path):
    """What makes two planned cases one plan: every node's strategy and placements, and the
    checkpointed modules (not the spec or budget that led there)."""
    with open(path) as f:
        plan = json.load(f)
    nodes = tuple((n.get("strategy"), tuple(n.get("output_placements", [])),
                   tuple(n.get("input_placements", []))) for n in plan["nodes"])
    return json.dumps([nodes, plan.get("checkpoint")], default=str)


def parameters(apc, model):
    out = run([apc, "inspect", model, "--json"]).stdout
    info = json.loads(out)
    params = []
    for n in info["nodes"]:
        if n["kind"] == "parameter" and n["outputs"]:
            params.append((n["name"], n["outputs"][0]["shape"]))
    return params


def random_pins(params, ndim, rng, count=3):
    """A few parameters pinned to random placements (per mesh dim: R or a shard of a dim)."""
    pins = []
    for name, shape in rng.sample(params, min(count, len(params))):
        placements = []
        for _ in range(ndim):
            options = ["R"] + [f"S({d})" for d, size in enumerate(shape) if size >= 2]
            placements.append(rng.choice(options))
        pins.append({"node": name, "placements": placements})
    return pins


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds over each model's plans (interleaved); the median is kept")
    ap.add_argument("--min-seconds", type=float, default=2.0,
                    help="measure at least this many seconds of (predicted) steps per case")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--random", type=int, default=3, help="random feasible plans per model")
    ap.add_argument("--models", default="", help="comma-separated subset of the model names")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                    help="also this model file (.pt2 or TorchScript), e.g. one a user brings or "
                         "scripts/torchvision_models.sh exports; repeatable; run even when "
                         "--models names others")
    ap.add_argument("--cluster", default="", help="a cluster profile to reuse (else calibrate)")
    ap.add_argument("--calibrate-per-model", action="store_true",
                    help="calibrate again before each model (a shared machine drifts by tens of "
                         "percent over the half hour a whole run takes)")
    ap.add_argument("--node-times", action=argparse.BooleanOptionalAction, default=True,
                    help="calibrate with every benchmarked model's op nodes (apc calibrate "
                         "--model, the default), which the plans then price at their measured "
                         "times; --no-node-times prices every node by the curves")
    ap.add_argument("--json", default="", help="also write every case here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    apc = os.path.join(args.build, "tools", "apc")
    train = os.path.join(args.build, "tools", "apc-train")
    work = tempfile.mkdtemp(prefix="apc-fidelity-")
    rng = random.Random(args.seed)

    def calibrate(path, model_files):
        t0 = time.time()
        cmd = [apc, "calibrate", "--nproc", str(args.nproc), "--threads", str(args.threads),
               "-o", path]
        if args.node_times:
            for m in model_files:
                cmd += ["--model", m]
        p = run(cmd)
        print(f"# calibrated {args.nproc} ranks in {time.time() - t0:.1f} s ({' '.join(cmd)})")
        print("\n".join("#   " + line for line in p.stdout.strip().splitlines()), flush=True)

    wanted = set(filter(None, args.models.split(",")))
    models = [(name, os.path.join(ROOT, "sample_models", "out", file), extra)
              for name, file, extra in MODELS if not wanted or name in wanted]
    if args.model and not wanted:
        models = []  # only the models given by path
    for given in args.model:
        name, sep, path = given.partition("=")
        if not sep or not name or not path:
            ap.error(f"--model {given}: expected NAME=PATH")
        if not os.path.exists(path):
            ap.error(f"--model {given}: {path} does not exist")
        models.append((name, os.path.abspath(path), []))
    cluster = args.cluster
    if not cluster:
        cluster = os.path.join(work, "cluster.json")
        if not args.calibrate_per_model:
            calibrate(cluster, [m for _, m, _ in models])
    mesh = str(args.nproc)
    cases = []
    summary = []
    print(f"{'model':<18} {'plan':<12} {'predicted ms':>13} {'measured ms':>12} {'error':>8}"
          f"  {'comm pred/meas ms':>19} {'hidden pred/meas ms':>20}")
    for name, model, extra in models:
        if args.calibrate_per_model and not args.cluster:
            calibrate(cluster, [model])
        plans = [("auto", ["--memory-budget", "0,1"]), ("auto-budget", []),
                 ("ddp", ["--strategy", "ddp"]), ("fsdp", ["--strategy", "fsdp"]),
                 ("tp", ["--strategy", "tp"])]
        params = parameters(apc, model)
        for r in range(args.random):
            plans.append((f"random{r}", None))
        planned = []  # (plan name, artifact, steps, warm-up)
        identity = {}  # plan name -> what makes two cases the same plan (plan_identity)
        for plan_name, flags in plans:
            art = os.path.join(work, f"{name}_{plan_name}")
            cmd = [apc, "plan", model, "--mesh", mesh, "--cluster", cluster, "--quiet",
                   "-o", art + ".plan.json", "--artifact", art] + extra
            if flags is None:  # a random feasible plan: up to 10 tries
                ok = False
                for _ in range(10):
                    spec = {"mesh": {"shape": [args.nproc]},
                            "pins": random_pins(params, 1, rng)}
                    spec_path = art + ".spec.json"
                    with open(spec_path, "w") as f:
                        json.dump(spec, f)
                    p = run(cmd + ["--spec", spec_path, "--memory-budget", "0,1"], check=False)
                    if p.returncode == 0:
                        ok = True
                        break
                if not ok:
                    print(f"{name:<18} {plan_name:<12} no feasible random plan in 10 tries")
                    continue
            else:
                p = run(cmd + flags, check=False)
                if p.returncode != 0:
                    print(f"{name:<18} {plan_name:<12} not planned: "
                          f"{p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
                    continue
            # Small models get more steps (the median of a few steps of a few ms is noise): as many
            # as --min-seconds of predicted steps take, at most 300, warm-up a fifth of them.
            with open(art + ".plan.json") as f:
                predicted_ms = json.load(f)["totals"]["total_us"] / 1000
            steps = max(args.steps, min(300, int(args.min_seconds * 1000 / max(predicted_ms, 1e-3))))
            warmup = max(args.warmup, min(20, steps // 5))
            planned.append((plan_name, art, steps, warmup))
            identity[plan_name] = plan_identity(art + ".plan.json")
        # --repeats rounds over the model's plans, interleaved (a drift of the machine then moves
        # every plan alike); each case's measured step is the median of its rounds' medians.
        profiles = {plan_name: [] for plan_name, _, _, _ in planned}
        for _ in range(args.repeats):
            for plan_name, art, steps, warmup in planned:
                p = run([apc, "run", art, "--nproc", str(args.nproc), "--timeout", "1200", "--",
                         train, art, "--steps", str(steps), "--warmup", str(warmup), "--threads",
                         str(args.threads), "--profile", "--json"], check=False)
                if p.returncode != 0:
                    print(f"{name:<18} {plan_name:<12} run failed: {p.stderr.strip()[-300:]}")
                    continue
                profiles[plan_name].append(json.loads(p.stdout.strip().splitlines()[-1]))
        rows = []
        for plan_name, _, _, _ in planned:
            runs = sorted(profiles[plan_name], key=lambda q: q["measured_step_ms"])
            if not runs:
                continue
            prof = runs[(len(runs) - 1) // 2]  # the lower median
            pred, meas = prof["predicted_step_ms"], prof["measured_step_ms"]
            comm_meas = prof["measured_ms"]["forward_comm"] + prof["measured_ms"]["backward_comm"]
            err = (pred - meas) / meas * 100
            spread = (f"  rounds {min(q['measured_step_ms'] for q in runs):.1f}-"
                      f"{max(q['measured_step_ms'] for q in runs):.1f}" if len(runs) > 1 else "")
            # Communication behind compute: the runtime's schedule replayed on the plan
            # (apc/lower/schedule.h) beside the profile's in-flight time less the exposed time.
            hidden_pred = prof["predicted_ms"].get("hidden_comm", 0.0)
            hidden_meas = prof.get("comm_overlap_ms", {}).get("hidden", 0.0)
            print(f"{name:<18} {plan_name:<12} {pred:13.1f} {meas:12.1f} {err:7.1f}%"
                  f"  {prof['predicted_ms']['comm']:9.1f}/{comm_meas:<9.1f}"
                  f" {hidden_pred:9.2f}/{hidden_meas:<9.2f}{spread}", flush=True)
            row = {"model": name, "plan": plan_name, "predicted_ms": pred, "measured_ms": meas,
                   "error_pct": err, "rounds_ms": [q["measured_step_ms"] for q in runs],
                   "identity": identity[plan_name], "profile": prof}
            rows.append(row)
            cases.append(row)
        if len(rows) >= 2:
            mape = sum(abs(r["error_pct"]) for r in rows) / len(rows)
            # The order is the plans': cases that are one plan (the optimizer's plan is often ddp's)
            # count once, at the median of all their rounds, so that two runs of one plan are not
            # ranked against each other by the machine's noise.
            plans_of = {}
            for r in rows:
                plans_of.setdefault(r["identity"], []).append(r)
            distinct = [(same[0]["predicted_ms"],
                         statistics.median([t for r in same for t in r["rounds_ms"]]),
                         [r["plan"] for r in same]) for same in plans_of.values()]
            tau = (kendall_tau([d[0] for d in distinct], [d[1] for d in distinct])
                   if len(distinct) >= 2 else float("nan"))
            fastest = min(d[1] for d in distinct)
            auto = [d for d in distinct if "auto" in d[2]]
            auto_gap = (auto[0][1] / fastest - 1) * 100 if auto else float("nan")
            summary.append((name, len(rows), len(distinct), mape, tau, auto_gap))
    print()
    print(f"{'model':<18} {'cases':>5} {'plans':>5} {'MAPE':>7} {'tau':>6} {'auto vs fastest':>16}")
    for name, n, distinct, mape, tau, gap in summary:
        print(f"{name:<18} {n:5d} {distinct:5d} {mape:6.1f}% {tau:6.2f} {gap:+15.1f}%")
    if cases:
        all_mape = sum(abs(c["error_pct"]) for c in cases) / len(cases)
        print(f"{'all':<18} {len(cases):5d} {'':>5} {all_mape:6.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": cases, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
