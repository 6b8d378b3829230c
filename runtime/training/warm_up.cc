// warm_up_device (see trainer.h): one throwaway step, so that the run's first step finds its kernels loaded and
// its GEMM plans made.
#include "runtime/autograd/autograd.h"
#include "runtime/models/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/training/precision_model.h"
#include "runtime/training/trainer.h"

namespace ddp {

void warm_up_device(const Session& session, const std::vector<std::int64_t>& sizes, Activation activation,
                    const TrainerOptions& options) {
  if (!session.device().is_cuda()) return;
  const Stream& stream = session.stream();
  MLP mlp(sizes, activation, options.seed, session.device(), stream);
  training::PrecisionModel model(mlp, options.precision);
  const std::unique_ptr<Optimizer> optimizer = make_optimizer(options, mlp, stream);
  model.attach(*optimizer, stream);
  const Tensor x = Tensor::zeros({options.batch_size, sizes.front()}, DType::kFloat32, session.device(), stream);
  mlp.zero_grad(stream);
  if (options.loss == Loss::kMse) {
    const Tensor y = Tensor::zeros({options.batch_size, sizes.back()}, DType::kFloat32, session.device(), stream);
    autograd::backward(ops::mse_loss(model.forward(x, stream, DType::kFloat32), y, stream), stream);
  } else {
    const Tensor y = Tensor::zeros({options.batch_size}, DType::kInt32, session.device(), stream);
    autograd::backward(ops::cross_entropy(model.forward(x, stream), y, stream), stream);
  }
  optimizer->step(stream);
  stream.synchronize();
}

}  // namespace ddp
