#!/usr/bin/env python3
"""Write the sample models (TorchScript .pt, torch.export .pt2) and out/manifest.json.

    .venv/bin/python sample_models/generate.py [--out DIR] [--only NAME,...] [--force] [--list]

Runs in the project venv (torch 2.13; `transformers` from sample_models/requirements.txt for the
hf_* samples). Started with another interpreter that has no torch, it re-executes itself with
.venv/bin/python. Every sample is written as TorchScript (<name>.pt) and as an exported program
(<name>.pt2, torch.export with a dynamic batch dim where the model allows it); some also in
core-ATen form (<name>.core.pt2, ep.run_decompositions()). A sample is skipped when its files are
newer than models.py and generate.py, the manifest describes them and the torch/transformers
versions are unchanged; --force rewrites. One line is printed per sample written. Everything is
deterministic (fixed seeds, fixed example inputs, PYTHONHASHSEED=0, one forked process per sample).
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
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PYTHON = os.path.join(os.path.dirname(HERE), ".venv", "bin", "python")
sys.path.insert(0, HERE)


def reexec_in_venv_without_torch(script):
    """Re-run `script` with the project venv's interpreter when this one cannot import torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.path.exists(VENV_PYTHON) and os.path.abspath(sys.executable) != VENV_PYTHON:
            os.execv(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(script)] + sys.argv[1:])
        raise


if __name__ == "__main__":
    reexec_in_venv_without_torch(__file__)

import torch  # noqa: E402

import models as M  # noqa: E402

MANIFEST_VERSION = 2  # 2: "exported" (.pt2 / .core.pt2) per sample, "versions", hf_* samples

# Exported programs get one symbolic batch dim (dim 0 of every input) with this range; the
# example inputs have the recorded shapes, so the dim's hint is the recorded batch (e.g. 8).
BATCH_MIN = 1
BATCH_MAX = 1024
HF_SAMPLES = ("hf_llama_tiny", "hf_gpt2_tiny", "hf_mixtral_tiny", "hf_qwen3_moe_tiny",
              "hf_mixtral_gmm_tiny", "hf_qwen3_moe_gmm_tiny", "hf_deepseek_v3_gmm_tiny")


def quiet_warnings():
    """Silence the warnings torch / transformers print for things this generator does on purpose."""
    # TorchScript as a whole is deprecated in torch 2.x; the .pt files are what the TorchScript
    # importer reads, so torch.jit.script/trace/save/load stay.
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
    # Raised inside torch (run_decompositions deep-copies a pytree spec); nothing to fix here.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # transformers: torch.jit.trace reads every attribute of the module, deprecated properties too.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated")

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
    # torch.export: "dynamic" (dim 0 of every input is one Dim "batch" in [BATCH_MIN, BATCH_MAX]),
    # "static", or None (no .pt2)
    export: str = "dynamic"
    export_build: object = None  # () -> nn.Module to export when it is not `build` (same weights)
    export_note: str = ""
    core: bool = False  # also write the core-ATen form (ep.run_decompositions()) as <name>.core.pt2
    # the model's own code converts tensors to Python values while tracing (transformers' mask
    # helpers); the trace is then checked against eager at the recorded shapes instead
    tracer_warnings_ok: bool = False
    # draws random numbers in its forward (dropout in training): two runs differ, so nothing
    # compares its outputs with another run's (the manifest's run_forward is false)
    random: bool = False
    cost: float = 1.0  # rough generation time (s); the longest samples start first

    @property
    def file(self):
        return self.name + ".pt"

    @property
    def pt2_file(self):
        return self.name + ".pt2" if self.export else None

    @property
    def core_file(self):
        return self.name + ".core.pt2" if self.export and self.core else None

    def files(self):
        return [f for f in (self.file, self.pt2_file, self.core_file) if f]


# ---------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return fn().eval()

    return build


