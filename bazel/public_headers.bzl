"""public_headers: the headers of this repository that a target's compilation sees, as files (for tests and tools
that compile against the public header outside Bazel's own compile actions)."""

def _public_headers_impl(ctx):
    own = ctx.label.workspace_name
    headers = []
    for dep in ctx.attr.deps:
        for f in dep[CcInfo].compilation_context.headers.to_list():
            if f.owner != None and f.owner.workspace_name == own and f.is_source:
                headers.append(f)
    return [DefaultInfo(files = depset(headers), runfiles = ctx.runfiles(files = headers))]

public_headers = rule(
    implementation = _public_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
