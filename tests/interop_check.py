"""Loads a committed zcc checkpoint with the `safetensors` package alone and
checks every tensor against the bytes the test trainer generated.

usage: interop_check.py STEP_DIR WORLD_SIZE STEP
"""
import json
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


MASK = (1 << 64) - 1


def fnv1a(name):
    h = 1469598103934665603
    for c in name.encode():
        h ^= c
        h = (h * 1099511628211) & MASK
    return h


def tensor_bytes(name, kind, dtype, step, n):
    """tests/test_model.cc's FillTensor: xorshift64 seeded by (name, step)."""
    x = (fnv1a(name) ^ ((step * 0x9E3779B97F4A7C15) & MASK)) | 1
    def nxt():
        nonlocal x
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        return x
    if dtype == "F32" and kind == "param":
        vals = np.array([np.float32(nxt() >> 40) * np.float32(1.0 / 8388608.0) - np.float32(1.0)
                         for _ in range(n // 4)], dtype=np.float32)
        return vals.tobytes()
    return bytes((nxt() >> 24) & 0xFF for _ in range(n))


def main():
    step_dir, world, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    assert index["metadata"]["total_size"] > 0, index["metadata"]
    checked = 0
    for rank in range(world):
        with open(os.path.join(step_dir, "r%05d.manifest.json" % rank)) as f:
            manifest = json.load(f)
        model_file = "model-r%05d.safetensors" % rank
        # Parameters are F32: the numpy loader reads the whole shard.
        params = load_file(os.path.join(step_dir, model_file))
        for t in manifest["tensors"]:
            name = t["name"]
            expected = tensor_bytes(name, t["kind"], t["dtype"], step, t["nbytes"])
            if t["kind"] == "param":
                assert weight_map[name] == model_file, (name, weight_map.get(name))
                arr = params[name]
                assert arr.dtype == np.float32 and list(arr.shape) == t["shape"], (arr.dtype, arr.shape)
                assert arr.tobytes() == expected, "param %s differs" % name
            else:
                # BF16 has no numpy dtype: check the header with safe_open and the
                # bytes through the header's own offsets.
                path = os.path.join(step_dir, t["file"])
                with safe_open(path, framework="numpy") as f:
                    assert name in f.keys(), name
                    meta = f.metadata()
                    assert meta["zcc.step"] == str(step), meta
                with open(path, "rb") as raw:
                    n = int.from_bytes(raw.read(8), "little")
                    header = json.loads(raw.read(n))
                    begin, end = header[name]["data_offsets"]
                    assert header[name]["dtype"] == t["dtype"], header[name]
                    raw.seek(8 + n + begin)
                    assert raw.read(end - begin) == expected, "%s differs" % name
            checked += 1
    print("interop: %d tensors from %d ranks match" % (checked, world))


if __name__ == "__main__":
    main()