def _seeded_train(fn, dtype=torch.float32):
    def build():
        torch.manual_seed(0)
        return fn().train().to(dtype)

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
        trace_shapes=[[2, 4, ms.d_model]], core=True, cost=3))

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
            trace_shapes=[[1, 2] if stub else [2, 8]], stub_weights=stub, core=not stub, cost=5))
        S.append(Sample(
            f"gpt2_{size}_loss", "traced", what + "; forward(idx, targets) -> mean cross-entropy",
            build_loss, cfg,
            [_ids("idx", [8, T], V), _ids("targets", [8, T], V)], [],
            output_desc="tensor f32 [] (scalar loss)",
            trace_shapes=[[1, 2] if stub else [2, 8]] * 2, stub_weights=stub, cost=5 if stub else 2))
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
        ("llama3_405b", M.LLAMA3_405B, True, ("scripted",), M.LLAMA3_405B_PARAMS),
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
                stub_weights=stub, expected_params=expected, core=(name == "llama_tiny" and i == 0),
                cost=20 if name.startswith("llama3_") else 5 if stub or i == 0 else 2))

    cc = M.CNN_SMALL
    S.append(Sample(
        "cnn_small", "traced",
        "conv3x3(3->16)-BN-ReLU-maxpool2, conv3x3(16->32)-BN-ReLU-maxpool2, conv3x3(32->64,bias)-BN-ReLU, "
        "adaptive avgpool 1x1, flatten, Linear(64,10); BN in eval mode",
        _seeded(lambda: M.CnnSmall(cc)), cc,
        [InputSpec("x", "f32", [8, 3, 32, 32])], [8, cc.num_classes],
        output_desc="tensor f32 [8,10] class logits",
        trace_shapes=[[2, 3, 32, 32]], core=True, cost=3))

    rc = M.RESNET_BOTTLENECK
    S.append(Sample(
        "resnet_bottleneck", "traced",
        f"torchvision's ResNet-50 structure at width {rc.width} (stem conv7x7/2-BN-ReLU-maxpool, "
        f"Bottleneck stages {list(rc.layers)} with strided 1x1 downsample, in-place ReLU and "
        "`out += identity`, avgpool, Linear); BN in TRAINING mode (batch statistics, running stats "
        "updated); float64, because this network is chaotic in float32: the loss after one SGD step "
        "moves by percents with the intra-op thread count alone, so only float64 can tell a sharding "
        "bug from rounding",
        _seeded_train(lambda: M.ResNetBottleneck(rc), torch.float64), rc,
        [InputSpec("x", "f64", [8, 3, 64, 64])], [8, rc.num_classes],
        output_dtype="f64", output_desc="tensor f64 [8,10] class logits",
        trace_shapes=[[8, 3, 64, 64]], tracer_warnings_ok=True, core=True, cost=4))

    sc = M.SWIN_TINY
    S.append(Sample(
        "swin_tiny", "traced",
        f"torchvision's Swin Transformer (V1) structure, small: conv patch embedding {sc.patch}x{sc.patch} "
        f"to {sc.embed_dim} channels (NHWC, LayerNorm), stages {list(sc.depths)} of blocks with window "
        f"{sc.window} attention (heads {list(sc.heads)}), alternating unshifted and shifted windows: pad to "
        "whole windows, roll, relative position bias gathered as table[index], the shifted-window mask "
        "built by slice assignment into new_zeros (in-place writes through views), PatchMerging (strided "
        "slices, cat, LayerNorm, Linear), LayerNorm, avg pool, Linear head; training mode, dropout 0",
        _seeded_train(lambda: M.SwinTiny(sc)), sc,
        [InputSpec("x", "f32", [8, 3, 40, 40])], [8, sc.num_classes],
        output_desc="tensor f32 [8,10] class logits",
        trace_shapes=[[8, 3, 40, 40]], tracer_warnings_ok=True, cost=3))

    S.append(Sample(
        "batch_sized", "traced",
        "sizes computed from the batch: class token cls.expand(B, -1, -1) concatenated before "
        "Linear(16,32)(x), an RNN cell tanh(Linear(h_t) + Linear(s)) over the 7 positions from "
        "s = zeros(B, 32) + state0.repeat(B, 1), s + arange(B) * 0.01, cat of two Linear(32,16) branches, Linear(32,10)",
        _seeded(lambda: M.BatchSizedPatterns()), {"d_in": 16, "d_model": 32, "n_classes": 10},
        [InputSpec("x", "f32", [8, 6, 16])], [8, 10],
        output_desc="tensor f32 [8,10]",
        trace_shapes=[[2, 6, 16]], cost=2))
    S.append(Sample(
        "einsum_upsample", "traced",
        "conv3x3/2(3->16)-ReLU; maxvit-style attention over its 8x8 tokens (Linear qkv, 2 heads, "
        "einsum bhid,bhjd->bhij scores, softmax, einsum bhij,bhjd->bhid, Linear proj); upsample_bilinear2d "
        "x2 (align_corners=False) of it plus upsample_nearest2d x2 of the conv features, conv3x3(16->16)-ReLU, "
        "mean over space, Linear(16,10); float64, because the conv bias gradients sum thousands of "
        "terms that nearly cancel, so float32 rounding of a different summation order alone exceeds "
        "the sharded-vs-single tolerance",
        _seeded_train(lambda: M.EinsumUpsample(), torch.float64), {"dim": 16, "heads": 2, "n_classes": 10},
        [InputSpec("x", "f64", [8, 3, 16, 16])], [8, 10],
        output_dtype="f64", output_desc="tensor f64 [8,10] class logits",
        trace_shapes=[[2, 3, 16, 16]], cost=2))
    S.append(Sample(
        "gather_patterns", "traced",
        "h = tanh(Linear(16,16)(x)); h = (h.mT @ mix.T).mT (mix [6,6]); cat(h[:, idx % 6].mean(1), "
        "h[:, :, tensor([0, 3, 5])].mean(1)) into Linear(19,10): index.Tensor with an optional-tensor "
        "list [None, pos] (Falcon's attention exports it), its positions computed from a batch-split "
        "input; aten::mT and aten::numpy_T",
        _seeded(lambda: M.GatherPatterns()), {"d": 16, "n_classes": 10},
        [InputSpec("x", "f32", [8, 6, 16]), _ids("idx", [8], 100)], [8, 10],
        output_desc="tensor f32 [8,10]",
        trace_shapes=[[2, 6, 16], [2]], tracer_warnings_ok=True))
    S.append(Sample(
        "random_ops", "traced",
        "training mode: h = dropout(Linear(16,32)(x), 0.5); m = dropout(mix, 0.5) (mix [16,16], "
        "DropConnect); returns (Linear(16,10)(tanh(Linear(32,16)(tanh(h)) @ m)), m): dropout on a "
        "batch-split tensor, on a hidden dim tensor parallelism splits, and on a replicated weight",
        _seeded_train(lambda: M.RandomOps()), {"d": 16, "hidden": 32, "n_classes": 10, "p": 0.5},
        [InputSpec("x", "f32", [8, 16])], [8, 10],
        output_desc="tuple (f32 [8,10], f32 [16,16])",
        trace_shapes=[[2, 16]], random=True))
    S.append(Sample(
        "multi_output", "scripted",
        "proj=Linear(32,32), head=Linear(32,10); forward returns (relu(h), {'logits': head(h), 'hidden': h})",
        _seeded(lambda: M.MultiOutput()), {"d_model": 32, "n_classes": 10},
        [InputSpec("x", "f32", [4, 32])], [4, 32],
        output_desc="tuple (f32 [4,32], dict {logits: f32 [4,10], hidden: f32 [4,32]})"))
    S.append(Sample(
        "moe_tiny", "traced",
        "DeepSeek-V3-shaped mixture of experts: 2 pre-norm blocks x + moe(LayerNorm(x)), final "
        "LayerNorm; dim 32, 4 experts, top-2, expert and shared-expert FFN 64 (SiLU). Router: "
        "sigmoid(gate(t)), topk of scores + a per-expert bias buffer, the selected scores gathered "
        "and normalized; routed experts as bmm with each slot's expert weights gathered by index "
        "(transformers' batched_mm); block 1 sorts the slots by expert (sort.stable, perm // k, "
        "t[tok]) and combines with index_add, block 2 repeat_interleaves the tokens and combines "
        "with scatter_add; histc token counts times the mean scores added as a balance term",
        _seeded(lambda: M.MoeTiny()),
        {"dim": 32, "n_experts": 4, "top_k": 2, "ffn": 64, "shared_ffn": 64},
        [InputSpec("x", "f32", [8, 6, 32])], [8, 6, 32],
        output_desc="tensor f32 [8,6,32]",
        trace_shapes=[[2, 6, 32]], cost=2))
    def deepseek_desc(cfg):
        return (f"DeepSeek-V3-shaped decoder: {cfg.n_layers} pre-norm blocks (the first {cfg.n_dense_layers} "
                f"with a dense SwiGLU FFN {cfg.dense_ffn}), dim {cfg.dim}, MLA projections (q rank "
                f"{cfg.q_lora_rank}, kv rank {cfg.kv_lora_rank}, {cfg.n_heads} heads, qk {cfg.qk_head_dim}, "
                f"v {cfg.v_head_dim}, causal sdpa, no rope), mixture of experts with a shared expert and "
                f"{cfg.n_experts} routed experts top-{cfg.top_k} (SwiGLU {cfg.moe_ffn}, sigmoid router "
                f"with a bias buffer) dispatched into a static capacity per sequence (factor "
                f"{cfg.capacity_factor:g}; pairs past it dropped) by one-hot einsums, vocab "
                f"{cfg.vocab_size}, untied output")
    dt = M.DEEPSEEK_TINY
    S.append(Sample(
        "deepseek_tiny", "scripted", deepseek_desc(dt) + "; torch.jit.script",
        _seeded(lambda: M.DeepSeekV3(dt)), dt,
        [_ids("tokens", [8, 8], dt.vocab_size)], [8, 8, dt.vocab_size],
        output_desc=f"tensor f32 [8,8,{dt.vocab_size}] logits", cost=2))
    dv = M.DEEPSEEK_V3
    S.append(Sample(
        "deepseek_v3", "scripted", deepseek_desc(dv) + "; zero-stride stub weights; torch.jit.script",
        _stub(M.DeepSeekV3, dv), dv,
        [_ids("tokens", [8, 128], dv.vocab_size)], [8, 128, dv.vocab_size],
        output_desc=f"tensor f32 [8,128,{dv.vocab_size}] logits",
        stub_weights=True, expected_params=M.DEEPSEEK_V3_PARAMS, export=None, cost=10))
    S.append(Sample(
        "control_flow", "scripted",
        "lin=Linear(16,16); branches on bool(h.sum() > 0): data-dependent control flow (import error case)",
        _seeded(lambda: M.DataDependentBranch()), {"d_model": 16},
        [InputSpec("x", "f32", [4, 16])], [4, 16],
        output_desc="tensor f32 [4,16]", importable=False,
        export_build=_seeded(lambda: M.DataDependentCond()),
        export_note="torch.export cannot trace the Python branch on a tensor value; the .pt2 exports "
                    "the same model with the branch written as torch.cond (models.DataDependentCond, same "
                    "weights and outputs): a torch.ops.higher_order.cond node with two subgraphs"))

    for name, build, cfg_kwargs, hf_class, what in (
        ("hf_llama_tiny", M.hf_llama_tiny, M.HF_LLAMA_TINY, "LlamaForCausalLM",
         "Hugging Face transformers LlamaForCausalLM: hidden 64, 2 layers, 4 heads, 2 kv heads, "
         "intermediate 128, vocab 256, untied lm_head"),
        ("hf_gpt2_tiny", M.hf_gpt2_tiny, M.HF_GPT2_TINY, "GPT2LMHeadModel",
         "Hugging Face transformers GPT2LMHeadModel: n_embd 64, 2 layers, 4 heads, vocab 256, "
         "128 positions, lm_head tied to transformer.wte"),
        ("hf_mixtral_tiny", M.hf_mixtral_tiny, M.HF_MIXTRAL_TINY, "MixtralForCausalLM",
         "Hugging Face transformers MixtralForCausalLM: hidden 64, 2 layers, 4 heads, 2 kv heads, "
         "4 experts of intermediate 128, top-2 softmax router, vocab 256, untied lm_head, "
         "experts_implementation=\"batched_mm\" (topk, repeat_interleave, expert weights "
         "gathered by index, bmm)"),
        ("hf_qwen3_moe_tiny", M.hf_qwen3_moe_tiny, M.HF_QWEN3_MOE_TINY, "Qwen3MoeForCausalLM",
         "Hugging Face transformers Qwen3MoeForCausalLM: hidden 64, 2 layers, 4 heads, 2 kv heads, "
         "head dim 16 with q/k RMSNorm, 4 experts of intermediate 48, top-2 softmax router with "
         "normalized top-k weights, vocab 256, untied lm_head, experts_implementation=\"batched_mm\""),
    ):
        V = cfg_kwargs["vocab_size"]
        S.append(Sample(
            name, "traced",
            what + "; sdpa attention, random init (seed 0), no cache; forward(input_ids) -> logits "
                   "(a subclass: parameter names are the HF ones)",
            _seeded(build), dict(transformers_class=hf_class, **cfg_kwargs),
            [_ids("input_ids", [8, 32], V)], [8, 32, V],
            output_desc=f"tensor f32 [8,32,{V}] logits",
            trace_shapes=[[2, 8]], tracer_warnings_ok=True, cost=6))
    # MoE models exported in transformers' default experts implementation ("grouped_mm": tokens
    # sorted by expert, histc counts, transformers::grouped_mm_fallback); their .pt is the
    # batched_mm trace of the same weights (TorchScript cannot load the custom op).
    for name, what, build, cfg_kwargs, hf_class in (
        ("hf_mixtral_gmm_tiny", "hf_mixtral_tiny's model and weights", M.hf_mixtral_tiny,
         M.HF_MIXTRAL_TINY, "MixtralForCausalLM"),
        ("hf_qwen3_moe_gmm_tiny", "hf_qwen3_moe_tiny's model and weights", M.hf_qwen3_moe_tiny,
         M.HF_QWEN3_MOE_TINY, "Qwen3MoeForCausalLM"),
        ("hf_deepseek_v3_gmm_tiny", "Hugging Face transformers DeepseekV3ForCausalLM: hidden 64, "
         "2 layers, 4 heads of multi-head latent attention (q/kv LoRA ranks 32/16, rotary dim 8), "
         "the first layer dense, then 4 experts of intermediate 48 in 2 groups, top-2 sigmoid "
         "routing, one shared expert, vocab 256, untied lm_head",
         M.hf_deepseek_v3_tiny, M.HF_DEEPSEEK_V3_TINY, "DeepseekV3ForCausalLM"),
    ):
        V = cfg_kwargs["vocab_size"]
        S.append(Sample(
            name, "traced",
            what + "; its .pt2 exported with transformers' default experts implementation "
            "(grouped_mm: sort, histc, transformers::grouped_mm_fallback), the .pt is the "
            "batched_mm trace; sdpa attention, random init (seed 0), no cache; "
            "forward(input_ids) -> logits",
            _seeded(build), dict(transformers_class=hf_class, experts_implementation="grouped_mm",
                                 **{k: v for k, v in cfg_kwargs.items()
                                    if k != "experts_implementation"}),
            [_ids("input_ids", [8, 32], V)], [8, 32, V],
            output_desc=f"tensor f32 [8,32,{V}] logits",
            trace_shapes=[[2, 8]], tracer_warnings_ok=True, cost=6,
            export_build=_seeded(M.with_grouped_mm_experts(build)),
            export_note="exported with experts_implementation=\"grouped_mm\" (the default of "
                        "from_pretrained): same weights and logits as the .pt"))
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
            warnings.simplefilter("ignore" if s.tracer_warnings_ok else "error", torch.jit.TracerWarning)
            traced = torch.jit.trace(model, example, check_trace=False)
    finally:
        if stubs is not None:
            for p, st in zip(params, stubs):
                p.data = st
    if s.tracer_warnings_ok:
        # Python values the model computed from tensors are constants in the trace: check that
        # the trace (made at trace_shapes) still matches eager at the recorded shapes.
        xs = [spec.make() for spec in s.inputs]
        with torch.no_grad():
            err = (traced(*xs) - model(*xs)).abs().max().item()
        assert err <= 1e-5, (s.name, "trace does not generalize to the recorded shapes", err)
    return model, traced


