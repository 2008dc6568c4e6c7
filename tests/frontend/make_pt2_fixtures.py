"""Small torch.export programs for the exported-program importer tests (tests/frontend).

    .venv/bin/python tests/frontend/make_pt2_fixtures.py OUT_DIR

Writes, into OUT_DIR, programs whose features the sample models do not have:

  bn_train.pt2     BatchNorm1d in training mode, training IR: in-place updates (add_, batch_norm)
  bn_train_functional.pt2   the same after run_decompositions({}): functional, with
                   buffer_mutation outputs (running stats, num_batches_tracked)
  cond.pt2         torch.cond on the input's values: a control-flow higher-order op
  custom_op.pt2    a torch.library custom op (apc_test::scale): not an ATen operator
  hf_grouped_mm_fallback.pt2  Hugging Face's transformers::grouped_mm_fallback (when transformers
                   is installed), imported as aten::_grouped_mm; hf_grouped_mm_fallback_i64.pt2
                   the same with i64 offsets: an error that says how to export without it
  two_dims.pt2     dynamic batch and sequence dims, flattened together (a size B*T)
  constant.pt2     a plain tensor attribute read by forward: a lifted tensor constant
  scripted_loops.pt   TorchScript (torch.jit.script) with control flow known once shapes and
                   attributes are: a loop over range(x.dim() - 2) (BatchNorm's _verify_batch_size
                   too), `if self.training`, a raise with string formatting on an error path
  scripted_data_loop.pt   a loop whose trip count is read from the input's values (an error)
  scripted_optional.pt    optional forward inputs left at their defaults (None, a float), a
                   tuple built and unpacked inside the forward (scripted TransformerEncoder's form)
  inplace_*.pt     in-place writes through views (scripted, traced where tracing keeps them,
                   and exported as inplace_*.pt2, the same module and weights): repeated writes through one view, the chain v.mul_(2).add_(100.),
                   reads interleaved with the writes, writes through the base and through nested
                   slices and selects, views taken before a write and read after it;
                   inplace_refused_view.pt writes through a view() whose base is read later

Run by frontend_test (ExportedFixtures) with the project venv; deterministic (fixed seeds).
"""

import os
import sys

from typing import Optional, Tuple

import torch


class BnTrain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.lin(x)).relu()


class Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: self.lin(t), lambda t: t * 2, (x,))


