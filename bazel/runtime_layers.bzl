"""The runtime's libraries beneath training, in one list: runtime/training builds on every one of them, and the
public target //:ddp is they and training. A library added to the runtime is added here, once, for both."""

RUNTIME_BELOW_TRAINING = [
    "//runtime/autograd",
    "//runtime/core",
    "//runtime/data",
    "//runtime/distributed",
    "//runtime/io",
    "//runtime/models",
    "//runtime/models:bf16_weights",
    "//runtime/ops",
    "//runtime/optim",
    "//runtime/tensor",
]
