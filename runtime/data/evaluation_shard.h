// EvaluationShard: this rank's part of an evaluation set, held on the device in chunks, for scoring the whole set
// across ranks with every sample counted exactly once.
//
// Why: a training sampler pads its shards to equal length (so that every rank runs the same steps); an evaluation
// must not count a sample twice, so its shard is unpadded (ranks get ceil or floor of N/R rows, in order). It is
// gathered once into the device's memory, so that an evaluation is a forward per chunk with no copy from the
// host and one read-back at the end. Each chunk is an allocation of its own: it starts where the allocator aligns
// a block, as a batch of its own would, so the GEMMs pick the algorithms (and give the bits) they give any
// batch of that size.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/data/idx.h"
#include "runtime/data/loader.h"

namespace ddp {
namespace data {

class EvaluationShard {
 public:
  // Rows rank, rank + ranks, rank + 2·ranks, ... of `data`, copied to `device` on `stream` in chunks of at most
  // `chunk_rows` rows. `data` may go away afterwards. InvalidArgument for an empty data set or a bad rank.
  EvaluationShard(const Dataset& data, int rank, int ranks, const Device& device,
                  const Stream& stream = current_stream(), std::int64_t chunk_rows = 1000);

  const std::vector<DeviceBatch>& chunks() const { return chunks_; }
  std::int64_t rows() const { return rows_; }  // this rank's samples (0 when ranks outnumber them)

 private:
  std::vector<DeviceBatch> chunks_;
  std::int64_t rows_ = 0;
};

}  // namespace data
}  // namespace ddp
