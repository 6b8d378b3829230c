"""script_test: a test script (shell or Python) given the paths of the programs and files it runs or reads."""

def script_test(name, src, inputs = [], data = [], args_before = [], size = "small", **kwargs):
    """The test `name` runs `src` with `args_before`, then the path of each of `inputs` in order, as arguments.

    `data` lists files the script needs without being told their paths (a sourced helper).
    """
    native.sh_test(
        name = name,
        size = size,
        srcs = [src],
        args = args_before + ["$(location %s)" % i for i in inputs],
        data = inputs + data,
        **kwargs
    )
