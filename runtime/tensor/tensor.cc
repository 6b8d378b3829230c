// Tensor storage, views, copies between devices (through pinned staging) and fills through the kernel contract.
#include "runtime/tensor/tensor.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "runtime/kernels/dispatch.h"
#include "runtime/core/allocator.h"
#include "runtime/core/check.h"
#include "runtime/core/graph.h"

namespace ddp {

// ---- Storage ----

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes, const Device& device, const Stream& stream) {
  std::shared_ptr<Storage> s(new Storage());
  s->bytes_ = bytes;
  s->device_ = device;
  if (device.is_cuda()) {
    DDP_CHECK(stream.device() == device, "allocating " + std::to_string(bytes) + " bytes on " + device.str() +
                                             " needs a stream of that device, got one of " +
                                             stream.device().str());
    s->data_ = cuda_allocator(device.index).allocate(bytes, stream.handle());
  } else {
    s->data_ = cpu_allocator().allocate(bytes);
  }
  return s;
}

std::shared_ptr<Storage> Storage::allocate_pinned(std::size_t bytes, const Stream& stream) {
  std::shared_ptr<Storage> s(new Storage());
  s->bytes_ = bytes;
  s->pinned_ = true;
  s->data_ = pinned_allocator().allocate(bytes, stream.handle());
  return s;
}

std::shared_ptr<Storage> Storage::borrow(void* data, std::size_t bytes, const Device& device) {
  std::shared_ptr<Storage> s(new Storage());
  s->bytes_ = bytes;
  s->device_ = device;
  s->data_ = data;
  s->borrowed_ = true;
  return s;
}

Storage::~Storage() {
  if (data_ == nullptr || borrowed_) return;
  try {
    if (pinned_) {
      pinned_allocator().free(data_);
    } else if (device_.is_cuda()) {
      cuda_allocator(device_.index).free(data_);
    } else {
      cpu_allocator().free(data_, bytes_);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: freeing a tensor's storage failed: %s\n", e.what());
  }
}

void Storage::record_stream(const Stream& stream) {
  if (data_ == nullptr || borrowed_ || stream.handle() == nullptr) return;
  if (pinned_) {
    pinned_allocator().record_stream(data_, stream.handle());
  } else if (device_.is_cuda()) {
    cuda_allocator(device_.index).record_stream(data_, stream.handle());
  }
}

// ---- Tensor: creation ----

Tensor Tensor::empty(const Shape& shape, DType dtype, const Device& device, const Stream& stream) {
  for (std::int64_t d : shape) DDP_CHECK(d >= 0, "Tensor::empty: negative dimension in shape " + shape_str(shape));
  DDP_CHECK(is_compute_dtype(dtype), std::string("Tensor::empty: tensors hold float32, bfloat16, int32 or int64, not ") +
                                         dtype_name(dtype) + " (a type of files only)");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = Storage::allocate(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype), device, stream);
  return Tensor(std::move(impl));
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, const Device& device) {
  for (std::int64_t d : shape) DDP_CHECK(d >= 0, "Tensor::from_blob: negative dimension in shape " + shape_str(shape));
  DDP_CHECK(is_compute_dtype(dtype), std::string("Tensor::from_blob: tensors hold float32, bfloat16, int32 or int64, "
                                                 "not ") + dtype_name(dtype));
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  DDP_CHECK(data != nullptr || bytes == 0, "Tensor::from_blob: null data for a tensor of shape " + shape_str(shape) +
                                               ": pass the address of the caller's array");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = Storage::borrow(data, bytes, device);
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const Device& device, const Stream& stream) {
  return full(shape, 0.0, dtype, device, stream);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, const Device& device, const Stream& stream) {
  Tensor t = empty(shape, dtype, device, stream);
  t.fill_(value, stream);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, float low, float high, std::uint64_t seed, std::uint64_t offset,
                       const Device& device, const Stream& stream, DType dtype) {
  Tensor t = empty(shape, dtype, device, stream);
  t.uniform_(low, high, seed, offset, stream);
  return t;
}

Tensor Tensor::normal(const Shape& shape, float mean, float stddev, std::uint64_t seed, std::uint64_t offset,
                      const Device& device, const Stream& stream, DType dtype) {
  Tensor t = empty(shape, dtype, device, stream);
  t.normal_(mean, stddev, seed, offset, stream);
  return t;
}

