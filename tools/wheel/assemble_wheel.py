#!/usr/bin/env python3
"""Writes zcc's wheel (the binary distribution format of PEP 427) from built files.

    assemble_wheel.py --out_dir DIR --tag cp311-cp311-linux_x86_64 \\
        --license LICENSE --file zcc/__init__.py=SRC ... --program SRC ...

writes DIR/zcc-<version>-<tag>.whl holding
    zcc/...                   each --file at its path (the package; _zcc*.so included)
    zcc/bin/<name>            each --program, executable
    zcc-<version>.dist-info/  METADATA, WHEEL, entry_points.txt (a console command
                              per program: zcc.programs:<name>), LICENSE, RECORD
The version is __version__ in zcc/__init__.py. Python's zipfile only: no build
backend. Entries are sorted and dated 1980-01-01, so equal inputs give equal bytes.
"""

import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

NAME = "zcc"
SUMMARY = "Zero-cost checkpointing for training jobs: the zcc client, zcc.torch and zccd"
# Each wheel's tag names the one CPython its _zcc.so is built for
# (tools/build_wheel.sh builds one per CPython); the Python code runs on these.
REQUIRES_PYTHON = ">=3.10"
LICENSE = "Apache-2.0"
CLASSIFIERS = [
    "Development Status :: 3 - Alpha",
    "Intended Audience :: Science/Research",
    "License :: OSI Approved :: Apache Software License",
    "Operating System :: POSIX :: Linux",
    "Programming Language :: C++",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3.10",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
]
REQUIRES = ["numpy", "safetensors"]
# zcc.torch; `import zcc` needs no torch. The integrations' lower bounds are
# the versions their tests run (tools/requirements-torch.txt).
EXTRAS = {
    "torch": ["torch>=2.6"],
    "hf": ["torch>=2.6", "transformers>=5.23"],               # zcc.hf
    "accelerate": ["torch>=2.6", "accelerate>=1.15"],         # zcc.accelerate
    "lightning": ["torch>=2.6", "lightning>=2.6"],            # zcc.lightning
    "paddle": ["paddlepaddle>=3.0"],                          # zcc.paddle
    "paddleformers": ["paddlepaddle>=3.0", "paddleformers>=1.2"],  # zcc.paddleformers
}
DESCRIPTION = """\
zcc takes checkpoints of a training job without stalling it: the trainer enqueues
copies of its tensors into shared-memory staging slots, and a per-node daemon, zccd,
writes them as safetensors shards, commits them atomically and restores them.

This wheel holds the Python client (`zcc`, `zcc.torch`, and `zcc.hf`, `zcc.accelerate`,
`zcc.lightning` for Hugging Face's Trainer, Accelerate and Lightning; `zcc.paddle`, and
`zcc.paddleformers` for PaddleFormers' Trainer) and the programs
`zccd` and `zccctl` (console commands of the same names). Its manylinux form carries
the shared libraries it needs (gRPC, Protobuf, Abseil, libcurl and theirs) in
`zcc.libs/`, so nothing but the C and C++ runtimes must be installed where it runs.

    pip install 'zcc[torch]'          # extras: torch, hf, accelerate, lightning, paddle, paddleformers
    zccd --root ~/zcc-ckpt &

```python
from zcc.torch import Checkpointer
ckpt = Checkpointer(model, optimizer, job_id="my-run", save_every=100)
start = (ckpt.restore() or 0) + 1
for step in range(start, steps + 1):
    ...  # forward, backward, optimizer.step()
    ckpt.step(step)
```
"""
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def fail(message):
    sys.exit("assemble_wheel.py: " + message)


def read_version(package_files):
    init = package_files.get(NAME + "/__init__.py")
    if init is None:
        fail("no %s/__init__.py among the --file arguments" % NAME)
    with open(init, encoding="utf-8") as f:
        found = re.findall(r'^__version__ = "([^"]+)"$', f.read(), re.MULTILINE)
    if len(found) != 1:
        fail('%s must set __version__ = "X.Y.Z" once (found %d)' % (init, len(found)))
    if not re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9.]+)?", found[0]):
        fail("__version__ %r in %s is not a PEP 440 version" % (found[0], init))
    return found[0]


