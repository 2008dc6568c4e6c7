#!/usr/bin/env python3
"""bench_moe.py: mixture-of-experts figures (issue 34's goals): planning DeepSeek-V3 at full size,
and the planner's plan against replicated experts (ddp) and FSDP on CPU ranks.

Part 1, planning: `apc plan deepseek_v3.pt` (61 layers, 256 routed experts top-8, stub weights) at
--tokens on each --meshes entry, one process per case: wall time and peak resident memory (the
child's own, os.wait4), the solver's status, the predicted step, and how the plan cuts the routed
experts' weights (w1 [E, D, F] of the first mixture-of-experts layer: S(0) on a mesh dim is expert
parallelism) and whether the plan moves tokens by all-to-all.

Part 2, small models on CPU ranks: for each --small model, the optimizer's plan (tokens
batch-sharded, memory budget 0,1), the classic ddp (every rank holds every expert) and fsdp,
planned with a calibrated cluster profile (`apc calibrate`, or --cluster), lowered and trained with
`apc-train --profile --json` on --nproc ranks: predicted beside measured median step.

Run by scripts/bench_moe.sh (which builds first); figures only, no pass/fail.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_fidelity import run  # one command, its output captured, a failure raised in one line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "sample_models", "out")

# (name, model file, the token input at the benchmark's shape)
SMALL = {
    "deepseek_tiny": ("deepseek_tiny.pt", "tokens:i64[16,64]"),
    "moe_tiny": ("moe_tiny.pt", "x:f32[16,32,32]"),
    # Hugging Face MoE models we did not write (experts_implementation="batched_mm" exports), at
    # their export's shapes.
    "hf_mixtral_tiny": ("hf_mixtral_tiny.pt2", "input_ids:i64[8,32]"),
    "hf_qwen3_moe_tiny": ("hf_qwen3_moe_tiny.pt2", "input_ids:i64[8,32]"),
    # the same two in transformers' default grouped_mm experts (transformers::grouped_mm_fallback)
    "hf_mixtral_gmm_tiny": ("hf_mixtral_gmm_tiny.pt2", "input_ids:i64[8,32]"),
    "hf_qwen3_moe_gmm_tiny": ("hf_qwen3_moe_gmm_tiny.pt2", "input_ids:i64[8,32]"),
    "hf_deepseek_v3_gmm_tiny": ("hf_deepseek_v3_gmm_tiny.pt2", "input_ids:i64[8,32]"),
    # A Mixtral large enough for expert parallelism to pay on CPU ranks (hidden 256, 8 experts of
    # 1024, 2 layers, 50 MB of experts), exported here in the default grouped_mm experts (not a
    # sample: made on the fly with the venv's transformers, see export_mixtral_mid).
    "hf_mixtral_gmm_mid": (None, "input_ids:i64[8,128]"),
}

MIXTRAL_MID = """
import sys, torch, transformers
transformers.logging.set_verbosity_error()
cfg = transformers.MixtralConfig(vocab_size=1024, hidden_size=256, intermediate_size=1024,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa", num_local_experts=8,
    num_experts_per_tok=2)
