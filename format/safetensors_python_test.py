"""Reads the file written by write_sample_safetensors with the reference
safetensors implementation and checks every tensor exactly.

Usage: safetensors_python_test.py FILE
"""

import json
import struct
import sys

import numpy as np
import safetensors
from safetensors import safe_open

# Keep in sync with write_sample_safetensors.cc.
EXPECTED = {
    "model.embed/weight": ("F32", [2, 3], np.array([[0.0, 1.5, -2.25], [1024.0, 0.125, -7.0]],
                                                   dtype=np.float32)),
    "optimizer/state.0.step": ("I64", [3], np.array([1 << 40, -1, 42], dtype=np.int64)),
    "global.step": ("I64", [], np.array(1000, dtype=np.int64)),
    "extra/rng.state": ("U8", [5], np.array([0, 1, 127, 128, 255], dtype=np.uint8)),
}
# numpy has no bfloat16: checked through its raw bytes and bit patterns.
BF16_NAME = "model.layers.0/attn.bias"
BF16_BITS = [0x3F80, 0xC000, 0x3F00, 0x4040]
BF16_VALUES = [1.0, -2.0, 0.5, 3.0]
METADATA = {"format": "pt", "zcc.step": "1000"}
ALIGN = 4096


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def bf16_to_f32(raw):
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def main(path):
    all_names = set(EXPECTED) | {BF16_NAME}

    # 1. safe_open parses and validates the header (offsets, sizes, coverage).
    with safe_open(path, framework="np") as f:
        check(set(f.keys()) == all_names, f"keys {sorted(f.keys())} != {sorted(all_names)}")
        check(f.metadata() == METADATA, f"metadata {f.metadata()} != {METADATA}")
        for name, (dtype, shape, want) in EXPECTED.items():
            got = f.get_tensor(name)
            check(got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}")
            check(list(got.shape) == shape, f"{name}: shape {list(got.shape)} != {shape}")
            check(np.array_equal(got, want), f"{name}: values {got} != {want}")
            s = f.get_slice(name)
            check(s.get_dtype() == dtype, f"{name}: slice dtype {s.get_dtype()} != {dtype}")
        s = f.get_slice(BF16_NAME)
        check(s.get_dtype() == "BF16", f"{BF16_NAME}: dtype {s.get_dtype()}")
        check(list(s.get_shape()) == [4], f"{BF16_NAME}: shape {s.get_shape()}")

    # 2. deserialize hands back every tensor's raw bytes, bf16 included.
    with open(path, "rb") as fh:
        content = fh.read()
    views = dict(safetensors.deserialize(content))
    check(set(views) == all_names, f"deserialize keys {sorted(views)}")
    for name, (dtype, shape, want) in EXPECTED.items():
        v = views[name]
        check(v["dtype"] == dtype and list(v["shape"]) == shape, f"{name}: {v['dtype']} {v['shape']}")
        check(bytes(v["data"]) == want.astype(want.dtype.newbyteorder("<")).tobytes(),
              f"{name}: raw bytes differ")
    v = views[BF16_NAME]
    check(v["dtype"] == "BF16" and list(v["shape"]) == [4], f"{BF16_NAME}: {v['dtype']} {v['shape']}")
    check(bytes(v["data"]) == struct.pack("<4H", *BF16_BITS), f"{BF16_NAME}: raw bytes differ")
    check(bf16_to_f32(bytes(v["data"])).tolist() == BF16_VALUES, f"{BF16_NAME}: values differ")

    # 3. The layout itself: aligned data section, space padding, offsets.
    (n,) = struct.unpack("<Q", content[:8])
    check((8 + n) % ALIGN == 0, f"data section starts at {8 + n}, not a multiple of {ALIGN}")
    text = content[8:8 + n].decode("utf-8")
    check(text.startswith("{"), "header does not start with '{'")
    header, json_end = json.JSONDecoder().raw_decode(text)
    check(text[json_end:] == " " * (n - json_end), "header padding is not all spaces")
    check(header.pop("__metadata__") == METADATA, "raw metadata differs")
    bf16 = header[BF16_NAME]
    check(bf16 == {"dtype": "BF16", "shape": [4], "data_offsets": bf16["data_offsets"]},
          f"{BF16_NAME}: raw entry {bf16}")
    begin, end = bf16["data_offsets"]
    raw = content[8 + n + begin:8 + n + end]
    check(bf16_to_f32(raw).tolist() == BF16_VALUES, f"{BF16_NAME}: values from the file differ")
    ends = sorted(e for _, e in (t["data_offsets"] for t in header.values()))
    check(ends[-1] == len(content) - 8 - n, "tensors do not end at the end of the file")

    print(f"OK: {len(all_names)} tensors read back from {path}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
