"""mpi_test: runs a cc_binary (usually a GoogleTest binary) as N MPI ranks under mpirun, as a bazel test."""

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
