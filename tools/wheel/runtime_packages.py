#!/usr/bin/env python3
"""The Debian packages whose shared libraries zcc's ELF files load at run time.

    runtime_packages.py [--expect tools/wheel/runtime_packages.txt] FILE...

For each FILE (the wheel's _zcc*.so, zccd, zccctl): its direct shared libraries
(readelf -d, NEEDED), where the dynamic loader finds each on this machine (ldd),
and the Debian package that installed it (dpkg-query -S). Prints every package
with the libraries it gives, then the libraries no package holds (the CUDA
runtime of a build made where nvcc is installed: /usr/local/cuda/lib64).
Exits 1 if a library is not found at all, or, with --expect, if a package is
missing from that list or a library outside packages is not the CUDA runtime.
"""

import argparse
import collections
import os
import re
import subprocess
import sys

# Libraries allowed outside Debian's packages: the CUDA runtime, which a
# CUDA build (tools/bazel_flags.sh picks it where nvcc is installed) links.
NON_DEBIAN_ALLOWED = re.compile(r"libcudart\.so\.\d+$")


def needed(path):
    out = subprocess.run(["readelf", "-d", "--wide", path], check=True, capture_output=True,
                         text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def resolved(path):
    """{soname: path or None} as the dynamic loader finds them for `path`."""
    out = subprocess.run(["ldd", path], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            found[m.group(1)] = m.group(3)
        m = re.match(r"\s*(/\S+) \(0x[0-9a-f]+\)", line)  # the dynamic loader itself
        if m:
            found[os.path.basename(m.group(1))] = m.group(1)
    return found


def candidates(path):
    """The names dpkg may know `path` by: its package's (/lib or /usr/lib, the
    link or its target)."""
    names = [path, os.path.realpath(path)]
    for p in list(names):
        if p.startswith("/usr/lib/"):
            names.append(p[len("/usr"):])
        elif p.startswith("/lib/"):
            names.append("/usr" + p)
    return names


def owners(paths):
    """{path: the Debian package that installed it, or None}, one dpkg-query."""
    names = sorted({n for path in paths for n in candidates(path)})
    out = subprocess.run(["dpkg-query", "-S"] + names, capture_output=True, text=True).stdout
    package_of = {}
    for line in out.splitlines():
        package, _, file = line.partition(": ")
        if "," not in package:  # not a diversion or a folder of several packages
            package_of[file] = package.split(":")[0]  # without the architecture
    return {path: next((package_of[n] for n in candidates(path) if n in package_of), None)
            for path in paths}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--expect", help="the package list (one a line, # comments) to check against")
    p.add_argument("files", nargs="+")
    args = p.parse_args(argv)

    libraries = {}  # soname -> path
    errors = []
    for f in args.files:
        where = resolved(f)
        for lib in needed(f):
            if where.get(lib) is None:
                errors.append("%s needs %s, which the dynamic loader does not find" % (f, lib))
            else:
                libraries[lib] = where[lib]
    package_of = owners(set(libraries.values()))
    packages = collections.defaultdict(set)
    outside = {}
    for lib, path in libraries.items():
        if package_of[path] is None:
            outside[lib] = path
        else:
            packages[package_of[path]].add(lib)
    for package in sorted(packages):
        libs = sorted(packages[package])
        shown = ", ".join(libs[:3]) + (", ... (%d in all)" % len(libs) if len(libs) > 3 else "")
        print("%-20s %s" % (package, shown))
    for lib, path in sorted(outside.items()):
        print("%-20s %s (not from a Debian package)" % (path, lib))

    if args.expect:
        with open(args.expect) as f:
            expected = {line.split("#")[0].strip() for line in f} - {""}
        for package in sorted(set(packages) - expected):
            errors.append("package %s is not listed in %s" % (package, args.expect))
        for lib, path in sorted(outside.items()):
            if not NON_DEBIAN_ALLOWED.match(lib):
                errors.append("%s (%s) is in no Debian package" % (lib, path))
    for e in errors:
        print("ERROR: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
