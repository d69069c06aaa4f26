"""What zcc's plain-Python tests share: `raises`, stand-ins for other
libraries' arrays, the socket path of no zccd, and `run_tests`, which runs a
module's test_* functions in order and stops at the first failure."""

import sys
import time
import traceback

NO_DAEMON = "/tmp/zcc-no-such-dir/zccd.sock"


def raises(exc, fn, *args, match=None, **kwargs):
    """Calls fn(*args, **kwargs), which must raise `exc` (with `match` in its
    message, when given); returns the exception."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        if match is not None:
            assert match in str(e), "%r does not mention %r" % (str(e), match)
        return e
    raise AssertionError("%s did not raise %s" % (getattr(fn, "__name__", fn), exc.__name__))


class FakeCudaArray:
    """Device memory as CuPy/Numba describe it (the pointer is never read)."""

    def __init__(self, shape=(4,), typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (0x7F0000000000, False), "version": 3,
                                         "strides": None}


class FakeArray:
    def __init__(self, iface):
        self.__array_interface__ = iface


def run_tests(namespace, only=None):
    """Runs every test_* callable of `namespace` (a module's globals()) in
    definition order, or those named in `only` (default: the command line's
    arguments); prints one line per test and "N passed, M failed", and exits 1
    at the first failure."""
    tests = [(n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    only = sys.argv[1:] if only is None else only
    unknown = set(only) - {n for n, _ in tests}
    if unknown:
        print("no such test: %s" % ", ".join(sorted(unknown)))
        sys.exit(2)
    passed = 0
    for name, fn in tests:
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            fn()
        except BaseException:
            traceback.print_exc()
            print("FAILED %s" % name, flush=True)
            print("%d passed, 1 failed" % passed)
            sys.exit(1)
        passed += 1
        print("ok %s (%.2f s)" % (name, time.monotonic() - t0), flush=True)
    print("%d passed, 0 failed" % passed)
