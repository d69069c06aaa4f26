"""C++ messages and gRPC stubs of one .proto file, from Debian's protoc and
grpc_cpp_plugin (tools/setup.sh): native gRPC rules would need downloads."""

def grpc_cc_proto(name, src):
    """`name`: a cc_library of `src`'s <base>.pb.h/.cc and <base>.grpc.pb.h/.cc,
    included as "proto/<base>.pb.h"."""
    base = src[:-len(".proto")]
    genrule = name + "_gen"
    native.genrule(
        name = genrule,
        srcs = [src],
        outs = [base + ".pb.h", base + ".pb.cc", base + ".grpc.pb.h", base + ".grpc.pb.cc"],
        cmd = ("/usr/bin/protoc -I$$(dirname $(location {src})) " +
               "--cpp_out=$(@D) --grpc_out=$(@D) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(location {src})").format(src = src),
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        include_prefix = "proto",
        strip_include_prefix = "",
        deps = ["//third_party:grpc", "//third_party:protobuf"],
    )
