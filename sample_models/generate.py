#!/usr/bin/python3
"""Write the sample TorchScript models (and out/manifest.json).

    /usr/bin/python3 sample_models/generate.py [--out DIR] [--only NAME,...] [--force] [--list]

Needs the system interpreter (Debian python3-torch, torch 1.13). A sample is
skipped when its .pt file is newer than models.py and generate.py and the
manifest already describes it; --force rewrites. One line is printed per
file written. Everything is deterministic (fixed seeds, fixed example inputs).
"""

import argparse
import dataclasses
import json
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import models as M  # noqa: E402

MANIFEST_VERSION = 1

DTYPE_SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "bool",
}
SHORT_DTYPE = {v: k for k, v in DTYPE_SHORT.items()}


@dataclasses.dataclass
class InputSpec:
    name: str
    dtype: str
    shape: list
    # integer inputs are drawn from [0, high); float inputs from N(0, 1)
    high: int = 0

    def make(self, shape=None, seed=1234):
        g = torch.Generator().manual_seed(seed)
        shape = list(self.shape if shape is None else shape)
        dt = SHORT_DTYPE[self.dtype]
        if dt in (torch.int64, torch.int32):
            return torch.randint(0, self.high, shape, generator=g, dtype=dt)
        if dt == torch.bool:
            return torch.randint(0, 2, shape, generator=g).bool()
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dt)

    def to_json(self):
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.high:
            d["range"] = [0, self.high]
        return d


@dataclasses.dataclass
class Sample:
    name: str
    kind: str  # "traced" | "scripted"
    description: str
    build: object  # () -> nn.Module (eval mode)
    config: object
    inputs: list  # [InputSpec]
    output_shape: list
    output_dtype: str = "f32"
    output_desc: str = ""
    # shapes of the (cheap) example inputs used for tracing; None = default inputs
    trace_shapes: list = None
    stub_weights: bool = False  # zero-stride (non-materialized) parameters
    expected_params: int = None
    # False for error-case samples that the importer must reject (data-dependent control flow)
    importable: bool = True

    @property
    def file(self):
        return self.name + ".pt"


# ---------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return fn().eval()

    return build


def _stub(cls, cfg):
    # built on the meta device: no weight memory is ever allocated
    return lambda: M.make_stub_parameters(cls(cfg, device="meta")).eval()


def _ids(name, shape, vocab):
    return InputSpec(name, "i64", shape, high=vocab)


