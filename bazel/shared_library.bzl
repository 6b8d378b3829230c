"""shared_library: every object of the deps (their whole archives) linked into one shared library, with the deps'
own link flags (system libraries, rpaths), for programs built outside Bazel.

cc_binary(linkshared = True) links only the archive members something in the binary calls, which for a library
that has no code of its own is almost nothing; this rule links them all, once, from the objects Bazel already
built for the static binaries."""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _shared_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    archives = []
    flags = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            flags.extend(linker_input.user_link_flags)
            for library in linker_input.libraries:
                archive = library.pic_static_library or library.static_library
                if archive != None and archive not in archives:
                    archives.append(archive)
    out = ctx.actions.declare_file(ctx.attr.library_name)
    args = ctx.actions.args()
    args.add_all(["-shared", "-o", out.path, "-Wl,-soname," + ctx.attr.library_name])
    args.add("-Wl,--whole-archive")
    args.add_all(archives)
    args.add("-Wl,--no-whole-archive")
    args.add_all(flags)
    args.add_all(ctx.fragments.cpp.linkopts)  # --linkopt of the build (a sanitizer's runtime, for one)
    args.add_all(["-lstdc++", "-lm"])
    ctx.actions.run(
        executable = cc_toolchain.compiler_executable,
        arguments = [args],
        inputs = depset(archives, transitive = [cc_toolchain.all_files]),
        outputs = [out],
        mnemonic = "SharedLibrary",
        progress_message = "Linking %s" % ctx.attr.library_name,
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

shared_library = rule(
    implementation = _shared_library_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "library_name": attr.string(mandatory = True),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)
