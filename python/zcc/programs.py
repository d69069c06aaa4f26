"""The zccd and zccctl programs that zcc's wheel carries in ``zcc/bin/``.

``pip install`` puts two console commands, ``zccd`` and ``zccctl``, into the
environment's ``bin/``; each runs :func:`zccd` or :func:`zccctl` here, which
replaces the Python process with the bundled program (``os.execv``), passing
the arguments on unchanged. :func:`path` says where a program is expected.

Run from a source tree (``python/`` on ``PYTHONPATH``) there is no ``bin/``:
the programs are then Bazel's (``bazel-bin/daemon/zccd``,
``bazel-bin/tools/zccctl``), and these commands say so.
"""

import os
import sys

PROGRAMS = {"zccd": "//daemon:zccd", "zccctl": "//tools:zccctl"}


def path(name):
    """Where the installed package keeps program `name` ("zccd" or "zccctl")."""
    if name not in PROGRAMS:
        raise ValueError("zcc has no program %r (it has %s)" % (name, ", ".join(sorted(PROGRAMS))))
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)


def run(name, argv=None):
    """Replaces this process with program `name`, given `argv` (default:
    this process's arguments). Returns 127 only if the program is missing."""
    binary = path(name)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not os.access(binary, os.X_OK):
        why = "is not executable" if os.path.exists(binary) else "is missing"
        sys.stderr.write(
            "%s: the zcc package's program %s %s. It is part of zcc's wheel "
            "(tools/build_wheel.sh); this zcc (%s) was not installed from one, or the "
            "installation is damaged (reinstall the wheel). In a source tree, build it "
            "with bazel build %s.\n"
            % (name, binary, why, os.path.dirname(os.path.dirname(binary)), PROGRAMS[name]))
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [name] + argv)
    return 127  # not reached: execv replaces the process or raises OSError


def zccd():
    """The ``zccd`` console command."""
    return run("zccd")


def zccctl():
    """The ``zccctl`` console command."""
    return run("zccctl")