Tensor Tensor::from_host(const void* data, const Shape& shape, DType dtype, const Device& device,
                         const Stream& stream) {
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (device.is_cpu()) {
    Tensor t = empty(shape, dtype, Device::cpu(), cpu_stream());
    if (bytes > 0) std::memcpy(t.data_ptr(), data, bytes);
    return t;
  }
  // Into pinned memory first, so the copy to the device is asynchronous and the caller's memory free at once.
  auto staging = std::make_shared<TensorImpl>();
  staging->shape = shape;
  staging->dtype = dtype;
  staging->storage = Storage::allocate_pinned(bytes, stream);
  if (bytes > 0) std::memcpy(staging->storage->data(), data, bytes);
  Tensor out = empty(shape, dtype, device, stream);
  out.copy_from(Tensor(std::move(staging)), stream);
  return out;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, const Device& device,
                           const Stream& stream) {
  DDP_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape),
            "Tensor::from_vector: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  return from_host(values.data(), shape, DType::kFloat32, device, stream);
}

Tensor Tensor::from_int32(const std::vector<std::int32_t>& values, const Shape& shape, const Device& device,
                           const Stream& stream) {
  DDP_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape),
            "Tensor::from_vector: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  return from_host(values.data(), shape, DType::kInt32, device, stream);
}

// ---- Tensor: properties ----

const TensorImpl& Tensor::checked() const {
  DDP_CHECK(impl_ != nullptr, "use of an undefined tensor");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const { return checked().storage->device(); }
std::int64_t Tensor::storage_offset() const { return checked().offset; }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked().storage; }

std::int64_t Tensor::size(std::int64_t d) const {
  const Shape& s = shape();
  if (d < 0) d += static_cast<std::int64_t>(s.size());
  DDP_CHECK(d >= 0 && d < static_cast<std::int64_t>(s.size()),
            "Tensor::size: dimension " + std::to_string(d) + " of a tensor of shape " + shape_str(s));
  return s[static_cast<std::size_t>(d)];
}

void* Tensor::data_ptr() const {
  const TensorImpl& t = checked();
  if (t.storage->data() == nullptr) return nullptr;
  return static_cast<char*>(t.storage->data()) + static_cast<std::size_t>(t.offset) * dtype_size(t.dtype);
}

namespace {
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <>
constexpr DType dtype_of<std::uint16_t>() { return DType::kBFloat16; }
template <>
constexpr DType dtype_of<std::int32_t>() { return DType::kInt32; }
template <>
constexpr DType dtype_of<std::int64_t>() { return DType::kInt64; }
}  // namespace

template <typename T>
T* Tensor::data() const {
  DDP_CHECK(dtype() == dtype_of<T>(), std::string("Tensor::data: tensor is ") + dtype_name(dtype()) +
                                          ", accessed as " + dtype_name(dtype_of<T>()));
  return static_cast<T*>(data_ptr());
}
template float* Tensor::data<float>() const;
template std::uint16_t* Tensor::data<std::uint16_t>() const;
template std::int32_t* Tensor::data<std::int32_t>() const;
template std::int64_t* Tensor::data<std::int64_t>() const;

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype())) + " " + shape_str(shape()) + " on " + device().str();
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

// ---- Views ----

namespace {
Tensor make_view(const TensorImpl& base, std::int64_t offset, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage;
  impl->offset = base.offset + offset;
  impl->shape = shape;
  impl->dtype = base.dtype;
  return Tensor(std::move(impl));
}
}  // namespace

Tensor Tensor::view(const Shape& new_shape) const {
  const TensorImpl& t = checked();
  Shape s = new_shape;
  std::int64_t known = 1;
  int inferred = -1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DDP_CHECK(inferred < 0, "Tensor::view: more than one -1 in " + shape_str(new_shape));
      inferred = static_cast<int>(i);
    } else {
      DDP_CHECK(s[i] >= 0, "Tensor::view: bad shape " + shape_str(new_shape));
      known *= s[i];
    }
  }
  const std::int64_t n = shape_numel(t.shape);
  if (inferred >= 0) {
    DDP_CHECK(known > 0 && n % known == 0,
              "Tensor::view: cannot view " + describe() + " as " + shape_str(new_shape));
    s[static_cast<std::size_t>(inferred)] = n / known;
  }
  DDP_CHECK(shape_numel(s) == n, "Tensor::view: cannot view " + describe() + " (" + std::to_string(n) +
                                     " elements) as " + shape_str(new_shape));
  return make_view(t, 0, s);
}

