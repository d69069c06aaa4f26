"""zcc_wheel: zcc's wheel, assembled from built files by assemble_wheel.py.

The output is a directory named after the target holding one file,
zcc-<version>-<tag>.whl: the version is read from the package's __init__.py
(__version__) when the action runs, and a rule's outputs must be named when
it is analysed, hence the directory.
"""

def _zcc_wheel_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.add("--out_dir", out.path)
    args.add("--tag", ctx.attr.tag)
    args.add("--license", ctx.file.license.path)
    prefix = ctx.attr.package_root + "/"
    for f in ctx.files.package:
        if not f.short_path.startswith(prefix):
            fail("%s is not under package_root %s" % (f.short_path, ctx.attr.package_root))
        args.add("--file", "%s=%s" % (f.short_path[len(prefix):], f.path))
    for f in ctx.files.programs:
        args.add("--program", f.path)
    ctx.actions.run(
        executable = ctx.executable._assemble,
        arguments = [args],
        inputs = ctx.files.package + ctx.files.programs + [ctx.file.license],
        outputs = [out],
        mnemonic = "ZccWheel",
        progress_message = "Assembling zcc's wheel %s" % out.short_path,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

zcc_wheel = rule(
    implementation = _zcc_wheel_impl,
    doc = "A directory holding zcc's wheel (see assemble_wheel.py for its contents).",
    attrs = {
        "license": attr.label(
            allow_single_file = True,
            mandatory = True,
            doc = "The license text, written into the wheel's dist-info.",
        ),
        "package": attr.label_list(
            allow_files = True,
            doc = "The Python package's files (.py and extension modules), placed at " +
                  "their paths below package_root.",
        ),
        "package_root": attr.string(
            default = "python",
            doc = "The workspace folder the package folder (zcc/) lies in.",
        ),
        "programs": attr.label_list(
            allow_files = True,
            doc = "Executables placed in zcc/bin/, each with a console command of its name.",
        ),
        "tag": attr.string(
            mandatory = True,
            doc = "The wheel's compatibility tag: python-abi-platform.",
        ),
        "_assemble": attr.label(
            default = ":assemble_wheel.py",
            allow_single_file = True,
            executable = True,
            cfg = "exec",
        ),
    },
)
