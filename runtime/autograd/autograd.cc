// The tape, the backward replay and the grad-ready bookkeeping.
#include "runtime/autograd/autograd.h"

#include <unordered_map>
#include <unordered_set>

#include "runtime/core/check.h"

namespace ddp::autograd {
namespace {

thread_local bool g_grad_enabled = true;

struct Tape {
  std::vector<Node> nodes;
};

Tape& tape() {
  thread_local Tape t;
  return t;
}

AutogradMeta* meta_of(const Tensor& t) { return t.has_autograd_meta() ? &t.autograd_meta() : nullptr; }

// The node backward() is running on this thread, and for every tensor whose gradient is not final yet the node
// after which it is.
struct RunningBackward {
  std::unordered_map<const AutogradMeta*, std::size_t>* final_at;
  std::size_t node;
};
thread_local RunningBackward* g_running = nullptr;

// Fires m's hooks when this node is the last to write its gradient, once.
void fire_if_final(AutogradMeta* m) {
  auto it = g_running->final_at->find(m);
  if (it == g_running->final_at->end() || it->second != g_running->node) return;
  g_running->final_at->erase(it);
  for (const auto& hook : m->grad_ready_hooks) hook();
}

}  // namespace

bool grad_enabled() { return g_grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

bool should_record(std::initializer_list<const Tensor*> tensors) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : tensors)
    if (t != nullptr && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(std::string name, std::vector<Tensor> inputs, std::vector<Tensor> outputs, BackwardFn backward) {
  Node node;
  node.name = std::move(name);
  for (Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) node.inputs.push_back(std::move(t));
  for (Tensor& t : outputs) {
    t.autograd_meta().requires_grad = true;
    node.outputs.push_back(std::move(t));
  }
  node.backward = std::move(backward);
  tape().nodes.push_back(std::move(node));
}

std::size_t tape_size() { return tape().nodes.size(); }
void clear_tape() { tape().nodes.clear(); }

GradTarget grad_target(const Tensor& t, const Stream& stream) {
  GradTarget target;
  if (!t.defined() || !t.requires_grad()) return target;
  AutogradMeta& m = t.autograd_meta();
  if (!m.grad) {
    Tensor g = Tensor::empty(t.shape(), t.dtype(), t.device(), stream);
    m.grad = g.impl();
    m.grad_valid = false;
  }
  target.grad = Tensor(m.grad);
  target.accumulate = m.grad_valid;
  m.grad_valid = true;  // the caller writes it now (stream order), so a second writer accumulates
  return target;
}

bool adopt_grad(const Tensor& t, const Tensor& g) {
  if (!t.defined() || !t.requires_grad()) return true;  // nothing wanted: trivially done
  AutogradMeta& m = t.autograd_meta();
  if (m.grad) return false;
  DDP_CHECK(g.shape() == t.shape() && g.dtype() == t.dtype(),
            "adopt_grad: gradient " + g.describe() + " for tensor " + t.describe());
  m.grad = g.impl();
  m.grad_valid = true;
  return true;
}

Tensor grad_of(const Tensor& output, const Stream& stream) {
  if (!output.has_autograd_meta()) return Tensor();
  AutogradMeta& m = output.autograd_meta();
  if (!m.grad_valid) return Tensor();
  if (!m.grad && m.grad_host_scalar) {
    m.grad = Tensor::full(output.shape(), *m.grad_host_scalar, output.dtype(), output.device(), stream).impl();
  }
  return m.grad ? Tensor(m.grad) : Tensor();
}

double scalar_grad_value(const Tensor& output, const Stream& stream) {
  const AutogradMeta& m = output.autograd_meta();
  if (m.grad_host_scalar) return *m.grad_host_scalar;
  Tensor g = grad_of(output, stream);
  DDP_CHECK(g.defined() && g.numel() == 1, "scalar_grad_value: no scalar gradient for " + output.describe());
  return static_cast<double>(g.to_vector<float>(stream)[0]);
}

void backward(const Tensor& loss, const Stream& stream) {
  DDP_CHECK(loss.defined() && loss.numel() == 1 && loss.dtype() == DType::kFloat32,
            "backward: the loss must be a float32 scalar, got " + loss.describe());
  DDP_CHECK(loss.requires_grad(), "backward: the loss " + loss.describe() +
                                      " does not require grad (computed under NoGradGuard, or from no parameter)");
  std::vector<Node> nodes = std::move(tape().nodes);
  tape().nodes.clear();

  // The seed, d loss / d loss = 1, as a host value: the loss ops read it so (no fill kernel in the step), and
  // grad_of makes the tensor for any other node.
  AutogradMeta& loss_meta = loss.autograd_meta();
  loss_meta.grad.reset();
  loss_meta.grad_valid = true;
  loss_meta.grad_host_scalar = 1.0;

  // Dry pass: which nodes run (some output gets a gradient), and for every tensor the earliest-recorded node
  // that writes its gradient — after that node its gradient is final.
  const std::size_t n = nodes.size();
  std::vector<bool> runs(n, false);
  std::unordered_set<const AutogradMeta*> reached{&loss_meta};
  std::unordered_map<const AutogradMeta*, std::size_t> final_at;
  bool loss_produced = false;
  for (std::size_t k = n; k-- > 0;) {
    for (const Tensor& out : nodes[k].outputs) {
      if (reached.count(meta_of(out)) != 0) runs[k] = true;
      if (out.same(loss) || meta_of(out) == &loss_meta) loss_produced = true;
    }
    if (!runs[k]) continue;
    for (const Tensor& in : nodes[k].inputs) {
      const AutogradMeta* m = meta_of(in);
      reached.insert(m);
      final_at[m] = k;
    }
  }
  DDP_CHECK(loss_produced, "backward: no recorded op produced the loss " + loss.describe() +
                               " (was backward already called for it?)");

  RunningBackward running{&final_at, 0};
  struct Reset {
    ~Reset() { g_running = nullptr; }
  } reset_running;
  for (std::size_t k = n; k-- > 0;) {
    if (!runs[k]) continue;
    Node& node = nodes[k];
    running.node = k;
    g_running = &running;
    node.backward(stream);
    // The outputs' gradients have been consumed: release those of intermediates (not of the loss' caller).
    for (const Tensor& out : node.outputs) {
      AutogradMeta& m = out.autograd_meta();
      if (&m != &loss_meta) {
        m.grad.reset();
        m.grad_valid = false;
        m.grad_host_scalar.reset();
      }
    }
    // The inputs whose gradients are final now, in input order.
    for (const Tensor& in : node.inputs) fire_if_final(&in.autograd_meta());
  }
  loss_meta.grad.reset();
  loss_meta.grad_valid = false;
  loss_meta.grad_host_scalar.reset();

  // Nodes of other graphs recorded since this graph began stay recorded, in order, for their own backward:
  // two models whose forwards interleave (a reference and its copy on another device) each keep their graph.
  // Anything recorded before this graph's first node belongs to a forward nobody differentiated: dropped, so
  // the tape cannot grow without bound.
  std::size_t first_run = n;
  for (std::size_t k = 0; k < n && first_run == n; ++k) {
    if (runs[k]) first_run = k;
  }
  std::vector<Node> kept;
  for (std::size_t k = first_run; k < n; ++k) {
    if (!runs[k]) kept.push_back(std::move(nodes[k]));
  }
  for (Node& node : tape().nodes) kept.push_back(std::move(node));
  tape().nodes = std::move(kept);
}

void zero_grad(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors)
    if (t.has_autograd_meta()) t.autograd_meta().grad_valid = false;
}

void use_zero_gradient(const Tensor& leaf, const Stream& stream) {
  Tensor grad = leaf.grad();
  DDP_CHECK(grad.defined(), "use_zero_gradient: " + leaf.describe() + " has no gradient storage");
  AutogradMeta& meta = leaf.autograd_meta();
  if (!meta.grad_valid) grad.zero_(stream);
  meta.grad_valid = true;
}

}  // namespace ddp::autograd