Tensor Tensor::slice_rows(std::int64_t begin, std::int64_t end) const {
  const TensorImpl& t = checked();
  DDP_CHECK(!t.shape.empty(), "Tensor::slice_rows: a scalar has no rows");
  const std::int64_t rows = t.shape[0];
  DDP_CHECK(0 <= begin && begin <= end && end <= rows,
            "Tensor::slice_rows: rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + describe());
  Shape s = t.shape;
  s[0] = end - begin;
  const std::int64_t row_elems = rows == 0 ? 0 : shape_numel(t.shape) / rows;
  return make_view(t, begin * row_elems, s);
}

Tensor Tensor::flat_slice(std::int64_t offset, const Shape& shape) const {
  const TensorImpl& t = checked();
  const std::int64_t n = shape_numel(shape);
  DDP_CHECK(offset >= 0 && offset + n <= shape_numel(t.shape),
            "Tensor::flat_slice: " + std::to_string(n) + " elements at offset " + std::to_string(offset) + " of " +
                describe());
  return make_view(t, offset, shape);
}

// ---- Copies ----

Tensor Tensor::copy_to(const Device& device, const Stream& stream) const {
  const TensorImpl& t = checked();
  Tensor out;
  if (device.is_cpu() && this->device().is_cuda()) {
    auto impl = std::make_shared<TensorImpl>();
    impl->shape = t.shape;
    impl->dtype = t.dtype;
    impl->storage = Storage::allocate_pinned(nbytes(), stream);
    out = Tensor(std::move(impl));
  } else {
    out = empty(t.shape, t.dtype, device, device.is_cuda() ? stream : cpu_stream());
  }
  out.copy_from(*this, stream);
  return out;
}

void Tensor::copy_from(const Tensor& src, const Stream& stream) {
  DDP_CHECK(src.numel() == numel() && src.dtype() == dtype(),
            "Tensor::copy_from: source " + src.describe() + " does not match destination " + describe());
  const std::size_t n = nbytes();
  if (n == 0) return;
  const Device from = src.device(), to = device();
  void* dst_ptr = data_ptr();
  const void* src_ptr = src.data_ptr();
  if (from.is_cpu() && to.is_cpu()) {
    if (dst_ptr != src_ptr) std::memcpy(dst_ptr, src_ptr, n);
    return;
  }
  DDP_CHECK(stream.device().is_cuda(), "Tensor::copy_from " + src.describe() + " -> " + describe() +
                                           " needs a CUDA stream, got the CPU stream");
  CudaDeviceGuard guard(stream.device());
  cudaStream_t s = stream.handle();
  if (from.is_cpu()) {  // host -> device
    if (src.storage()->pinned()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(dst_ptr, src_ptr, n, cudaMemcpyHostToDevice, s));
      src.storage()->record_stream(stream);
    } else {
      CachingAllocator& pinned = pinned_allocator();
      void* staging = pinned.allocate(n, s);
      std::memcpy(staging, src_ptr, n);
      DDP_CUDA_CHECK(cudaMemcpyAsync(dst_ptr, staging, n, cudaMemcpyHostToDevice, s));
      pinned.free(staging);  // reused only after the copy has read it
    }
  } else if (to.is_cpu()) {  // device -> host
    if (storage()->pinned()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(dst_ptr, src_ptr, n, cudaMemcpyDeviceToHost, s));
      storage()->record_stream(stream);
    } else {
      CachingAllocator& pinned = pinned_allocator();
      void* staging = pinned.allocate(n, s);
      DDP_CUDA_CHECK(cudaMemcpyAsync(staging, src_ptr, n, cudaMemcpyDeviceToHost, s));
      DDP_CUDA_CHECK(cudaStreamSynchronize(s));
      std::memcpy(dst_ptr, staging, n);
      pinned.free(staging);
    }
  } else if (from == to) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst_ptr, src_ptr, n, cudaMemcpyDeviceToDevice, s));
  } else {
    DDP_CUDA_CHECK(cudaMemcpyPeerAsync(dst_ptr, to.index, src_ptr, from.index, n, s));
  }
}

Tensor Tensor::to_dtype(DType target, const Stream& stream) const {
  if (target == dtype()) return clone(stream);
  Tensor out = empty(shape(), target, device(), stream);
  DDP_DISPATCH(device(), cast, dtype(), data_ptr(), target, out.data_ptr(), numel(), stream.handle());
  return out;
}

void Tensor::fill_(double value, const Stream& stream) {
  DDP_DISPATCH(device(), fill, dtype(), data_ptr(), numel(), value, stream.handle());
}

void Tensor::scale_(double factor, const Stream& stream) {
  DDP_CHECK(dtype() == DType::kFloat32, "Tensor::scale_: needs a float32 tensor, got " + describe());
  DDP_DISPATCH(device(), scale, data<float>(), numel(), static_cast<float>(factor), stream.handle());
}

void Tensor::add_(const Tensor& other, const Stream& stream) {
  DDP_CHECK(dtype() == DType::kFloat32 && other.dtype() == DType::kFloat32 && other.shape() == shape() &&
                other.device() == device(),
            "Tensor::add_: adds a float32 tensor of the same shape on the same device, got " + other.describe() +
                " into " + describe());
  DDP_DISPATCH(device(), axpby, other.data<float>(), data<float>(), numel(), 1.0f, 1.0f, stream.handle());
}

