"""Tests under MPI: a cc_binary (usually a GoogleTest binary) as N ranks under mpirun (mpi_test, mpi_gtest), and
scripts that start MPI jobs themselves (mpi_script_test)."""

load("//bazel:script_test.bzl", "script_test")

def mpi_test(name, binary, ranks, args = [], tags = [], size = "small", **kwargs):
    native.sh_test(
        name = name,
        srcs = ["//bazel:mpi_run.sh"],
        args = [str(ranks), "$(location %s)" % binary] + args,
        data = [binary, "//bazel:mpi_env.sh"],
        tags = tags + ["mpi"],
        size = size,
        **kwargs
    )

def _rank_suffix(ranks):
    if ranks == "singleton":
        return ""
    if ranks == "gpus":
        return "_nccl_gpus"
    return "_1rank" if ranks == 1 else "_%dranks" % ranks

def _size(ranks, medium_from):
    if ranks == "gpus":
        return "medium"
    return "medium" if ranks != "singleton" and ranks >= medium_from else "small"

def mpi_gtest(name, srcs, deps, ranks = [1, 2, 4], medium_from = 4, tags = []):
    """A GoogleTest binary `<name>_bin` (bundled for the GPU machine) and one mpi_test per world size.

    `ranks` lists world sizes, "singleton" for a world of one without mpirun (target `<name>`); the others are
    `<name>_1rank`, `<name>_2ranks`, ... Worlds of `medium_from` ranks or more get size "medium". "gpus" is one
    rank per GPU of the node over NCCL (`<name>_nccl_gpus`, tagged `multigpu`; bazel/mpi_run.sh says why it
    skips on a node with fewer than two GPUs).
    """
    native.cc_binary(
        name = name + "_bin",
        testonly = True,
        srcs = srcs,
        tags = ["gpu_bundle"],
        deps = deps,
    )
    for r in ranks:
        mpi_test(
            name = name + _rank_suffix(r),
            binary = ":" + name + "_bin",
            ranks = r,
            size = _size(r, medium_from),
            tags = tags + (["multigpu", "exclusive"] if r == "gpus" else []),
        )

def mpi_script_test(name, inputs = [], data = [], srcs = None, tags = [], **kwargs):
    """A script_test (`<name>.sh` unless `srcs` says) that starts MPI jobs under //bazel:mpi_env.sh."""
    script_test(
        name = name,
        src = srcs[0] if srcs else name + ".sh",
        inputs = inputs,
        data = data + ["//bazel:mpi_env.sh"],
        tags = tags + ["mpi"],
        **kwargs
    )
