"""unit_tests: one GoogleTest binary per file of a test folder, each a cc_test named after its file."""

def unit_tests(tests, deps, size = "small", data = [], tags = []):
    """A cc_test `t` from `t.cc` for each name in `tests`, all with the same `deps` (GoogleTest's main added)."""
    for test in tests:
        native.cc_test(
            name = test,
            size = size,
            srcs = [test + ".cc"],
            data = data,
            tags = tags,
            deps = deps + ["@system//:gtest_main"],
        )
