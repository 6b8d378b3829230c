// The runtime's public header: include this and depend on //:ddp.
//
//   ddp::World world(&argc, &argv);                                    // MPI, rank, GPU binding, NCCL
//   ddp::Stream stream = ddp::Stream::create(world.device());
//   ddp::MLP model({784, 1024, 1024, 10}, ddp::kernels::Activation::kRelu, seed, world.device(), stream);
//   auto group = ddp::make_process_group(world, world.device(), ddp::default_backend(world.device()));
//   ddp::DistributedDataParallel ddp(model.flatten_parameters(stream), *group, world, stream);
//   ddp::Sgd optimizer(*model.parameter_store(), {.lr = 0.1, .momentum = 0.9}, stream);
//   for (...) { model.zero_grad(stream); ddp.backward(ddp::ops::cross_entropy(model.forward(x, stream), y, stream)); optimizer.step(stream); }
#pragma once

#include "models/bf16_weights.h"
#include "models/layers.h"
#include "models/module.h"
#include "runtime/kernels/cuda/gemm_options.h"
#include "ops/ops.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/parameter_store.h"
#include "runtime/core/check.h"
#include "runtime/core/device.h"
#include "runtime/core/graph.h"
#include "runtime/core/phase.h"
#include "runtime/core/stream.h"
#include "runtime/data/idx.h"
#include "runtime/data/loader.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/distributed/comm_check.h"
#include "runtime/distributed/distributed_data_parallel.h"
#include "runtime/distributed/nccl_communicator.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/world.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/metrics.h"
#include "runtime/io/trace.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/optimizer.h"
#include "runtime/tensor/tensor.h"