def _atomic_save(out_dir, name, fname, save):
    """save(path) into a scratch dir, then move to out_dir/fname.

    torch.export.save names the archive's top folder after the file (`<stem>/models/model.json`),
    so the scratch file has the final name.
    """
    tmp_dir = os.path.join(out_dir, ".tmp", name)
    os.makedirs(tmp_dir, exist_ok=True)
    tmp = os.path.join(tmp_dir, fname)
    save(tmp)
    path = os.path.join(out_dir, fname)
    os.replace(tmp, path)
    os.rmdir(tmp_dir)
    return path


def read_pt2_json(path, member):
    """A JSON member of a .pt2 archive, e.g. 'models/model.json' (any top-level folder name)."""
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith("/" + member) and n.count("/") == member.count("/") + 1]
        assert len(names) == 1, (path, member, names)
        return json.loads(z.read(names[0]))


def pt2_graph_ops(path):
    """Sorted node targets of an exported program as serialized (model.json), subgraphs included."""
    ops = set()

    def walk(obj):
        if isinstance(obj, dict):
            if "target" in obj and "inputs" in obj and "outputs" in obj:
                ops.add(obj["target"])
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(read_pt2_json(path, "models/model.json")["graph_module"]["graph"])
    return sorted(ops)


def user_input_names(ep):
    from torch.export.graph_signature import InputKind

    return [i.arg.name for i in ep.graph_signature.input_specs if i.kind == InputKind.USER_INPUT]