def sample_table():
    S = []
    tb = M.TOY_BLOCK
    S.append(Sample(
        "toy_block", "traced",
        "down(relu(up(x))), up=Linear(1024,4096,bias=False), down=Linear(4096,1024,bias=False)",
        _seeded(lambda: M.ToyBlock(tb)), tb,
        [InputSpec("x", "f32", [8, 128, tb.d_model])], [8, 128, tb.d_model],
        output_desc="tensor f32 [8,128,1024]",
        trace_shapes=[[2, 4, tb.d_model]]))
    ms = M.MLP_STACK
    S.append(Sample(
        "mlp_stack", "traced",
        "4 x (x = x + down(relu(up(ln(x))))), d_model 128, d_hidden 512, no linear biases",
        _seeded(lambda: M.MlpStack(ms)), ms,
        [InputSpec("x", "f32", [8, 64, ms.d_model])], [8, 64, ms.d_model],
        output_desc="tensor f32 [8,64,128]",
        trace_shapes=[[2, 4, ms.d_model]]))

    for size, cfg, T, stub in (("tiny", M.GPT2_TINY, 64, False), ("small", M.GPT2_SMALL, 128, True)):
        V = cfg.vocab_size
        build = _stub(M.GPT2, cfg) if stub else _seeded(lambda cfg=cfg: M.GPT2(cfg))
        build_loss = _stub(M.GPT2WithLoss, cfg) if stub else _seeded(lambda cfg=cfg: M.GPT2WithLoss(cfg))
        what = (f"GPT-2 {size}: {cfg.n_layer} layers, n_embd {cfg.n_embd}, {cfg.n_head} heads, "
                f"block_size {cfg.block_size}, vocab {V}, lm_head tied to transformer.wte")
        if stub:
            what += "; zero-stride stub weights"
        S.append(Sample(
            f"gpt2_{size}", "traced", what, build, cfg,
            [_ids("idx", [8, T], V)], [8, T, V],
            output_desc=f"tensor f32 [8,{T},{V}] logits",
            trace_shapes=[[1, 2] if stub else [2, 8]], stub_weights=stub))
        S.append(Sample(
            f"gpt2_{size}_loss", "traced", what + "; forward(idx, targets) -> mean cross-entropy",
            build_loss, cfg,
            [_ids("idx", [8, T], V), _ids("targets", [8, T], V)], [],
            output_desc="tensor f32 [] (scalar loss)",
            trace_shapes=[[1, 2] if stub else [2, 8]] * 2, stub_weights=stub))
        if not stub:
            S.append(Sample(
                f"gpt2_{size}_scripted", "scripted", what + "; torch.jit.script", build, cfg,
                [_ids("idx", [8, T], V)], [8, T, V],
                output_desc=f"tensor f32 [8,{T},{V}] logits"))

    def llama_desc(name, cfg, stub):
        d = (f"{name}: {cfg.n_layers} layers, dim {cfg.dim}, {cfg.n_heads} heads, "
             f"{cfg.n_kv_heads} kv heads, ffn {cfg.ffn_dim}, vocab {cfg.vocab_size}, "
             f"rope theta {cfg.rope_theta:g}, rope tables for {cfg.max_seq_len} positions, untied output")
        return d + ("; zero-stride stub weights" if stub else "")

    for name, cfg, stub, kinds, expected in (
        ("llama_tiny", M.LLAMA_TINY, False, ("traced", "scripted"), None),
        ("llama_small", M.LLAMA_SMALL, True, ("traced",), None),
        ("llama_small_4l", M.LLAMA_SMALL_4L, True, ("traced",), None),
        ("llama3_8b", M.LLAMA3_8B, True, ("scripted",), M.LLAMA3_8B_PARAMS),
    ):
        V = cfg.vocab_size
        build = _stub(M.Llama, cfg) if stub else _seeded(lambda cfg=cfg: M.Llama(cfg))
        for i, kind in enumerate(kinds):
            S.append(Sample(
                name if i == 0 else f"{name}_{kind}", kind,
                llama_desc(name, cfg, stub) + ("; torch.jit.script" if kind == "scripted" else ""),
                build, cfg, [_ids("tokens", [8, 128], V)], [8, 128, V],
                output_desc=f"tensor f32 [8,128,{V}] logits",
                trace_shapes=([[1, 2] if stub else [2, 8]]) if kind == "traced" else None,
                stub_weights=stub, expected_params=expected))

    cc = M.CNN_SMALL
    S.append(Sample(
        "cnn_small", "traced",
        "conv3x3(3->16)-BN-ReLU-maxpool2, conv3x3(16->32)-BN-ReLU-maxpool2, conv3x3(32->64,bias)-BN-ReLU, "
        "adaptive avgpool 1x1, flatten, Linear(64,10); BN in eval mode",
        _seeded(lambda: M.CnnSmall(cc)), cc,
        [InputSpec("x", "f32", [8, 3, 32, 32])], [8, cc.num_classes],
        output_desc="tensor f32 [8,10] class logits",
        trace_shapes=[[2, 3, 32, 32]]))

    S.append(Sample(
        "multi_output", "scripted",
        "proj=Linear(32,32), head=Linear(32,10); forward returns (relu(h), {'logits': head(h), 'hidden': h})",
        _seeded(lambda: M.MultiOutput()), {"d_model": 32, "n_classes": 10},
        [InputSpec("x", "f32", [4, 32])], [4, 32],
        output_desc="tuple (f32 [4,32], dict {logits: f32 [4,10], hidden: f32 [4,32]})"))
    S.append(Sample(
        "control_flow", "scripted",
        "lin=Linear(16,16); branches on bool(h.sum() > 0): data-dependent control flow (import error case)",
        _seeded(lambda: M.DataDependentBranch()), {"d_model": 16},
        [InputSpec("x", "f32", [4, 16])], [4, 16],
        output_desc="tensor f32 [4,16]", importable=False))
    return S


# ---------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------


def graph_ops(script_module):
    g = script_module.forward.graph.copy()
    torch._C._jit_pass_inline(g)
    return sorted({n.kind() for n in g.nodes()})


def _tensor_list(named):
    return [{"name": n, "shape": list(t.shape), "dtype": DTYPE_SHORT.get(t.dtype, str(t.dtype))}
            for n, t in named]


