#!/usr/bin/env python3
"""The synchronous-save reference of bench/e2e: what users do today.

Started by e2e_bench with the trainer's state (a memfd inherited as --fd, of
--size bytes) and its layout (--layout: one line per tensor, "name dtype
offset nbytes dim..."). It maps the state read-only and builds numpy views of
every tensor once (no copy), says "ready", then serves lines on stdin:

  save PATH PREVIOUS   safetensors.numpy.save_file(views, PATH), then
                       os.fsync(PATH); then removes PREVIOUS ("-" = none);
                       answers "ok SECONDS"
  remove PATH          removes PATH; answers "ok"

numpy has no bfloat16, so BF16 tensors are handed over as uint16 views: the
same bytes, labelled U16 in the header (safetensors.torch.save_file goes
through the same serialize_file path with a BF16 label).
"""
import argparse
import mmap
import os
import sys
import time

import numpy as np
from safetensors.numpy import save_file
import safetensors

DTYPES = {
    "BF16": np.uint16,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,
    "I8": np.int8,
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--layout", required=True)
    a = p.parse_args()
    mm = mmap.mmap(a.fd, a.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    views = {}
    with open(a.layout) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            name, dtype, offset, nbytes = parts[0], parts[1], int(parts[2]), int(parts[3])
            shape = tuple(int(d) for d in parts[4:])
            np_dtype = DTYPES[dtype]
            count = nbytes // np.dtype(np_dtype).itemsize
            views[name] = np.frombuffer(mm, dtype=np_dtype, count=count, offset=offset).reshape(shape)
    print(f"ready safetensors {safetensors.__version__} numpy {np.__version__} "
          f"{len(views)} tensors", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "save":
            path, previous = parts[1], parts[2]
            start = time.perf_counter()
            save_file(views, path, metadata={"format": "pt"})
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            if previous != "-":
                os.unlink(previous)
            print(f"ok {time.perf_counter() - start:.6f}", flush=True)
        elif parts[0] == "remove":
            try:
                os.unlink(parts[1])
            except FileNotFoundError:
                pass
            print("ok", flush=True)
        else:
            print(f"error unknown command {parts[0]}", flush=True)


if __name__ == "__main__":
    main()
