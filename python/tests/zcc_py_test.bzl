"""zcc_py_test: a Python test of the zcc package, run by run_python.sh.

The runner picks the PyTorch 2.x environment tools/setup.sh makes, puts
the built package and the zccd fixture on PYTHONPATH and points $ZCCD at the
built daemon; every test gets those as data.
"""

def zcc_py_test(name, script, data = [], size = "medium", args = [], framework = "torch"):
    """A test that runs `script` (a path in the workspace) with run_python.sh.

    Args:
      name: the test.
      script: the .py file, as a label in the calling package.
      data: further files the script reads (other modules it imports).
      size: the test size.
      args: arguments after the script's path.
      framework: "torch" (the PyTorch environment), "paddle" (Paddle's) or
        "paddleformers" (PaddleFormers' stack).
    """
    if framework not in ("torch", "paddle", "paddleformers"):
        fail("framework must be torch, paddle or paddleformers, not %s" % framework)
    native.sh_test(
        name = name,
        size = size,
        srcs = ["//python/tests:run_python.sh"],
        args = ([] if framework == "torch" else ["--" + framework]) +
               ["%s/%s" % (native.package_name(), script)] + args,
        data = [
            script,
            "//daemon:zccd",
            "//python/tests:zccd_process",
            "//python/tests:zcc_testing",
            "//python/zcc",
        ] + data,
    )
