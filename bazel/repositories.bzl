"""ddp_dependencies(): the ONE list of external repositories the runtime's BUILD files name.

Why a macro: the runtime's targets reference @rules_cc, @cuda, @mpi, @system, ... and a workspace that depends on
the runtime (local_repository(name = "ddp", ...)) must declare those same repositories itself, since Bazel 4
resolves every @name in the main WORKSPACE. The runtime's own WORKSPACE and any consumer's call this macro, so
the list cannot drift.

    local_repository(name = "ddp", path = "/path/to/ddp")
    load("@ddp//bazel:repositories.bzl", "ddp_dependencies")
    ddp_dependencies(ddp_path = "/path/to/ddp")

`ddp_path` is the runtime checkout as seen from the calling workspace (absolute, or relative to that
workspace's root): local_repository paths are resolved against the MAIN workspace, not against this file, so
the stubs in bazel/repos need it. The BUILD files in third_party/ are named by Label(), which resolves against
the repository this .bzl lives in (@ddp from a consumer, the main repository from the runtime itself).
"""

def ddp_dependencies(ddp_path = "."):
    """Declares every repository the runtime needs; each one is a local path (nothing is downloaded)."""
    root = ddp_path.rstrip("/") or "/"

    # Debian's bazel-rules-cc is too new for Bazel 4.2.3, so @rules_cc re-exports the native rules.
    native.local_repository(
        name = "rules_cc",
        path = root + "/bazel/repos/rules_cc",
    )

    # `bazel test` asks for this repository even when coverage is off; empty filegroups satisfy it.
    native.local_repository(
        name = "remote_coverage_tools",
        path = root + "/bazel/repos/remote_coverage_tools",
    )

    native.local_repository(
        name = "rules_java",
        path = "/usr/share/bazel/rules/java",
    )

    native.local_repository(
        name = "platforms",
        path = "/usr/share/bazel/tools/platforms",
    )

    native.local_repository(
        name = "bazel_skylib",
        path = "/usr/share/bazel/tools/skylib",
    )

    # System libraries, each through a BUILD file of ours in third_party/. build_file takes a label string.
    native.new_local_repository(
        name = "cuda",
        build_file = str(Label("//third_party:cuda.BUILD")),
        path = "/usr/local/cuda",
    )

    native.new_local_repository(
        name = "mpi",
        build_file = str(Label("//third_party:mpi.BUILD")),
        path = "/usr/lib/x86_64-linux-gnu/openmpi",
    )

    native.new_local_repository(
        name = "system",
        build_file = str(Label("//third_party:system.BUILD")),
        path = "/usr",
    )
