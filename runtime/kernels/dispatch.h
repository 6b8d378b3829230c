// One place that turns "run kernel F for a tensor on device D" into a call of ddp::kernels::cpu::F or
// ddp::kernels::cuda::F, with the CUDA device made current for the launch. Every tensor-level op and the
// tensor's own fills and copies go through it, so adding a device means touching this file only.
#pragma once

#include "runtime/kernels/kernels.h"
#include "runtime/core/device.h"

// DDP_DISPATCH(device, fn, args...): `args` are the kernel's arguments including the trailing stream handle.
#define DDP_DISPATCH(device, fn, ...)                           \
  do {                                                          \
    const ::ddp::Device& ddp_dispatch_device_ = (device);       \
    if (ddp_dispatch_device_.is_cuda()) {                       \
      ::ddp::CudaDeviceGuard ddp_dispatch_guard_(ddp_dispatch_device_); \
      ::ddp::kernels::cuda::fn(__VA_ARGS__);                    \
    } else {                                                    \
      ::ddp::kernels::cpu::fn(__VA_ARGS__);                     \
    }                                                           \
  } while (0)
