// Span arithmetic for OptimizerShard's users (the optimizers, gradient clipping, checkpoints).
#include "runtime/autograd/optimizer_shard.h"

#include <algorithm>

namespace ddp {

std::vector<FlatSpan> intersect(const std::vector<FlatSpan>& spans, FlatSpan range) {
  std::vector<FlatSpan> out;
  for (const FlatSpan& s : spans) {
    const std::int64_t begin = std::max(s.offset, range.offset);
    const std::int64_t end = std::min(s.end(), range.end());
    if (begin < end) out.push_back({begin, end - begin});
  }
  return out;
}

}  // namespace ddp
