// Tensor: a cheap, shared handle to a contiguous, row-major block of one dtype on one device.
//
// Why this shape: the runtime needs exactly what an MLP and a DDP reducer need, and no more. Storage is shared
// and reference counted, so views (reshape, row slices, flat slices) cost nothing and parameters can be views
// into one flat buffer. Every tensor is contiguous: a view is (storage, element offset, shape). Device memory
// comes from the caching allocator, host memory from the aligned CPU allocator or, for results of
// device-to-host copies, from pinned memory so the copy is truly asynchronous.
//
// A Tensor handle points at a shared TensorImpl: copying a Tensor aliases it (as a Python reference does), and
// set_data() re-points every handle at once, which is how a Module's parameters move into a flat buffer.
//
// Work on device tensors is enqueued on the Stream passed in (by default this thread's current stream, the
// session's: runtime/core/stream.h) and is complete only when that stream is; the CPU stream is the calling
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/stream.h"

namespace ddp {

// One allocation. Freed into the allocator it came from when the last tensor using it goes away; device
// blocks are then reusable on their allocation stream at once and elsewhere after record_stream streams finish.
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(std::size_t bytes, const Device& device, const Stream& stream);
  // Page-locked host memory (ordinary host memory when no GPU exists), ordered on `stream`.
  static std::shared_ptr<Storage> allocate_pinned(std::size_t bytes, const Stream& stream);
  // `bytes` at `data` on `device`, owned by the caller: never freed here (Tensor::from_blob states the rules).
  static std::shared_ptr<Storage> borrow(void* data, std::size_t bytes, const Device& device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  bool pinned() const { return pinned_; }
  // The memory is also used by work on `stream`; its reuse waits for that work.
  void record_stream(const Stream& stream);

 private:
  Storage() = default;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_ = Device::cpu();
  bool pinned_ = false;
  bool borrowed_ = false;
};

class Tensor;

// Autograd state of a tensor (see runtime/autograd/autograd.h, which owns the rules).
struct AutogradMeta {
  bool requires_grad = false;
  // The gradient tensor. For parameters of a ParameterStore it is a fixed view into the flat gradient buffer;
  // otherwise it is allocated by the first backward node that writes it.
  std::shared_ptr<struct TensorImpl> grad;
  // False: `grad`'s contents count as zero, so the next writer overwrites instead of accumulating.
  bool grad_valid = false;
  // Index into the parameter list when the tensor is a registered parameter, else -1.
  std::int64_t parameter_index = -1;
  // Called on the backward thread as soon as this tensor's gradient is final within a backward.
  std::vector<std::function<void()>> grad_ready_hooks;
  // Set by backward() for the loss: its gradient is this host constant (1.0), so loss nodes need no read-back.
  std::optional<double> grad_host_scalar;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::kFloat32;
  std::shared_ptr<AutogradMeta> autograd;
};

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- Creation ----
  static Tensor empty(const Shape& shape, DType dtype, const Device& device, const Stream& stream = current_stream());
  static Tensor zeros(const Shape& shape, DType dtype, const Device& device, const Stream& stream = current_stream());
  static Tensor full(const Shape& shape, double value, DType dtype, const Device& device,
                     const Stream& stream = current_stream());
  // Seeded random float32 (or bfloat16, rounded from float32) tensors, the same values on every device:
  // element i is drawn from counter (seed, offset + i).
  static Tensor uniform(const Shape& shape, float low, float high, std::uint64_t seed, std::uint64_t offset,
                        const Device& device, const Stream& stream = current_stream(), DType dtype = DType::kFloat32);
  static Tensor normal(const Shape& shape, float mean, float stddev, std::uint64_t seed, std::uint64_t offset,
                       const Device& device, const Stream& stream = current_stream(), DType dtype = DType::kFloat32);
  // From host values (copied before returning; the device copy is enqueued on `stream`).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, const Device& device,
                            const Stream& stream = current_stream());
  static Tensor from_int32(const std::vector<std::int32_t>& values, const Shape& shape, const Device& device,
                            const Stream& stream = current_stream());
  // From `shape`'s number of `dtype` elements at `data` in host memory, which may be reused as soon as this
  // returns (a GPU copy goes through pinned staging and is enqueued on `stream`).
  static Tensor from_host(const void* data, const Shape& shape, DType dtype, const Device& device,
                          const Stream& stream = current_stream());

  // A tensor over `shape`'s number of `dtype` elements at `data`, memory the caller owns on `device` (host memory
  // for the CPU, device memory of that GPU), without a copy: ops read it, and write it where they write their
  // input (an in-place op, an optimizer step). The caller keeps ownership and must keep the memory valid, and
  // not write it, until every tensor over it is gone and the work enqueued on it has completed (synchronise the
  // stream it was used on). Throws InvalidArgument for a null `data` with elements or a dtype tensors cannot hold.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, const Device& device);
  // ---- Properties ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t size(std::int64_t d) const;
  std::int64_t numel() const { return shape_numel(shape()); }
  DType dtype() const;
  Device device() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  std::int64_t storage_offset() const;  // elements
  const std::shared_ptr<Storage>& storage() const;
  void* data_ptr() const;
  template <typename T>
  T* data() const;  // checks that T matches the dtype
  std::string describe() const;  // "float32 [64, 784] on cuda:0"
  bool same(const Tensor& other) const { return impl_ == other.impl_; }
  bool shares_storage_with(const Tensor& other) const;

  // ---- Views (no copy; share storage) ----
  Tensor view(const Shape& shape) const;  // one dimension may be -1
  Tensor slice_rows(std::int64_t begin, std::int64_t end) const;  // rows [begin, end) of dimension 0
  Tensor flat_slice(std::int64_t offset, const Shape& shape) const;  // shape.numel elements from `offset`
  Tensor flatten() const { return view({numel()}); }

  // ---- Copies and fills (asynchronous on `stream` for device tensors) ----
  // A new tensor on `device`. Host -> device goes through pinned staging (or directly from pinned memory);
  // device -> host lands in pinned memory and is valid after `stream` synchronises.
  Tensor copy_to(const Device& device, const Stream& stream = current_stream()) const;
  // Copies `src` (same shape numel and dtype, any device) into this tensor's memory. Into pageable host memory
  // from a device it synchronises `stream` (the bytes must be in place on return).
  void copy_from(const Tensor& src, const Stream& stream = current_stream());
  Tensor clone(const Stream& stream = current_stream()) const { return copy_to(device(), stream); }
  // float32 <-> bfloat16 (round to nearest even), a new tensor on the same device.
  Tensor to_dtype(DType dtype, const Stream& stream = current_stream()) const;
  void fill_(double value, const Stream& stream = current_stream());
  void zero_(const Stream& stream = current_stream()) { fill_(0.0, stream); }
  // In place on `stream`, float32: this *= factor, and this += other (same shape and device). Autograd does not
  // see them: they are for buffers (gradients, data, state), not for tensors a recorded op still needs.
  void scale_(double factor, const Stream& stream = current_stream());
  void add_(const Tensor& other, const Stream& stream = current_stream());
  void uniform_(float low, float high, std::uint64_t seed, std::uint64_t offset,
                const Stream& stream = current_stream());
  void normal_(float mean, float stddev, std::uint64_t seed, std::uint64_t offset,
               const Stream& stream = current_stream());
  // Host copy of the values; synchronises `stream`. For tests, logging and checkpoints.
  template <typename T>
  std::vector<T> to_vector(const Stream& stream = current_stream()) const;
  // The value of a one-element tensor (a loss, a count) as a double, read back to the host: synchronises
  // `stream` when the tensor is on a GPU. InvalidArgument for any other number of elements.
  double item(const Stream& stream = current_stream()) const;
  // Marks the memory as used by `stream` (see Storage::record_stream).
  void record_stream(const Stream& stream) const;

  // ---- Autograd ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);
  // The gradient (undefined until a backward wrote it, or until set_grad).
  Tensor grad() const;
  // Makes `grad` (same shape, device) this tensor's gradient storage, e.g. a view of a flat gradient buffer.
  void set_grad(const Tensor& grad);
  // Whether grad()'s contents are current (false after zero_grad: they count as zero).
  bool grad_valid() const;
  // Re-points every handle of this tensor at `other`'s memory (same shape and dtype); keeps autograd state.
  void set_data(const Tensor& other);
  // Adds a hook called during backward, right after this tensor's gradient is final for that backward.
  void register_grad_ready_hook(std::function<void()> hook);
  AutogradMeta& autograd_meta() const;  // created on first use
  bool has_autograd_meta() const { return impl_ && impl_->autograd; }
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  const TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace ddp
