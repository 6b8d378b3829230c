#include "bench/gemm_floor.h"

#include <algorithm>

#include "bench/timing.h"
#include "runtime/kernels/kernels.h"

namespace ddp::bench {

double time_gemms_alone(const GemmFloorOptions& a, const std::vector<std::int64_t>& sizes, const Device& device,
                        const Stream& stream) {
  const bool bf16 = a.precision == "bf16";
  const MathMode math = a.precision == "tf32" ? MathMode::kTF32 : MathMode::kFloat32;
  const DType in = bf16 ? DType::kBFloat16 : DType::kFloat32;
  // As the step: bf16 GEMMs write bf16 activations and logits and float32 weight gradients.
  const kernels::LinearTypes types(in, in, DType::kFloat32);
  struct Layer {
    kernels::LinearShape shape;
    Tensor x, w, y, dy, dx, dw;
  };
  std::vector<Layer> layers;
  const std::size_t n = sizes.size() - 1;
  for (std::size_t l = 0; l < n; ++l) {
    const std::int64_t fi = sizes[l], fo = sizes[l + 1];
    Layer L{{a.batch, fi, fo}, {}, {}, {}, {}, {}, {}};
    L.x = Tensor::normal({a.batch, fi}, 0.0f, 1.0f, 11, l, device, stream).to_dtype(in, stream);
    L.w = Tensor::normal({fo, fi}, 0.0f, 0.05f, 12, l, device, stream).to_dtype(in, stream);
    L.dy = Tensor::normal({a.batch, fo}, 0.0f, 1.0f, 13, l, device, stream).to_dtype(in, stream);
    L.y = Tensor::empty({a.batch, fo}, types.output, device, stream);
    L.dw = Tensor::empty({fo, fi}, types.grad, device, stream);
    if (l > 0) L.dx = Tensor::empty({a.batch, fi}, in, device, stream);
    layers.push_back(std::move(L));
  }
  auto gemms = [&] {
    for (Layer& L : layers)
      kernels::cuda::linear_forward(types, math, L.shape, L.x.data_ptr(), L.w.data_ptr(), nullptr,
                                    Activation::kNone, L.y.data_ptr(), nullptr, stream.handle());
    for (std::size_t l = n; l-- > 0;) {
      Layer& L = layers[l];
      kernels::cuda::linear_backward(types, math, L.shape, L.dy.data_ptr(), L.x.data_ptr(), L.w.data_ptr(), nullptr,
                                     nullptr, Activation::kNone, L.dx.defined() ? L.dx.data_ptr() : nullptr,
                                     L.dw.data_ptr(), nullptr, false, nullptr, stream.handle());
    }
  };
  for (int i = 0; i < std::max(a.warmup, 2); ++i) gemms();
  stream.synchronize();
  std::vector<double> times_us;
  for (int r = 0; r < a.repeats; ++r) times_us.push_back(time_per_call_us(gemms, a.iters, stream));
  return median(times_us);
}

}  // namespace ddp::bench
