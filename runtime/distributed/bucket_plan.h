// Which gradients travel together: PyTorch DDP's bucketing. Parameters are taken in reverse registration order
// (the order backward produces their gradients), the first bucket capped small (1 MB) so communication starts
// early, the rest at the cap (25 MB). The plan also lays the flat gradient buffer out in bucket order, so each
// bucket is one contiguous slice of it — a view, never a copy. Every rank computes the same plan from the same
// parameter list; DistributedDataParallel verifies the lists match before the first step. Offsets follow the
// ParameterStore's slot alignment (align_slot), so a store laid out in layout_order() has exactly these offsets.
//
// Sharded (BucketOptions::shards = N > 1, for ZeRO stage 1): each bucket is padded with zeros to a multiple of
// N·kSlotAlignment elements, so that a reduce-scatter gives every rank an equal, aligned slice of it: rank r owns
// elements [offset + r·count/N, offset + (r+1)·count/N) of every bucket. A store takes this layout through
// relayout(layout_order(), stream, offsets, total).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/autograd/parameter_store.h"
#include "runtime/core/dtype.h"

namespace ddp {

struct ParameterSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::kFloat32;

  std::int64_t numel() const;
  std::string describe() const;  // "2.weight float32 [10, 1024]"
};

struct GradientBucket {
  std::vector<std::size_t> parameters;  // indices into the registration-order list, in bucket order
  std::int64_t offset = 0;              // first element in the flat gradient buffer
  std::int64_t count = 0;               // elements, including the alignment padding between its parameters
                                        // and, sharded, after the last one
};

struct BucketPlan {
  std::vector<GradientBucket> buckets;
  std::vector<std::int64_t> offsets;  // per parameter (registration index): its element offset in the flat buffer
  std::vector<std::size_t> bucket_of;  // per parameter: its bucket
  std::int64_t total = 0;              // elements in the flat buffer
  int shards = 1;                      // ranks each bucket is split over (see the file comment)

  // The parameters in flat-buffer order (bucket by bucket).
  std::vector<std::size_t> layout_order() const;
  // Rank `rank`'s slice of bucket `bucket` when sharded: count/shards elements.
  FlatSpan shard_of(std::size_t bucket, int rank) const;
};

struct BucketOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  int shards = 1;
};

// Deterministic: depends only on the specs and options. Parameters join the open bucket until it holds at least
// the cap; so a bucket may pass the cap by its last parameter.
BucketPlan plan_buckets(const std::vector<ParameterSpec>& parameters, const BucketOptions& options = {});

}  // namespace ddp