def tied_parameters(model):
    """[[alias, canonical], ...] for parameters reachable under several names.

    named_parameters() in Python reports each tensor once (canonical name =
    first occurrence); libtorch's script::Module::named_parameters() in C++
    reports every alias, so C++ consumers need this to de-duplicate.
    """
    first = {}
    tied = []
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is None:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            if id(p) in first:
                tied.append([full, first[id(p)]])
            else:
                first[id(p)] = full
    return tied


def _config_json(cfg):
    if isinstance(cfg, dict):
        return dict(cfg)
    d = dataclasses.asdict(cfg)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def build_script_module(s: Sample):
    model = s.build()
    if s.kind == "scripted":
        return model, torch.jit.script(model)
    shapes = s.trace_shapes or [i.shape for i in s.inputs]
    example = tuple(spec.make(shape) for spec, shape in zip(s.inputs, shapes))
    params = list(model.parameters())  # deduplicated (tied weights once)
    stubs = None
    if s.stub_weights:
        # Running a forward on zero-stride weights takes the slow non-BLAS path,
        # so trace with real (zero, lazily allocated) tensors swapped in and put
        # the stubs back afterwards; the traced module shares the Parameter objects.
        stubs = [p.data for p in params]
        for p in params:
            p.data = torch.zeros(p.shape, dtype=p.dtype)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", torch.jit.TracerWarning)
            traced = torch.jit.trace(model, example, check_trace=False)
    finally:
        if stubs is not None:
            for p, st in zip(params, stubs):
                p.data = st
    return model, traced


def generate_one(s: Sample, out_dir):
    t0 = time.time()
    model, sm = build_script_module(s)
    named_params = list(model.named_parameters())
    named_buffers = list(model.named_buffers())
    tied = tied_parameters(model)
    nparams = sum(p.numel() for _, p in named_params)
    if s.expected_params is not None:
        assert nparams == s.expected_params, (s.name, nparams, s.expected_params)
    if s.stub_weights:
        for n, p in named_params:
            assert p.storage().size() == 1, (s.name, n)

    path = os.path.join(out_dir, s.file)
    tmp = path + ".tmp"
    # The forward's input shapes travel inside the archive: apc's importer reads them as defaults.
    sm.save(tmp, _extra_files={"apc_inputs.json": json.dumps({"inputs": [i.to_json() for i in s.inputs]},
                                                             sort_keys=True)})
    os.replace(tmp, path)

    # sanity: the archive loads back with the same parameters/buffers
    loaded = torch.jit.load(path)
    lp = [(n, list(p.shape)) for n, p in loaded.named_parameters()]
    assert lp == [(n, list(p.shape)) for n, p in named_params], s.name
    lb = [(n, list(b.shape)) for n, b in loaded.named_buffers()]
    assert lb == [(n, list(b.shape)) for n, b in named_buffers], s.name
    if s.stub_weights:  # zero-stride stubs survive the round trip; file stays small
        assert all(p.storage().size() == 1 for _, p in loaded.named_parameters()), s.name
        assert os.path.getsize(path) < 4 << 20, (s.name, os.path.getsize(path))
    arg_names = [a.name for a in loaded.forward.schema.arguments][1:]
    assert arg_names == [i.name for i in s.inputs], (s.name, arg_names)

    entry = {
        "name": s.name,
        "file": s.file,
        "kind": s.kind,
        "description": s.description,
        "config": _config_json(s.config),
        "inputs": [i.to_json() for i in s.inputs],
        "output": {"kind": "tensor", "dtype": s.output_dtype, "shape": list(s.output_shape),
                   "description": s.output_desc},
        "trace_example_shapes": (s.trace_shapes or [i.shape for i in s.inputs]) if s.kind == "traced" else None,
        "stub_weights": s.stub_weights,
        "run_forward": not s.stub_weights,
        "importable": s.importable,
        "param_count": nparams,
        "param_bytes": sum(p.numel() * p.element_size() for _, p in named_params),
        "tied_parameters": tied,
        "param_count_with_aliases": nparams + sum(dict(named_params)[c].numel() for _, c in tied),
        "parameters": _tensor_list(named_params),
        "buffers": _tensor_list(named_buffers),
        "graph_ops": graph_ops(loaded),
        "file_size": os.path.getsize(path),
    }
    return entry, time.time() - t0


def _child(name, out_dir, threads, conn):
    try:
        torch.set_num_threads(threads)
        s = {x.name: x for x in sample_table()}[name]
        entry, dt = generate_one(s, out_dir)
        conn.send((name, entry, dt, None))
    except BaseException as e:  # report to the parent, which fails loudly
        import traceback
        conn.send((name, None, 0.0, traceback.format_exc()))
        raise SystemExit(1) from e
    finally:
        conn.close()


