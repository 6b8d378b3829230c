// Tape-based reverse-mode automatic differentiation.
//
// Why a tape: an MLP's graph is a straight line recorded in forward order, so replaying the recorded nodes in
// reverse is the whole engine — no graph objects, no topological sort. Each op (runtime/ops/*.h) records one Node: the
// tensors whose gradients it writes (`inputs`), the ones whose gradients it reads (`outputs`) and a closure.
//
// Rules:
//   * backward(loss, stream) seeds d(loss)/d(loss) = 1, runs every node whose output received a gradient, in
//     reverse recording order, on `stream`, then clears the tape (activations are released).
//   * Gradients of leaves (tensors with requires_grad that no node produced, i.e. parameters) accumulate
//     across backward calls until zeroed (ParameterStore::zero_grad or zero_grad below). Gradients of
//     intermediate tensors are released as soon as the node that consumed them has run.
//   * A node writes a gradient through grad_target(): the first writer of a backward overwrites (no zero fill
//     needed), later writers accumulate — exactly the kernels' `accumulate` flag.
//   * Grad-ready hooks: a tensor's hooks fire on the calling thread right after the last node that contributes
//     to its gradient has run (its earliest-recorded consumer), in the order gradients become final. For an
//     MLP that is the last layer's weight and bias first. The DDP reducer launches bucket all-reduces from them.
//     The hooks fire after the node's kernels are *enqueued* on `stream`; device-side consumers must order after
//     `stream` (record an event on it), which is what the reducer does.
//   * NoGradGuard: ops record nothing (evaluation).
//   * Views of tensors that require grad are not tracked: parameters are used whole.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::autograd {

using BackwardFn = std::function<void(const Stream& stream)>;

struct Node {
  std::string name;             // the op, for error messages ("linear", "cross_entropy")
  std::vector<Tensor> inputs;   // tensors (requiring grad) whose gradients this node writes
  std::vector<Tensor> outputs;  // tensors whose gradients it reads
  BackwardFn backward;
};

// ---- Grad mode ----
bool grad_enabled();
// Disables recording on this thread for the guard's lifetime (nests).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// ---- Recording (for op implementations) ----
// True when grad mode is on and at least one of `tensors` requires grad: the op should record a node.
bool should_record(std::initializer_list<const Tensor*> tensors);
// Appends a node to this thread's tape; marks every output as requiring grad. `inputs` that do not require
// grad are dropped (the closure must check grad_target(...).grad.defined() for optional inputs).
void record(std::string name, std::vector<Tensor> inputs, std::vector<Tensor> outputs, BackwardFn backward);
std::size_t tape_size();
// Drops the recorded nodes without running them (e.g. after an exception in the middle of forward).
void clear_tape();

// ---- Inside a backward closure ----
struct GradTarget {
  Tensor grad;             // undefined when the tensor does not require grad (skip that gradient)
  bool accumulate = false; // add into `grad` instead of overwriting it
};
// Where to write `t`'s gradient; allocates it on first use. The caller must write it on `stream`.
GradTarget grad_target(const Tensor& t, const Stream& stream);
// Makes `g` (freshly computed, same shape) `t`'s gradient without a copy when `t` has none yet; returns false
// (and does nothing) when `t` already has gradient storage, in which case the caller accumulates.
bool adopt_grad(const Tensor& t, const Tensor& g);
// The gradient flowing into an output of this node (undefined if none reached it). The loss's own gradient, the
// constant 1 that loss nodes take as a host value (scalar_grad_value), is made on `stream` only when asked for here.
Tensor grad_of(const Tensor& output, const Stream& stream);
// The scale of a scalar output's gradient as a host value: free when it is the loss (1.0), otherwise a
// read-back that synchronises `stream` (a loss used inside a larger expression; rare).
double scalar_grad_value(const Tensor& output, const Stream& stream);

// ---- Running ----
// `loss` must be a float32 tensor of one element that some recorded node produced.
void backward(const Tensor& loss, const Stream& stream = current_stream());

// Zeroes leaf gradients lazily: their contents count as zero and the next backward overwrites them.
void zero_grad(const std::vector<Tensor>& tensors);

// Makes a leaf's gradient an explicit, current zero for this backward (a parameter no loss term reached, which a
// reducer must still average): contents that only counted as zero are zeroed on `stream`.
void use_zero_gradient(const Tensor& leaf, const Stream& stream);

}  // namespace ddp::autograd