def metadata(version):
    lines = ["Metadata-Version: 2.1", "Name: " + NAME, "Version: " + version,
             "Summary: " + SUMMARY, "License: " + LICENSE]
    lines += ["Classifier: " + c for c in CLASSIFIERS]
    lines.append("Requires-Python: " + REQUIRES_PYTHON)
    lines += ["Requires-Dist: " + r for r in REQUIRES]
    for extra, requires in sorted(EXTRAS.items()):
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (r, extra) for r in requires]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + DESCRIPTION


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


class WheelWriter:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.records = []

    def add(self, arcname, data, executable=False):
        info = zipfile.ZipInfo(arcname, ZIP_DATE)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (0o100755 if executable else 0o100644) << 16
        self.zip.writestr(info, data)
        self.records.append("%s,%s,%d" % (arcname, record_hash(data), len(data)))

    def close(self, record_name):
        self.records.append(record_name + ",,")
        info = zipfile.ZipInfo(record_name, ZIP_DATE)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o100644 << 16
        self.zip.writestr(info, "\n".join(self.records) + "\n")
        self.zip.close()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out_dir", required=True)
    p.add_argument("--tag", required=True, help="python-abi-platform, e.g. cp311-cp311-linux_x86_64")
    p.add_argument("--license", required=True, help="the license text, written into dist-info")
    p.add_argument("--file", action="append", default=[], help="ARCNAME=SOURCE, ARCNAME under zcc/")
    p.add_argument("--program", action="append", default=[], help="an executable for zcc/bin/")
    args = p.parse_args(argv)

    if not re.fullmatch(r"[a-z0-9_.]+-[a-z0-9_.]+-[a-z0-9_.]+", args.tag):
        fail("--tag %r is not python-abi-platform" % args.tag)
    package = {}
    for spec in args.file:
        arcname, sep, source = spec.partition("=")
        if not sep or not arcname.startswith(NAME + "/") or ".." in arcname.split("/"):
            fail("--file %r: expected %s/PATH=SOURCE" % (spec, NAME))
        if arcname in package:
            fail("%s given twice" % arcname)
        package[arcname] = source
    for source in args.program:
        arcname = "%s/bin/%s" % (NAME, os.path.basename(source))
        if arcname in package:
            fail("%s given twice" % arcname)
        package[arcname] = source
    programs = sorted(os.path.basename(s) for s in args.program)

    version = read_version(package)
    dist_info = "%s-%s.dist-info" % (NAME, version)
    os.makedirs(args.out_dir, exist_ok=True)
    wheel_path = os.path.join(args.out_dir, "%s-%s-%s.whl" % (NAME, version, args.tag))
    wheel = WheelWriter(wheel_path)
    for arcname in sorted(package):
        with open(package[arcname], "rb") as f:
            data = f.read()
        wheel.add(arcname, data, executable=arcname.startswith(NAME + "/bin/"))
    wheel.add(dist_info + "/METADATA", metadata(version).encode())
    wheel.add(dist_info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: zcc tools/wheel/assemble_wheel.py\n"
                                     "Root-Is-Purelib: false\nTag: %s\n" % args.tag).encode())
    entry_points = "[console_scripts]\n" + "".join(
        "%s = %s.programs:%s\n" % (name, NAME, name) for name in programs)
    wheel.add(dist_info + "/entry_points.txt", entry_points.encode())
    wheel.add(dist_info + "/top_level.txt", (NAME + "\n").encode())
    with open(args.license, "rb") as f:
        wheel.add(dist_info + "/LICENSE", f.read())
    wheel.close(dist_info + "/RECORD")
    print("wrote %s (%d bytes)" % (wheel_path, os.path.getsize(wheel_path)))


if __name__ == "__main__":
    main(sys.argv[1:])