def dynamic_dims(ep):
    """{input: {dim: {min, max}}} for the symbolic dims of the exported program's user inputs."""
    names = user_input_names(ep)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    out = {}
    for name in names:
        dims = {}
        for d, size in enumerate(placeholders[name].meta["val"].shape):
            if isinstance(size, torch.SymInt):
                vr = ep.range_constraints[size.node.expr]
                dims[str(d)] = {"min": int(vr.lower), "max": int(vr.upper)}
        if dims:
            out[name] = dims
    return out


def export_program(s: Sample, model, out_dir, named_params, named_buffers, tied):
    """Write <name>.pt2 (and <name>.core.pt2); returns the manifest's "exported" entry."""
    if s.export_build is not None:
        model = s.export_build()
    example = tuple(spec.make() for spec in s.inputs)  # recorded shapes: the hint is the recorded batch
    dynamic_shapes = None
    if s.export == "dynamic":
        batch = torch.export.Dim("batch", min=BATCH_MIN, max=BATCH_MAX)
        dynamic_shapes = tuple({0: batch} for _ in s.inputs)
    ep = torch.export.export(model, example, dynamic_shapes=dynamic_shapes)
    ep.example_inputs = None  # not stored in the archive (toy_block's would add 4 MB)

    sig = ep.graph_signature
    # Like libtorch's named_parameters(), the program lists a tied parameter under every name
    # (the aliases last); the archive stores the tensor once (same data/weights file).
    assert list(sig.parameters) == [n for n, _ in named_params] + [a for a, _ in tied], s.name
    assert sorted(sig.buffers) == sorted(n for n, _ in named_buffers), s.name
    assert user_input_names(ep) == [i.name for i in s.inputs], (s.name, user_input_names(ep))
    dyn = dynamic_dims(ep)
    if s.export == "dynamic":
        want = {i.name: {"0": {"min": BATCH_MIN, "max": BATCH_MAX}} for i in s.inputs}
        assert dyn == want, (s.name, dyn)

    with warnings.catch_warnings():
        # stub weights are zero-stride views; the archive stores their 4-byte storages as they are
        warnings.filterwarnings("ignore", message="No complete tensor found in the group")
        path = _atomic_save(out_dir, s.name, s.pt2_file, lambda f: torch.export.save(ep, f))
    if s.stub_weights:
        cfg = read_pt2_json(path, "data/weights/model_weights_config.json")["config"]
        for n, p in named_params:
            meta = cfg[n]["tensor_meta"]
            assert [d["as_int"] for d in meta["sizes"]] == list(p.shape), (s.name, n)
            assert all(d["as_int"] == 0 for d in meta["strides"]), (s.name, n)
        # The program text grows with the layers (llama3_405b: 13 MB); weights would be terabytes.
        assert os.path.getsize(path) < 32 << 20, (s.name, os.path.getsize(path))
    if tied:
        cfg = read_pt2_json(path, "data/weights/model_weights_config.json")["config"]
        for alias, canonical in tied:
            assert cfg[alias]["path_name"] == cfg[canonical]["path_name"], (s.name, alias)

    entry = {
        "file": s.pt2_file,
        "core_file": s.core_file,
        "dynamic": dyn,
        "file_size": os.path.getsize(path),
        "graph_ops": pt2_graph_ops(path),
    }
    if s.core_file:
        core = ep.run_decompositions()
        # The decomposition passes leave provenance in node.meta["from_node"], which records
        # id(graph) (a memory address): drop it, or the file would differ from run to run.
        for gm in core.graph_module.modules():
            if isinstance(gm, torch.fx.GraphModule):
                for n in gm.graph.nodes:
                    n.meta.pop("from_node", None)
        core_path = _atomic_save(out_dir, s.name, s.core_file, lambda f: torch.export.save(core, f))
        assert dynamic_dims(core) == dyn, s.name
        entry["core_file_size"] = os.path.getsize(core_path)
        entry["core_graph_ops"] = pt2_graph_ops(core_path)
    if s.export_note:
        entry["note"] = s.export_note
    return entry


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
            assert p.untyped_storage().nbytes() == p.element_size(), (s.name, n)

    # The forward's input shapes travel inside the archive: apc's importer reads them as defaults.
    path = _atomic_save(out_dir, s.name, s.file, lambda f: sm.save(f, _extra_files={
        "apc_inputs.json": json.dumps({"inputs": [i.to_json() for i in s.inputs]}, sort_keys=True)}))

    # sanity: the archive loads back with the same parameters/buffers
    loaded = torch.jit.load(path)
    lp = [(n, list(p.shape)) for n, p in loaded.named_parameters()]
    assert lp == [(n, list(p.shape)) for n, p in named_params], s.name
    lb = [(n, list(b.shape)) for n, b in loaded.named_buffers()]
    assert lb == [(n, list(b.shape)) for n, b in named_buffers], s.name
    if s.stub_weights:  # zero-stride stubs survive the round trip; file stays small
        assert all(p.untyped_storage().nbytes() == p.element_size() for _, p in loaded.named_parameters()), s.name
        assert os.path.getsize(path) < 4 << 20, (s.name, os.path.getsize(path))
    arg_names = [a.name for a in loaded.forward.schema.arguments][1:]
    assert arg_names == [i.name for i in s.inputs], (s.name, arg_names)

    exported = export_program(s, model, out_dir, named_params, named_buffers, tied) if s.export else None

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
        "run_forward": not s.stub_weights and not s.random,
        "importable": s.importable,
        "param_count": nparams,
        "param_bytes": sum(p.numel() * p.element_size() for _, p in named_params),
        "tied_parameters": tied,
        "param_count_with_aliases": nparams + sum(dict(named_params)[c].numel() for _, c in tied),
        "parameters": _tensor_list(named_params),
        "buffers": _tensor_list(named_buffers),
        "graph_ops": graph_ops(loaded),
        "file_size": os.path.getsize(path),
        "exported": exported,
    }
    return entry, time.time() - t0


