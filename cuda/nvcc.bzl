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

# What a cc_library linking nvcc objects needs.
CUDART_LINKOPTS = [
    "-L/usr/local/cuda/lib64",
    "-Wl,-rpath,/usr/local/cuda/lib64",
    "-lcudart",
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
        cmd = " ".join([NVCC] + NVCC_FLAGS + ["-c", "$(location %s)" % src, "-o", "$@"]),
        message = "Compiling %s with nvcc" % src,
        tags = ["manual"],
        testonly = testonly,
    )
