"""cuda_library: compiles .cu files with nvcc and exposes them as an ordinary cc_library.

nvcc runs in a Starlark action that sees the headers and include paths of the `deps` (their CcInfo), so a .cu
file includes project headers exactly as a .cc file does. Each source becomes a position-independent object for
sm_90 (H200) plus compute_90 PTX, which the cc_library links into any C++ target.
"""

_NVCC = "/usr/local/cuda/bin/nvcc"

_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def _cuda_objects_impl(ctx):
    compilation_contexts = [dep[CcInfo].compilation_context for dep in ctx.attr.deps if CcInfo in dep]
    headers = depset(
        ctx.files.hdrs,
        transitive = [c.headers for c in compilation_contexts],
    )
    include_flags = ["-I."]
    for c in compilation_contexts:
        for d in c.includes.to_list() + c.quote_includes.to_list() + c.system_includes.to_list():
            include_flags.append("-I" + d)
        for d in c.defines.to_list():
            include_flags.append("-D" + d)
    include_flags.append("-I" + ctx.bin_dir.path)

    outputs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_cuda_objs/%s/%s.pic.o" % (ctx.label.name, src.basename[:-len(".cu")]))
        outputs.append(out)
        args = ctx.actions.args()
        args.add_all(["-c", src.path, "-o", out.path])
        args.add_all(_GENCODE)
        args.add_all([
            "-std=c++17",
            "-O3",
            "-lineinfo",
            "--expt-relaxed-constexpr",
            "-Xcompiler=-fPIC",
            "-DOMPI_SKIP_MPICXX=1",
        ])
        args.add_all(include_flags)
        args.add_all(ctx.attr.copts)
        ctx.actions.run(
            executable = _NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [out],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
    return [DefaultInfo(files = depset(outputs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc; link it like any other cc_library."""
    _cuda_objects(
        name = name + "_cu_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:headers"],
        copts = copts,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cu_objects"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        alwayslink = True,
        linkstatic = True,
        visibility = visibility,
        **kwargs
    )
