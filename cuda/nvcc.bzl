"""nvcc_object: compiles one .cu file into an object a cc_library can link.

Every nvcc option of the project is here. The object is position-independent
(-fPIC), since tests link cc_libraries into shared objects. The genrule is
tagged manual so that `bazel build //cuda/...` with --config=nocuda (where no
cc_library selects it) never needs nvcc.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++17",
    "-O2",
    "-Xcompiler",
    "-fPIC",
    "-Xcompiler",
    "-Wall,-Wno-sign-compare",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
    # PTX too, so that newer GPUs can JIT-compile the kernels.
    "-gencode",
    "arch=compute_90,code=compute_90",
    # Sources by their workspace path ("cuda/cuda_status.h"); generated files.
    "-I.",
    "-I$(GENDIR)",
]

# Host-code instrumentation matching .bazelrc's --config=asan / --config=tsan
# (each sets --define=sanitizer=...), so nvcc-compiled host code is checked
# as the rest is; under TSan this also makes zcc::Mutex's annotations
# (common/mutex.h) reach the CUDA copier.
SANITIZER_NVCC_FLAGS = select({
    # -Xcompiler splits its argument at commas: one flag each.
    "//cuda:sanitizer_asan": " -Xcompiler -fsanitize=address -Xcompiler -fsanitize=undefined" +
                             " -Xcompiler -fno-sanitize-recover=undefined -Xcompiler -fno-omit-frame-pointer",
    "//cuda:sanitizer_tsan": " -Xcompiler -fsanitize=thread",
    "//conditions:default": "",
})

# The headers an nvcc-compiled trainer program (a GPU benchmark or check that
# links the client and drives a real zccd) sees through client/client.h and
# the bench harness.
TRAINER_PROGRAM_NVCC_HDRS = [
    "//bench:harness.h",
    "//client:client.h",
    "//common:collective.h",
    "//copy:device_copier.h",
    "//cuda:ipc_pull_copier.h",
    "//format:dtype.h",
    "//format:tensor_kind.h",
    "//shm:pull_channel.h",
]

# What a cc_library linking nvcc objects needs.
CUDART_LINKOPTS = [
    "-L/usr/local/cuda/lib64",
    "-Wl,-rpath,/usr/local/cuda/lib64",
    "-lcudart",
]

# The static runtime, for binaries that must start where libcudart is not
# installed (zccd): it loads libcuda itself when CUDA is first used.
CUDART_STATIC_LINKOPTS = [
    "-L/usr/local/cuda/lib64",
    "-lcudart_static",
    "-ldl",
    "-lrt",
    "-pthread",
]

def nvcc_object(name, src, hdrs = [], testonly = False):
    """Declares `name`, a genrule compiling `src` with nvcc into `name`.o.

    Args:
      name: the target, and the object file's base name.
      src: the .cu file.
      hdrs: every header `src` includes from the workspace (the sandbox holds
        only declared inputs; system headers such as Abseil's are found in
        /usr/include as usual).
      testonly: for objects only tests may link.
    """
    native.genrule(
        name = name,
        srcs = [src] + hdrs,
        outs = [name + ".o"],
        # A temporary directory of its own: nvcc names its temporary files
        # after its pid, and sandboxed compiles in PID namespaces share pids
        # (two at once collided in /tmp: "cannot open source file").
        cmd = "export TMPDIR=$$(mktemp -d /tmp/zcc-nvcc.XXXXXX) && " +
              " ".join([NVCC] + NVCC_FLAGS + ["-c", "$(location %s)" % src, "-o", "$@"]) +
              SANITIZER_NVCC_FLAGS + "; rc=$$?; rm -rf \"$$TMPDIR\"; exit $$rc",
        message = "Compiling %s with nvcc" % src,
        tags = ["manual"],
        testonly = testonly,
    )

def cuda_cc_test(name, srcs, deps = [], **kwargs):
    """A cc_test of code that nvcc compiles.

    In a build without nvcc (--config=nocuda) Bazel reports it as skipped
    (its target is incompatible there), never as passed.
    """
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps,
        target_compatible_with = select({
            "//cuda:cuda_off": ["//cuda:never"],
            "//conditions:default": [],
        }),
        **kwargs
    )

def cuda_runtime_library(name, srcs, hdrs, deps = [], cuda_deps = [], stub_srcs = None,
                         real_extra_srcs = [], fake_extra_deps = [], linkopts = CUDART_LINKOPTS,
                         **kwargs):
    """A library over the CUDA runtime, and its twin over the fake one.

    Declares `name`: `srcs` (nvcc objects, or sources calling the runtime)
    linked against the real runtime (`linkopts`), or, in a build without nvcc
    (--config=nocuda), `stub_srcs` (its stand-in; None: `srcs` themselves,
    code that only calls other libraries of this macro). And declares
    `name + "_on_fake_cudart"`: the very same `srcs` over the fake runtime
    (cuda/fake_cudart), for tests without a GPU. `cuda_deps` are libraries of
    this macro: each of the two depends on the same twin of them.
    `real_extra_srcs` go into `name` alone, `fake_extra_deps` into the twin alone.
    """
    real_deps = cuda_deps if stub_srcs == None else select({
        "//cuda:cuda_off": [],
        "//conditions:default": cuda_deps,
    })
    native.cc_library(
        name = name,
        srcs = srcs + real_extra_srcs if stub_srcs == None else select({
            "//cuda:cuda_off": stub_srcs,
            "//conditions:default": srcs + real_extra_srcs,
        }),
        hdrs = hdrs,
        linkopts = select({
            "//cuda:cuda_off": [],
            "//conditions:default": linkopts,
        }),
        deps = deps + real_deps,
        **kwargs
    )
    fake_kwargs = dict(kwargs)
    fake_kwargs.pop("tags", None)
    fake_kwargs.pop("visibility", None)
    native.cc_library(
        name = name + "_on_fake_cudart",
        testonly = True,
        srcs = srcs,
        hdrs = hdrs,
        tags = ["manual"],
        deps = deps + [d + "_on_fake_cudart" for d in cuda_deps] + fake_extra_deps +
               ["//cuda/fake_cudart"],
        **fake_kwargs
    )
