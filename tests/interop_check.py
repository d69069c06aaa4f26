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


def trainer_bytes(rank, tensor_index, step, n):
    """The test trainer's Fill(): xorshift64 over a seed, one byte per step."""
    mask = (1 << 64) - 1
    seed = ((rank << 48) ^ (tensor_index << 32) ^ step) & mask
    x = (seed * 0x9E3779B97F4A7C15 + 1) & mask
    out = bytearray(n)
    for i in range(n):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        out[i] = (x >> 24) & 0xFF
    return bytes(out)


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
        # The trainer registers, per rank: (weight i, optimizer state i) pairs, then the RNG blob.
        order = [t["name"] for t in manifest["tensors"]]
        registered = []
        for t in manifest["tensors"]:
            if t["kind"] == "param":
                i = int(t["name"].split(".")[2])
                registered.append((t["name"], 2 * i))
            elif t["kind"] == "optim":
                i = int(t["name"].split(".")[2])
                registered.append((t["name"], 2 * i + 1))
            else:
                registered.append((t["name"], len(order) - 1))
        model_file = "model-r%05d.safetensors" % rank
        # Parameters are F32: the numpy loader reads the whole shard.
        params = load_file(os.path.join(step_dir, model_file))
        for name, idx in registered:
            t = next(m for m in manifest["tensors"] if m["name"] == name)
            expected = trainer_bytes(rank, idx, step, t["nbytes"])
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