def _child(name, out_dir, threads, conn):
    try:
        quiet_warnings()
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
    cost = {s.name: s.cost for s in sample_table()}
    pending = sorted(names, key=lambda n: -cost[n])  # longest first (stable)
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


def preload_export_modules():
    """Import what torch.export / save / run_decompositions load on first use (a few seconds).

    Done once in the parent, so that the forked children share it. Imports only: the parent
    runs no ops (its thread pools stay unstarted for the children).
    """
    import importlib

    for m in ("torch._dynamo", "torch.export._trace", "torch.export._unlift", "torch._functorch.aot_autograd",
              "torch._export.serde.serialize", "torch.export.pt2_archive._package", "torch._decomp",
              "torch.fx.experimental.validator", "torch._inductor.ir", "sympy.combinatorics"):
        importlib.import_module(m)


def library_versions():
    """Versions of the libraries whose output the samples depend on (a change regenerates all)."""
    import importlib.metadata

    v = {"torch": torch.__version__.split("+")[0]}
    try:
        v["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        pass
    return v


def files_up_to_date(s: Sample, old_entry, out_dir, script_mtime):
    """All of the sample's files exist, are newer than the scripts and have the recorded sizes."""
    if not old_entry:
        return False
    ex = old_entry.get("exported") or {}
    recorded = {old_entry.get("file"): old_entry.get("file_size"),
                ex.get("file"): ex.get("file_size"), ex.get("core_file"): ex.get("core_file_size")}
    for f in s.files():
        path = os.path.join(out_dir, f)
        if not (os.path.exists(path) and os.path.getmtime(path) > script_mtime
                and recorded.get(f) == os.path.getsize(path)):
            return False
    return True


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
    old_versions = None
    if os.path.exists(manifest_path):
        try:
            with open(manifest_path) as f:
                old_text = f.read()
            old_manifest = json.loads(old_text)
            if old_manifest.get("version") == MANIFEST_VERSION:
                old = {e["name"]: e for e in old_manifest.get("samples", [])}
                old_versions = old_manifest.get("versions")
        except (ValueError, KeyError, TypeError, AttributeError):
            old, old_text = {}, None

    versions = library_versions()
    same_versions = old_versions == versions
    missing_hf = [s.name for s in selected if s.name in HF_SAMPLES and "transformers" not in versions]
    entries = dict(old)
    todo = []
    for s in selected:
        if s.name in missing_hf:
            continue
        if args.force or not same_versions or not files_up_to_date(s, old.get(s.name), args.out, script_mtime):
            todo.append(s.name)

    if todo:
        quiet_warnings()
        preload_export_modules()
    jobs = max(1, min(args.jobs, len(todo)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    for name, entry, dt in run_jobs(todo, args.out, jobs, threads):
        entries[name] = entry
        path = os.path.join(args.out, entry["file"])
        files = f"{entry['file_size']} bytes"
        ex = entry["exported"]
        if ex:
            files += f"; {ex['file']} {ex['file_size']} bytes"
            if ex["core_file"]:
                files += f"; {ex['core_file']} {ex['core_file_size']} bytes"
        print(f"wrote {path} ({files}, {entry['param_count']} params, {dt:.2f}s)", flush=True)
    tmp_root = os.path.join(args.out, ".tmp")
    if os.path.isdir(tmp_root) and not os.listdir(tmp_root):
        os.rmdir(tmp_root)

    manifest = {
        "version": MANIFEST_VERSION,
        "generator": "sample_models/generate.py",
        "torch_version": versions["torch"],
        "versions": versions,
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
    if missing_hf:
        print(f"generate.py: not written: {', '.join(missing_hf)}: transformers is not installed "
              f"(.venv/bin/pip install -r sample_models/requirements.txt)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
