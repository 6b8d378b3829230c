"""The CPU kernels' compiler flags: one list for the kernels and for the test that checks what they compile to."""

CPU_KERNEL_COPTS = [
    "-O3",
    # No FP traps are ever enabled: the vectoriser may then compute both sides of a select (the tanh).
    "-fno-trapping-math",
    # Nothing reads errno after a math function: without this, sqrt keeps the optimizer's loop scalar.
    "-fno-math-errno",
    # No fused multiply-adds the source did not write: the AVX-512 build (which has them) computes the bits of
    # the baseline's.
    "-ffp-contract=off",
]
