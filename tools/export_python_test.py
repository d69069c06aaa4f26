"""Checks what `zccctl export` wrote, with the reference `safetensors` package
(and PyTorch where it is installed): every tensor whole, with the values the
sliced step was written with (checkpoint/testing/sliced_step.h, computed here
independently), the index's weight_map and total_size, the shard size limit,
the file names transformers uses, and dtype conversion against numpy's and
PyTorch's own rounding.

Usage: export_python_test.py --layers L --hidden H --intermediate I --vocab V
           --sharded DIR --max-shard-bytes N --bf16 DIR --f16 DIR --ema DIR
"""

import argparse
import json
import os
import re
import struct

import numpy as np
import safetensors
from safetensors import safe_open

try:
    import torch
    from safetensors.torch import load_file as torch_load_file
except ImportError:  # the numpy/raw-byte checks still run
    torch = None


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def fnv1a32(text):
    h = 2166136261
    for b in text.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


# Keep in sync with checkpoint/testing/sliced_step.{h,cc}.
def model_tensors(layers, hidden, intermediate, vocab):
    """{kind: {name: (dtype, shape)}} of the sliced model."""
    params = {
        "model.embed_tokens.weight": ("BF16", [vocab, hidden]),
        "model.logit_scale": ("F32", []),
        "model.norm.weight": ("F32", [hidden]),
        "model.step_count": ("I64", [3]),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        params[p + "input_layernorm.weight"] = ("F32", [hidden])
        params[p + "mlp.down_proj.weight"] = ("F32", [hidden, intermediate])
        params[p + "mlp.up_proj.weight"] = ("F32", [intermediate, hidden])
        params[p + "self_attn.k_proj.weight"] = ("F16", [hidden, hidden])
        params[p + "self_attn.q_proj.weight"] = ("BF16", [hidden, hidden])
    floating = {n: ("F32", s) for n, (d, s) in params.items() if d != "I64"}
    return {
        "param": params,
        "optim": {n + ".exp_avg": v for n, v in floating.items()},
        "ema": floating,
    }


def expected_bits(kind, name, dtype, shape):
    """The element bits sliced_step.h's ElementBits gives, as a numpy array."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    flat = np.arange(n, dtype=np.uint64)
    u = (np.uint64(fnv1a32(f"{kind}:{name}")) + flat * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    if dtype == "F32":
        values = ((u % np.uint64(65536)).astype(np.int64) - 32768) / 256.0
        return values.astype(np.float32).reshape(shape)
    if dtype == "BF16":
        return (np.uint64(0x3C00) + u % np.uint64(0x800)).astype(np.uint16).reshape(shape)
    if dtype == "F16":
        return (np.uint64(0x3000) + u % np.uint64(0x1000)).astype(np.uint16).view(np.float16).reshape(shape)
    assert dtype == "I64"
    return (u.astype(np.int64) - (1 << 31)).reshape(shape)


def as_f32(dtype, array):
    """The exact float32 values of an expected BF16/F16/F32 array."""
    if dtype == "BF16":
        return (array.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return array.astype(np.float32)


def read_raw(path):
    """{name: (dtype, shape, bytes)} and the metadata, through safetensors.deserialize."""
    with open(path, "rb") as fh:
        content = fh.read()
    (n,) = struct.unpack("<Q", content[:8])
    metadata = json.loads(content[8:8 + n]).get("__metadata__")
    return {name: (v["dtype"], list(v["shape"]), bytes(v["data"]))
            for name, v in safetensors.deserialize(content)}, metadata


def weight_files(out_dir):
    """The weight files of an export and the weight map, as transformers finds them."""
    index_path = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as fh:
            index = json.load(fh)
        check(set(index) == {"metadata", "weight_map"}, f"index keys {sorted(index)}")
        return index, sorted(set(index["weight_map"].values()))
    check(os.path.exists(os.path.join(out_dir, "model.safetensors")), f"{out_dir}: no weights")
    return None, ["model.safetensors"]


def load_export(out_dir):
    """Every tensor of an export as raw (dtype, shape, bytes), with checks of the
    index against the files."""
    index, files = weight_files(out_dir)
    tensors = {}
    file_of = {}
    data_bytes = {}
    for f in files:
        raw, metadata = read_raw(os.path.join(out_dir, f))
        check(metadata == {"format": "pt"}, f"{f}: metadata {metadata}")
        # safe_open validates the header (offsets, coverage) its own way.
        with safe_open(os.path.join(out_dir, f), framework="np") as st:
            check(sorted(st.keys()) == sorted(raw), f"{f}: safe_open keys differ")
        for name, v in raw.items():
            check(name not in tensors, f"{name} in two files")
            tensors[name] = v
            file_of[name] = f
        data_bytes[f] = sum(len(v[2]) for v in raw.values())
    if index is not None:
        check(index["weight_map"] == file_of, "weight_map does not match the files")
        total = sum(len(v[2]) for v in tensors.values())
        check(index["metadata"]["total_size"] == total,
              f"total_size {index['metadata']['total_size']} != {total}")
    return tensors, file_of, data_bytes, files


def check_values(out_dir, want, convert=None):
    """`want`: {name: (dtype, shape, expected array)}; `convert(dtype, array)`:
    the (dtype, array) the export should hold instead."""
    tensors, _, _, _ = load_export(out_dir)
    check(sorted(tensors) == sorted(want), f"{out_dir}: names {sorted(tensors)} != {sorted(want)}")
    for name, (dtype, shape, array) in want.items():
        if convert is not None:
            dtype, array = convert(dtype, array)
        got_dtype, got_shape, data = tensors[name]
        check(got_dtype == dtype, f"{name}: dtype {got_dtype} != {dtype}")
        check(got_shape == shape, f"{name}: shape {got_shape} != {shape}")
        want_bytes = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        check(data == want_bytes, f"{name}: values differ")
    return tensors


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--layers", "--hidden", "--intermediate", "--vocab", "--max-shard-bytes"):
        ap.add_argument(flag, type=int, required=True)
    for flag in ("--sharded", "--bf16", "--f16", "--ema"):
        ap.add_argument(flag, required=True)
    a = ap.parse_args()
    model = model_tensors(a.layers, a.hidden, a.intermediate, a.vocab)
    want = {kind: {name: (d, s, expected_bits(kind, name, d, s)) for name, (d, s) in tensors.items()}
            for kind, tensors in model.items()}

    # 1. Sharded export, --dtype keep: names, values, shard names and sizes.
    tensors, file_of, data_bytes, files = load_export(a.sharded)
    n = len(files)
    check(n > 2, f"expected several shards, got {files}")
    check(files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)],
          f"shard names {files}")
    names = sorted(want["param"])
    # Name order: shard k holds a contiguous run of the sorted names.
    order = [files.index(file_of[name]) for name in names]
    check(order == sorted(order), "tensors are not assigned to shards in name order")
    for f, size in data_bytes.items():
        in_file = [name for name in names if file_of[name] == f]
        check(size <= a.max_shard_bytes or len(in_file) == 1, f"{f}: {size} bytes, {in_file}")
    # Greedy: the next shard's first tensor would not have fitted.
    for k in range(n - 1):
        first_next = next(name for name in names if file_of[name] == files[k + 1])
        check(data_bytes[files[k]] + len(tensors[first_next][2]) > a.max_shard_bytes,
              f"{files[k + 1]} started early")
    check_values(a.sharded, want["param"])
    check(os.path.exists(os.path.join(a.sharded, "config.json")), "config.json not copied")
    with open(os.path.join(a.sharded, "config.json")) as fh:
        check(json.load(fh) == {"model_type": "zcc-test"}, "config.json differs")
    check(not [e for e in os.listdir(a.sharded) if "zcc-partial" in e], "temporary files left")

    # 2. --dtype bf16: floating tensors rounded to nearest even (PyTorch's own
    # conversion is the reference where installed; numpy bit arithmetic
    # otherwise); integers kept.
    def to_bf16(dtype, array):
        if dtype == "I64":
            return dtype, array
        if dtype == "BF16":
            return dtype, array
        f32 = as_f32(dtype, array)
        if torch is not None:
            bits = torch.from_numpy(f32.copy()).to(torch.bfloat16).view(torch.int16).numpy()
            return "BF16", bits.view(np.uint16)
        w = f32.view(np.uint32).astype(np.uint64)
        rounded = (w + np.uint64(0x7FFF) + ((w >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        return "BF16", rounded.astype(np.uint16)

    check_values(a.bf16, want["param"], to_bf16)

    # 3. --dtype f16: numpy's float32 -> float16 (round to nearest even) as the reference.
    def to_f16(dtype, array):
        if dtype == "I64":
            return dtype, array
        return "F16", as_f32(dtype, array).astype(np.float16)

    check_values(a.f16, want["param"], to_f16)

    # 4. --what ema: the EMA tensors under the parameter names, F32, and the
    # parameters without an EMA (the I64 step_count) as they are.
    ema_model = dict(want["ema"])
    ema_model.update({n: v for n, v in want["param"].items() if n not in want["ema"]})
    check(len(ema_model) == len(want["param"]), "EMA export model")
    check_values(a.ema, ema_model)

    # 5. Loaded the way transformers loads a sharded checkpoint (PyTorch).
    if torch is not None:
        index, shard_files = weight_files(a.sharded)
        state = {}
        for f in shard_files:
            state.update(torch_load_file(os.path.join(a.sharded, f)))
        check(sorted(state) == names, "torch: names differ")
        for name, (dtype, shape, array) in want["param"].items():
            t = state[name]
            check(list(t.shape) == shape, f"torch {name}: shape {list(t.shape)}")
            if dtype == "I64":
                same = np.array_equal(t.numpy(), array)
            else:
                same = np.array_equal(t.float().numpy(), as_f32(dtype, array))
            check(same, f"torch {name}: values differ")
        print(f"OK (with torch {torch.__version__})")
    else:
        print("OK (torch not installed: numpy and raw-byte checks only)")
    print(f"checked {len(names)} tensors in {n} shards, bf16, f16 and ema exports")


if __name__ == "__main__":
    main()