void Tensor::uniform_(float low, float high, std::uint64_t seed, std::uint64_t offset, const Stream& stream) {
  if (dtype() == DType::kFloat32) {
    DDP_DISPATCH(device(), uniform, data<float>(), numel(), low, high, seed, offset, stream.handle());
    return;
  }
  DDP_CHECK(dtype() == DType::kBFloat16, std::string("uniform_: needs a float tensor, got ") + describe());
  Tensor f = uniform(shape(), low, high, seed, offset, device(), stream);
  DDP_DISPATCH(device(), cast, DType::kFloat32, f.data_ptr(), dtype(), data_ptr(), numel(), stream.handle());
}

void Tensor::normal_(float mean, float stddev, std::uint64_t seed, std::uint64_t offset, const Stream& stream) {
  if (dtype() == DType::kFloat32) {
    DDP_DISPATCH(device(), normal, data<float>(), numel(), mean, stddev, seed, offset, stream.handle());
    return;
  }
  DDP_CHECK(dtype() == DType::kBFloat16, std::string("normal_: needs a float tensor, got ") + describe());
  Tensor f = normal(shape(), mean, stddev, seed, offset, device(), stream);
  DDP_DISPATCH(device(), cast, DType::kFloat32, f.data_ptr(), dtype(), data_ptr(), numel(), stream.handle());
}

template <typename T>
std::vector<T> Tensor::to_vector(const Stream& stream) const {
  DDP_CHECK(dtype() == dtype_of<T>(), std::string("Tensor::to_vector: tensor is ") + dtype_name(dtype()) +
                                          ", read as " + dtype_name(dtype_of<T>()));
  std::vector<T> out(static_cast<std::size_t>(numel()));
  if (out.empty()) return out;
  if (device().is_cpu()) {
    std::memcpy(out.data(), data_ptr(), nbytes());
    return out;
  }
  Tensor host = copy_to(Device::cpu(), stream);
  stream.synchronize();
  std::memcpy(out.data(), host.data_ptr(), nbytes());
  return out;
}
template std::vector<float> Tensor::to_vector<float>(const Stream&) const;
template std::vector<std::uint16_t> Tensor::to_vector<std::uint16_t>(const Stream&) const;
template std::vector<std::int32_t> Tensor::to_vector<std::int32_t>(const Stream&) const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>(const Stream&) const;

double Tensor::item(const Stream& stream) const {
  DDP_CHECK(numel() == 1, "Tensor::item: needs a tensor of one element, got " + describe());
  if (is_capturing(stream)) {
    throw InvalidArgument("Tensor::item() reads " + describe() + " on the host, which a captured CUDA graph cannot "
                          "do (the value would be the capture's, never a replay's): read it outside the step");
  }
  switch (dtype()) {
    case DType::kFloat32:
      return to_vector<float>(stream)[0];
    case DType::kBFloat16:
      return to_dtype(DType::kFloat32, stream).to_vector<float>(stream)[0];
    case DType::kInt32:
      return to_vector<std::int32_t>(stream)[0];
    default:
      return static_cast<double>(to_vector<std::int64_t>(stream)[0]);
  }
}

void Tensor::record_stream(const Stream& stream) const { storage()->record_stream(stream); }

// ---- Autograd state ----

AutogradMeta& Tensor::autograd_meta() const {
  TensorImpl& t = const_cast<TensorImpl&>(checked());
  if (!t.autograd) t.autograd = std::make_shared<AutogradMeta>();
  return *t.autograd;
}

bool Tensor::requires_grad() const { return has_autograd_meta() && impl_->autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool on) {
  DDP_CHECK(!on || dtype() == DType::kFloat32 || dtype() == DType::kBFloat16,
            "set_requires_grad: only float tensors have gradients, got " + describe());
  autograd_meta().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  if (!has_autograd_meta() || !impl_->autograd->grad) return Tensor();
  return Tensor(impl_->autograd->grad);
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    DDP_CHECK(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
              "set_grad: gradient " + grad.describe() + " does not match tensor " + describe());
  }
  autograd_meta().grad = grad.impl_;
}

bool Tensor::grad_valid() const { return has_autograd_meta() && impl_->autograd->grad && impl_->autograd->grad_valid; }

void Tensor::set_data(const Tensor& other) {
  DDP_CHECK(other.shape() == shape() && other.dtype() == dtype(),
            "set_data: " + other.describe() + " cannot replace " + describe());
  impl_->storage = other.impl_->storage;
  impl_->offset = other.impl_->offset;
}

void Tensor::register_grad_ready_hook(std::function<void()> hook) {
  autograd_meta().grad_ready_hooks.push_back(std::move(hook));
}

}  // namespace ddp
