"""Reads apc checkpoints (apc/runtime/checkpoint.h) from Python, as a user would.

read_checkpoint.py CKPT_A CKPT_B MODEL.pt [EXPORTED.safetensors]: puts the full tensors of two checkpoints of the same
training under different plans together, with safetensors and with torch + json alone (the two
readers must agree), and checks that the full parameters and optimizer state of A and B are equal
(to rtol 1e-4), that the parameters carry the model's own state_dict names and shapes, and that
they moved away from MODEL.pt's initial weights. EXPORTED (what `apc export CKPT_B` wrote) must
hold exactly B's full parameters and buffers. Prints "ok: ..."
and exits 0, else raises.
"""
import json
import struct
import sys

import torch
from safetensors import safe_open

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_plain(path):
    """A safetensors file with torch and json only: {key: tensor}."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + e])
        out[key] = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]]).reshape(t["shape"]) \
            if e > b else torch.empty(t["shape"], dtype=DTYPES[t["dtype"]])
    return out


def full_tensors(ckpt, reader):
    """{name: full tensor} of every tensor in the checkpoint's manifest."""
    with open(f"{ckpt}/manifest.json") as f:
        manifest = json.load(f)
    files = {}
    out = {}
    for name, t in manifest["tensors"].items():
        full = torch.empty(t["shape"], dtype=DTYPES[t["dtype"]])
        covered = torch.zeros(t["shape"], dtype=torch.int32)
        for p in t["pieces"]:
            if p["file"] not in files:
                files[p["file"]] = reader(f"{ckpt}/{p['file']}")
            piece = files[p["file"]][p["key"]]
            assert list(piece.shape) == p["sizes"], (name, piece.shape, p["sizes"])
            idx = tuple(slice(o, o + s) for o, s in zip(p["offsets"], p["sizes"]))
            full[idx] = piece
            covered[idx] += 1
        assert bool((covered == 1).all()), f"{name}: pieces do not cover it exactly once"
        out[name] = full
    return manifest, out


def with_safetensors(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def main():
    a_dir, b_dir, model = sys.argv[1:4]
    exported = sys.argv[4] if len(sys.argv) > 4 else None
    ma, a = full_tensors(a_dir, with_safetensors)
    _, a_plain = full_tensors(a_dir, read_plain)
    mb, b = full_tensors(b_dir, with_safetensors)
    assert ma["plan_hash"] != mb["plan_hash"], "the two checkpoints should be of different plans"
    assert a.keys() == a_plain.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], a_plain[k]), f"{k}: safetensors and the plain reader differ"
    init = torch.jit.load(model).state_dict()
    params = [k for k, t in ma["tensors"].items() if t["kind"] == "parameter"]
    assert params, "no parameters"
    moved = 0
    for k in params:
        assert k in init, f"{k} is not a name of the model's state_dict"
        assert a[k].shape == init[k].shape, (k, a[k].shape, init[k].shape)
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")
        moved += int(not torch.equal(a[k], init[k].to(a[k].dtype)))
    assert moved == len(params), f"only {moved} of {len(params)} parameters moved"
    state = [k for k, t in ma["tensors"].items() if t["kind"] == "optimizer"]
    for k in state:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")
    if exported:
        from safetensors.torch import load_file
        e = load_file(exported)
        want = {k for k, t in mb["tensors"].items() if t["kind"] in ("parameter", "buffer")}
        assert set(e) == want, sorted(set(e) ^ want)
        for k in want:
            assert torch.equal(e[k], b[k]), f"{k}: the exported tensor differs"
    print(f"ok: {len(params)} parameters, {len(state)} optimizer tensors, "
          f"step {ma['step']}, {sum(f['bytes'] for f in ma['files'].values())} bytes")


if __name__ == "__main__":
    main()
