"""c_program_test: a C program of these tests (over the C API) and the MPI script test that runs it, declared once.

Every C program here is built the same way and run by its own `<name>_test.sh` with the test harness, so the pair
is one call instead of two rules that must agree on the names."""

load("//bazel:mpi_test.bzl", "mpi_script_test")

def c_program_test(name, size, src = None, data = [], tags = []):
    """cc_binary `name` from `src` (`<name>.c` unless given) over //capi:ddp_c, tagged `tags`, and mpi_script_test
    `<name>_test` running `<name>_test.sh` on it, with //tests:test_harness.sh and `data` beside it."""
    native.cc_binary(
        name = name,
        srcs = [src or name + ".c"],
        tags = tags,
        deps = ["//capi:ddp_c"],
    )
    mpi_script_test(
        name = name + "_test",
        size = size,
        inputs = [":" + name],
        data = data + ["//tests:test_harness.sh"],
    )