torch.manual_seed(0)
m = transformers.MixtralForCausalLM(cfg).eval()
m.config._experts_implementation = "grouped_mm"  # what from_pretrained picks
class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False).logits
ids = torch.randint(0, 1024, (8, 128))
batch = torch.export.Dim("batch", min=1, max=1024)
ep = torch.export.export(Logits(m), (ids,), dynamic_shapes=({0: batch},))
torch.export.save(ep, sys.argv[1])
"""


def model_path(name, work):
    """The model file of a --small entry; hf_mixtral_gmm_mid is exported into `work` first."""
    file, _ = SMALL[name]
    if file is not None:
        return os.path.join(SAMPLES, file)
    out = os.path.join(work, name + ".pt2")
    if not os.path.exists(out):
        run([sys.executable, "-c", MIXTRAL_MID, out])
    return out


def run_measured(cmd):
    """Runs cmd; returns (exit code, stdout, stderr, wall seconds, peak RSS in bytes)."""
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.time() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read(), wall, usage.ru_maxrss * 1024


def placement_of(plan, name):
    for q in plan["parameters"]:
        if q["name"] == name:
            return q.get("placement")
    return None


def all_to_all_edges(plan):
    """Edges whose producer's output and consumer's input placements differ by S(i) -> S(j) on
    some mesh dim: the redistributions lowering runs as all-to-all."""
    out_of = {n["index"]: n.get("output_placements") for n in plan["nodes"]}
    count = 0
    for n in plan["nodes"]:
        for e in n.get("in_edges", []):
            src = out_of.get(e["from"])
            dst = n.get("input_placements", [])
            if not src or e["input"] >= len(dst) or dst[e["input"]] is None:
                continue
            a, b = src[0] if isinstance(src[0], list) else src, dst[e["input"]]
            if any(x.startswith("S(") and y.startswith("S(") and x != y for x, y in zip(a, b)):
                count += 1
    return count


def part_planning(args, apc, work):
    model = os.path.join(SAMPLES, "deepseek_v3.pt")
    if not os.path.exists(model):
        print(f"# {model} missing: .venv/bin/python3 sample_models/generate.py --only deepseek_v3")
        return
    print(f"# DeepSeek-V3 planning at {args.tokens} ({apc} plan {model} --mesh M --input "
          f"'{args.tokens}' --device {args.device} --memory-budget 0, --time-limit {args.time_limit}; "
          f"AutoParallel's parameter budget: the model at this batch does not fit {args.device}'s memory)")
    print(f"{'mesh':<8} {'wall s':>7} {'peak GiB':>9} {'status':<12} {'step ms':>10} "
          f"{'experts w1':<16} {'a2a edges':>9}")
    for mesh in args.meshes.split(","):
        out = os.path.join(work, f"deepseek_v3_{mesh}.plan.json")
        code, _, err, wall, rss = run_measured(
            [apc, "plan", model, "--mesh", mesh, "--input", args.tokens, "--device", args.device,
             "--memory-budget", "0,", "--time-limit", str(args.time_limit), "--quiet", "-o", out])
        if code != 0:
            print(f"{mesh:<8} failed: {err.strip().splitlines()[-1] if err.strip() else code}")
            continue
        with open(out) as f:
            plan = json.load(f)
        w1 = placement_of(plan, "layers.3.feed_forward.w1")
        print(f"{mesh:<8} {wall:7.1f} {rss / 2**30:9.2f} {plan['solver']['status']:<12} "
              f"{plan['totals']['total_us'] / 1000:10.1f} {''.join(w1 or ['?']):<16} "
              f"{all_to_all_edges(plan):9d}", flush=True)


def part_small(args, apc, train, work):
    cluster = args.cluster
    if not cluster:
        cluster = os.path.join(work, "cluster.json")
        t0 = time.time()
        run([apc, "calibrate", "--nproc", str(args.nproc), "--threads", "1", "-o", cluster])
        print(f"# calibrated {args.nproc} ranks in {time.time() - t0:.1f} s "
              f"({apc} calibrate --nproc {args.nproc} --threads 1 -o {cluster})")
    mesh = str(args.nproc)
    print(f"{'model':<15} {'plan':<6} {'predicted ms':>13} {'measured ms':>12}  experts")
    for name in filter(None, args.small.split(",")):
        _, shape = SMALL[name]
        model = model_path(name, work)
        in_name = shape.split(":")[0]
        plans = [("auto", ["--memory-budget", "0,1", "--in-shardings",
                           json.dumps({in_name: ["S(0)"]})]),
                 ("ddp", ["--strategy", "ddp"]), ("fsdp", ["--strategy", "fsdp"])]
        for plan_name, flags in plans:
            art = os.path.join(work, f"{name}_{plan_name}")
            p = run([apc, "plan", model, "--mesh", mesh, "--input", shape, "--cluster", cluster,
                     "--quiet", "-o", art + ".plan.json", "--artifact", art] + flags, check=False)
            if p.returncode != 0:
                print(f"{name:<15} {plan_name:<6} not planned: {p.stderr.strip()[-200:]}")
                continue
            with open(art + ".plan.json") as f:
                plan = json.load(f)
            experts = [q for q in plan["parameters"]
                       if q["name"].endswith((".w1", ".w_up", ".experts.gate_up_proj"))]
            cut = "".join(experts[0].get("placement", ["?"])) if experts else "-"
            p = run([apc, "run", art, "--nproc", mesh, "--timeout", "1200", "--", train, art,
                     "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", "1",
                     "--profile", "--json"], check=False)
            if p.returncode != 0:
                print(f"{name:<15} {plan_name:<6} run failed: {p.stderr.strip()[-300:]}")
                continue
            prof = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"{name:<15} {plan_name:<6} {prof['predicted_step_ms']:13.2f} "
                  f"{prof['measured_step_ms']:12.2f}  {cut}"
                  f"{' (' + str(all_to_all_edges(plan)) + ' all-to-all)' if plan_name == 'auto' else ''}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--meshes", default="8x8,8x8x8", help="meshes of the planning part")
    ap.add_argument("--tokens", default="tokens:i64[64,4096]")
    ap.add_argument("--device", default="h100")
    ap.add_argument("--time-limit", type=float, default=300)
    ap.add_argument("--small", default="deepseek_tiny,moe_tiny",
                    help="small models of the CPU part ('' skips it)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cluster", default="", help="a cluster profile to reuse (else calibrate)")
    ap.add_argument("--skip-planning", action="store_true")
    args = ap.parse_args()
    apc = os.path.join(args.build, "tools", "apc")
    train = os.path.join(args.build, "tools", "apc-train")
    work = tempfile.mkdtemp(prefix="apc-moe-")
    if not args.skip_planning:
        part_planning(args, apc, work)
    unknown = [n for n in filter(None, args.small.split(",")) if n not in SMALL]
    if unknown:
        ap.error(f"--small: unknown model(s) {', '.join(unknown)} (known: {', '.join(SMALL)})")
    if args.small:
        part_small(args, apc, train, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
