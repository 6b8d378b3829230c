#include "runtime/data/evaluation_shard.h"

#include <algorithm>

#include "runtime/core/check.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/data/sampler.h"

namespace ddp {
namespace data {

EvaluationShard::EvaluationShard(const Dataset& data, int rank, int ranks, const Device& device,
                                 const Stream& stream, std::int64_t chunk_rows) {
  DDP_CHECK(chunk_rows > 0, "EvaluationShard: chunk_rows must be positive, got " + std::to_string(chunk_rows));
  SamplerOptions so;
  so.dataset_size = data.size;
  so.num_replicas = ranks;
  so.rank = rank;
  so.shuffle = false;
  so.even = false;
  const DistributedSampler sampler(so);
  rows_ = sampler.num_samples();
  ResidentDataset resident(view(data), device, stream);
  resident.set_order(sampler.indices(), stream);
  for (std::int64_t begin = 0; begin < rows_; begin += chunk_rows) {
    const std::int64_t n = std::min(chunk_rows, rows_ - begin);
    DeviceBatch chunk{Tensor::empty({n, data.feature_count}, DType::kFloat32, device, stream),
                      resident.empty_y(n, stream)};
    resident.gather(begin, chunk.features, chunk.labels, stream);
    chunks_.push_back(std::move(chunk));
  }
}

}  // namespace data
}  // namespace ddp