def run_jobs(names, out_dir, jobs, threads):
    """Generate each sample in its own forked process, at most `jobs` at a time.

    All children are started from this one call site on the main thread, so
    the Python stacks recorded in traced modules' debug info are identical
    whatever subset is regenerated. Yields (name, entry, seconds) in order.
    """
    ctx = multiprocessing.get_context("fork")
    pending = list(names)
    running = []  # (name, process, conn)
    results = {}
    order = list(names)
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(name, out_dir, threads, send))
            p.start()
            send.close()
            running.append((name, p, recv))
        multiprocessing.connection.wait([r for _, _, r in running])
        still = []
        for name, p, recv in running:
            if recv.poll():
                try:
                    _, entry, dt, err = recv.recv()
                except EOFError:
                    entry, dt, err = None, 0.0, "worker died without a result"
                p.join()
                if err:
                    for _, q, _ in running:
                        if q is not p:
                            q.kill()
                    raise RuntimeError(f"generating {name} failed:\n{err}")
                results[name] = (entry, dt)
            else:
                still.append((name, p, recv))
        running = still
        while order and order[0] in results:
            n = order.pop(0)
            yield (n,) + results.pop(n)


def compact_json(obj, indent=""):
    """Indented JSON with lists of numbers (shapes) kept on one line."""
    inner = indent + " "

    def flat(v):
        return not isinstance(v, (dict, list)) or (
            isinstance(v, list) and all(isinstance(x, (int, float)) for x in v))

    if isinstance(obj, dict) and obj and len(obj) <= 4 and all(flat(v) for v in obj.values()):
        return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {compact_json(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and obj and not all(isinstance(x, (int, float)) for x in obj):
        return "[\n" + ",\n".join(inner + compact_json(x, inner) for x in obj) + "\n" + indent + "]"
    return json.dumps(obj)


def main(argv=None):
    # TorchScript output depends on Python's string hashing (scripted modules)
    # and on what was compiled earlier in the process (class-name mangling):
    # pin the hash seed and generate every sample in a freshly forked child.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--only", default="", help="comma-separated sample names")
    ap.add_argument("--force", action="store_true", help="rewrite even if up to date")
    ap.add_argument("--list", action="store_true", help="list sample names and exit")
    ap.add_argument("--quiet", action="store_true", help="print nothing when all files are up to date")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel workers")
    args = ap.parse_args(argv)

    table = sample_table()
    by_name = {s.name: s for s in table}
    if args.list:
        for s in table:
            print(s.name)
        return 0
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in by_name]
    if unknown:
        ap.error(f"unknown sample(s): {', '.join(unknown)}; known: {', '.join(by_name)}")
    selected = [s for s in table if not only or s.name in only]

    os.makedirs(args.out, exist_ok=True)
    script_mtime = max(os.path.getmtime(os.path.join(HERE, f)) for f in ("models.py", "generate.py"))

    manifest_path = os.path.join(args.out, "manifest.json")
    old = {}
    old_text = None
    if os.path.exists(manifest_path):
        try:
            with open(manifest_path) as f:
                old_text = f.read()
            old = {e["name"]: e for e in json.loads(old_text).get("samples", [])}
        except (ValueError, KeyError, TypeError):
            old, old_text = {}, None

    entries = dict(old)
    todo = []
    for s in selected:
        path = os.path.join(args.out, s.file)
        up_to_date = (os.path.exists(path) and os.path.getmtime(path) > script_mtime
                      and s.name in old and old[s.name].get("file_size") == os.path.getsize(path))
        if args.force or not up_to_date:
            todo.append(s.name)

    jobs = max(1, min(args.jobs, len(todo)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    for name, entry, dt in run_jobs(todo, args.out, jobs, threads):
        entries[name] = entry
        path = os.path.join(args.out, entry["file"])
        print(f"wrote {path} ({entry['file_size']} bytes, {entry['param_count']} params, {dt:.2f}s)",
              flush=True)

    manifest = {
        "version": MANIFEST_VERSION,
        "generator": "sample_models/generate.py",
        "torch_version": torch.__version__.split("+")[0],
        "samples": [entries[s.name] for s in table if s.name in entries],
    }
    text = compact_json(manifest) + "\n"
    if text != old_text:
        tmp = manifest_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, manifest_path)
        if not args.quiet or todo:
            print(f"wrote {manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