@torch.library.custom_op("apc_test::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@scale.register_fake
def _(x):
    return torch.empty_like(x)


class Custom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return scale(self.lin(x))


class EmptyCache(torch.nn.Module):
    """transformers' DynamicCache start: torch.cat of an empty 1-d tensor (lifted as an f32[0]
    constant) and the keys, which torch's legacy rule for empty operands skips."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        k = self.lin(x)
        return torch.cat([torch.tensor([]), k], dim=-2) * 2


class TwoDims(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):  # x: [B, T, 16]
        b, t, d = x.shape
        y = self.lin(x.reshape(b * t, d))
        return y.view(b, t, d)


class Constant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.table = torch.arange(6, dtype=torch.float32)  # a plain attribute: a tensor constant

    def forward(self, x):
        return self.lin(x) + self.table


class ScriptedLoops(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        h = self.bn(self.conv(x))
        for i in range(x.dim() - 2):
            h = h * 2.0 + float(i)
        if self.training:
            h = h.relu()
        if h.size(1) != 4:
            raise ValueError("expected 4 channels, got {}".format(h.size(1)))
        return h


class ScriptedOptional(torch.nn.Module):
    """Like a scripted nn.TransformerEncoder: optional inputs with defaults, and a tuple built and
    unpacked inside the forward (MultiheadAttention returns (out, None), the caller takes [0])."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def pair(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        h = self.lin(x)
        if mask is not None:
            h = h + mask
        return h, None

    def forward(self, x, mask: Optional[torch.Tensor] = None, scale: float = 2.0,
                need_weights: Optional[bool] = None):
        h, w = self.pair(x, mask)
        h = self.pair(h * scale, mask)[0]
        if need_weights is not None and need_weights:
            raise ValueError("weights are not returned")
        return h


class ScriptedDataLoop(torch.nn.Module):
    def forward(self, x):
        n = int(x.sum().item())
        for _ in range(n):
            x = x + 1.0
        return x


class InplaceRepeated(torch.nn.Module):
    """The issue's case: two in-place ops through the same view of a computed tensor."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        v = h[:, :8]
        v.mul_(2)
        v.add_(100.)
        return h


class InplaceChain(torch.nn.Module):
    def forward(self, x):
        h = x * 1.5
        h[:, :8].mul_(2).add_(100.)
        return h


class InplaceInterleaved(torch.nn.Module):
    def forward(self, x):
        h = x + 1.0
        v = h[:, :8]
        u = v[1]
        a = v.sum(1)
        v.mul_(2)
        b = h.sum(1)
        v.add_(100.)
        c = v * 3.0
        v.sub_(x[:, :8])
        return h, a, b, c, u, v


class InplaceBaseAndViews(torch.nn.Module):
    def forward(self, x):
        h = x - 0.5
        v = h[:, 2:6]
        w = h.t()
        h.add_(1.)
        v.mul_(3.)
        s = h[1]
        s[:4].mul_(2.)
        s[4:].add_(1.)
        h[0] = 7.0
        h[:, 4:12] += x[:, :8]
        return h, v, w.sum(0), s


class InplaceRefusedView(torch.nn.Module):
    def forward(self, x):
        h = x * 2.0
        v = h.view(4, 2, 8)
        v.mul_(2.)
        return h


class HfGroupedMmFallback(torch.nn.Module):
    """Hugging Face's grouped-mm experts as exported with f32 weights: the custom op
    transformers::grouped_mm_fallback (registered by transformers.integrations.moe)."""

    def __init__(self, offs_dtype=torch.int32):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2, 4, 4))
        self.offs_dtype = offs_dtype

    def forward(self, x):
        offs = torch.tensor([1, x.size(0)], dtype=self.offs_dtype)
        return torch.ops.transformers.grouped_mm_fallback(x, self.w, offs=offs)


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2, max=64)
    seq = torch.export.Dim("seq", min=2, max=32)
    programs = {
        "bn_train": (BnTrain().train(), (torch.randn(4, 8),), ({0: batch},)),
        "cond": (Cond(), (torch.randn(3, 4),), None),
        "custom_op": (Custom(), (torch.randn(3, 4),), None),
        "empty_cache": (EmptyCache(), (torch.randn(4, 5, 8),), ({0: batch},)),
        "two_dims": (TwoDims(), (torch.randn(4, 5, 16),), ({0: batch, 1: seq},)),
        "constant": (Constant(), (torch.randn(3, 6),), ({0: batch},)),
    }
    for name, (model, args, dynamic) in programs.items():
        ep = torch.export.export(model, args, dynamic_shapes=dynamic)
        torch.export.save(ep, os.path.join(out, name + ".pt2"))
        if name == "bn_train":
            torch.export.save(ep.run_decompositions({}), os.path.join(out, name + "_functional.pt2"))
    try:  # registers transformers::grouped_mm_fallback
        import transformers.integrations.moe  # noqa: F401
    except ImportError:
        pass
    if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        ep = torch.export.export(HfGroupedMmFallback(), (torch.randn(3, 4),))
        torch.export.save(ep, os.path.join(out, "hf_grouped_mm_fallback.pt2"))
        # i64 offsets, which the op accepts and torch._grouped_mm does not
        ep = torch.export.export(HfGroupedMmFallback(torch.int64), (torch.randn(3, 4),))
        torch.export.save(ep, os.path.join(out, "hf_grouped_mm_fallback_i64.pt2"))
    torch.jit.script(ScriptedLoops().train()).save(os.path.join(out, "scripted_loops.pt"))
    torch.jit.script(ScriptedDataLoop()).save(os.path.join(out, "scripted_data_loop.pt"))
    torch.jit.script(ScriptedOptional()).save(os.path.join(out, "scripted_optional.pt"))
    # A TorchScript archive calling an operator only Python registers (as torchvision's nms is
    # for a LibTorch without torchvision): LibTorch cannot load it.
    torch.jit.trace(Custom(), (torch.randn(3, 4),)).save(os.path.join(out, "custom_op.pt"))
    x = torch.randn(4, 16)
    inplace = {"repeated": InplaceRepeated(), "chain": InplaceChain(),
               "interleaved": InplaceInterleaved(), "base_and_views": InplaceBaseAndViews(),
               "refused_view": InplaceRefusedView()}
    for name, model in inplace.items():
        torch.jit.script(model).save(os.path.join(out, "inplace_" + name + ".pt"))
        if name in ("repeated", "chain", "base_and_views"):
            traced = torch.jit.trace(model, (x,), check_trace=False)
            traced.save(os.path.join(out, "inplace_" + name + "_traced.pt"))
        if name != "refused_view":  # the training IR keeps the in-place ops on views too
            ep = torch.export.export(model, (x,))
            torch.export.save(ep, os.path.join(out, "inplace_" + name + ".pt2"))
    print("wrote", ", ".join(programs), "(and bn_train_functional, custom_op.pt, scripted_loops,",
          "scripted_data_loop, scripted_optional, inplace_*) to", out)


if __name__ == "__main__":
    main(sys.argv[1])
