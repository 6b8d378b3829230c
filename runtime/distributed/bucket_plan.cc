#include "runtime/distributed/bucket_plan.h"

#include "runtime/core/check.h"
#include "runtime/distributed/process_group.h"

namespace ddp {

std::int64_t ParameterSpec::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string ParameterSpec::describe() const {
  std::string s = name + " " + dtype_name(dtype) + " [";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<std::size_t> BucketPlan::layout_order() const {
  std::vector<std::size_t> order;
  for (const GradientBucket& b : buckets) order.insert(order.end(), b.parameters.begin(), b.parameters.end());
  return order;
}

FlatSpan BucketPlan::shard_of(std::size_t bucket, int rank) const {
  DDP_ASSERT(bucket < buckets.size() && rank >= 0 && rank < shards, "shard_of: no such bucket or rank");
  const GradientBucket& b = buckets[bucket];
  const std::int64_t count = b.count / shards;
  return {b.offset + rank * count, count};
}

BucketPlan plan_buckets(const std::vector<ParameterSpec>& parameters, const BucketOptions& options) {
  DDP_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0,
            "bucket caps must be positive (got " + std::to_string(options.bucket_cap_mb) + " MB and " +
                std::to_string(options.first_bucket_cap_mb) + " MB)");
  DDP_CHECK(options.shards >= 1, "a bucket plan needs at least one shard, got " + std::to_string(options.shards));
  const double mb = 1024.0 * 1024.0;
  // Sharded, a bucket ends at a multiple of this, so every rank's slice is whole aligned slots' worth.
  const std::int64_t bucket_multiple = kSlotAlignment * options.shards;
  BucketPlan plan;
  plan.shards = options.shards;
  plan.offsets.assign(parameters.size(), 0);
  plan.bucket_of.assign(parameters.size(), 0);
  GradientBucket current;
  double current_bytes = 0;
  auto cap = [&] { return (plan.buckets.empty() ? options.first_bucket_cap_mb : options.bucket_cap_mb) * mb; };
  auto close = [&] {
    if (current.parameters.empty()) return;
    plan.total = (plan.total + bucket_multiple - 1) / bucket_multiple * bucket_multiple;
    current.count = plan.total - current.offset;
    plan.buckets.push_back(current);
    current = GradientBucket{};
    current.offset = plan.total;
    current_bytes = 0;
  };
  for (std::size_t k = parameters.size(); k-- > 0;) {
    const ParameterSpec& p = parameters[k];
    // One flat float32 gradient buffer: bfloat16 models keep FP32 master weights, and so FP32 gradients.
    DDP_CHECK(p.dtype == DType::kFloat32,
              "parameter " + p.describe() + ": DDP reduces float32 gradients (keep FP32 master weights)");
    plan.offsets[k] = plan.total;
    plan.bucket_of[k] = plan.buckets.size();
    current.parameters.push_back(k);
    current_bytes += static_cast<double>(p.numel()) * dtype_size(p.dtype);
    plan.total = align_slot(plan.total + p.numel());
    // A bucket closes once it reaches its cap (PyTorch's rule), not before the parameter that would pass it:
    // closing early leaves a bias alone in a bucket of its own in front of its weight, and every collective
    // costs a fixed latency that a few kilobytes do not pay back (both gradients come from one backward step).
    if (current_bytes >= cap()) close();
  }
  close();
  return plan;
}

}  // namespace ddp
