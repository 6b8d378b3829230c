// The runtime's public header: what a training loop of one's own needs (tensors, ops and autograd, modules,
// optimizers, the Session and DistributedDataParallel). Link the one public target (Bazel: //:ddp, or @ddp//:ddp
// from another workspace; CMake: find_package(ddp) and ddp::ddp; pkg-config: ddp); it carries every public
// header. The larger parts a program takes only when it uses them are included by name beside ddp.h, so that a
// program compiles what it uses (tests/api/public_header_test.sh holds ddp.h to 25 of the runtime's headers):
//   runtime/training/trainer.h           Trainer: a whole run over any Module (trainer_options.h: its options)
//   runtime/training/train_step.h        TrainStep: a loop of one's own's step, captured as a CUDA graph
//   runtime/training/training_checkpoint.h  saving and restoring model, optimizer and where the run stands
//   runtime/training/weights_file.h      a model's weights alone to and from PyTorch (safetensors state_dict)
//   runtime/models/model_description.h  build_model: a model from JSON
//   runtime/models/bf16_weights.h        bf16 training
//   runtime/data/*.h                     Fashion-MNIST/IDX (idx.h), .npy/safetensors arrays (array_file.h),
//                                        DistributedSampler (sampler.h), BatchLoader + to_device (loader.h),
//                                        ResidentDataset, HostBatches, EvaluationShard, ReplayBuffer
//   runtime/io/*.h                       checkpoint files, metrics (JSON lines), Chrome traces
//   runtime/core/graph.h                 CudaGraph: a stream's work captured and replayed
// Nothing reachable from any of them includes <mpi.h>, <nccl.h> or a CUDA header, nor the runtime's internals:
// the kernel layer (runtime/kernels/, the GEMM options among it), the allocator (runtime/core/allocator.h) and
// the World under the Session. Benchmarks and tests that need those include them by name.
//
//   ddp::Session session(&argc, &argv);                       // MPI, rank, GPU, stream, backend, process group
//   ddp::MLP model({784, 512, 10}, ddp::Activation::kRelu, /*seed=*/0, session.device());
//   ddp::DistributedDataParallel ddp_model(model, session);   // flattens, checks, broadcasts rank 0's weights
//   ddp::AdamW optimizer(model, {.lr = 1e-3});                // before or after DDP
//   for (...) {
//     model.zero_grad();
//     ddp_model.backward(ddp::ops::cross_entropy(model.forward(x), y));
//     optimizer.step();
//   }
//
// Streams: the calls a training program writes (Tensor's factories and copies, ops, forward, zero_grad, an
// optimizer's construction and step, to_device, EvaluationShard) take a `const Stream&` last that defaults to
// ddp::current_stream(), this thread's current stream: the session's stream on the thread that made the session,
// the CPU stream without one. Pass a stream to run on a second one of one's own, or make it current for a scope
// with ddp::StreamGuard.
//
// What ddp.h brings, and where each part is documented (every header opens with what it is for; each call says
// what it does, what it throws and on which stream it runs):
//   runtime/distributed/session.h        Session: set-up, default stream, host collectives (sum, mean, any);
//                                        job.h: DeviceRequest, CollectiveError, run_main
//   runtime/distributed/distributed_data_parallel.h   DistributedDataParallel, DdpOptions, no_sync()
//   runtime/distributed/process_group.h  collectives and point-to-point send/recv on device buffers (public
//                                        because Session::group() and DistributedDataParallel hand it out)
//   runtime/tensor/tensor.h              Tensor: creation, views, copies between devices, item()
//   runtime/ops/*.h                      ops with autograd: linear, activations, add/scale/mul, to_device, losses,
//                                        layer_norm, frequency_encoding, dropout, embedding, column slices
//   runtime/autograd/autograd.h          backward, NoGradGuard, recording ops of one's own
//   runtime/models/module.h, layers.h    Module, Linear, Sequential, MLP, LayerNorm, ResidualBlock,
//                                        FrequencyEncoding, Dropout, Embedding, ModuleList, CategoricalFeatures
//   runtime/optim/optimizer.h            Sgd, AdamW, LR schedules; runtime/optim/clip_grad.h
//   runtime/core/*.h                     errors, DType, Device, Stream/Event, current_stream and StreamGuard,
//                                        Activation, MathMode, phases (PhaseGuard), the graceful stop
//
// One of World and Session is public: the Session, the program's handle on the job. The World underneath it
// (MPI, the device binding, the NCCL communicator) is the runtime's own; Session::world() only declares it.
//
// Errors: InvalidArgument for a caller's bad input (the message says what to change), CollectiveError for a
// failure every rank agreed on, other ddp::Error kinds for library failures. ddp::run_main(body) reports any of
// them once and ends every rank.
#pragma once

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/distributed/distributed_data_parallel.h"
#include "runtime/distributed/session.h"
#include "runtime/models/layers.h"
#include "runtime/models/module.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/optimizer.h"
#include "runtime/tensor/tensor.h"
