// The deterministic permutation and PyTorch's DistributedSampler layout (see sampler.h for the rules).
#include "runtime/data/sampler.h"

#include <algorithm>
#include <random>
#include <string>

#include "runtime/core/check.h"

namespace ddp {
namespace data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) without modulo bias: reject the raw values below 2^64 mod bound.
uint64_t bounded(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  DDP_CHECK(n >= 0, "epoch_permutation: n must be non-negative, got " + std::to_string(n));
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  if (!shuffle || n < 2) return p;
  std::mt19937_64 rng(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch))));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(bounded(rng, static_cast<uint64_t>(i) + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

int64_t per_replica_batch_size(int64_t global_batch_size, int num_replicas) {
  DDP_CHECK(num_replicas >= 1, "num_replicas must be at least 1, got " + std::to_string(num_replicas));
  const int64_t r = num_replicas;
  if (global_batch_size <= 0 || global_batch_size % r != 0) {
    const int64_t below = global_batch_size / r * r;
    std::string nearest = below > 0 ? std::to_string(below) + " or " : "";
    // A run that resumes must keep its checkpoint's global batch: the numbers of ranks nearest to this one that
    // divide it are the way on; another global batch only suits a new run.
    std::string ranks;
    if (global_batch_size > 0) {
      int64_t fewer = r - 1, more = r + 1;
      while (fewer > 0 && global_batch_size % fewer != 0) --fewer;
      while (more <= global_batch_size && global_batch_size % more != 0) ++more;
      if (fewer > 0) ranks = std::to_string(fewer);
      if (more <= global_batch_size) ranks += (ranks.empty() ? "" : " or ") + std::to_string(more);
      ranks = "start " + ranks + " ranks, which divide it (a resumed run keeps its global batch), or for a new run ";
    }
    throw InvalidArgument("a global batch of " + std::to_string(global_batch_size) + " does not split evenly over " +
                          std::to_string(r) + " ranks; " + ranks + "pass a multiple of " + std::to_string(r) + " (" +
                          nearest + std::to_string(below + r) + ") or a per-rank batch size");
  }
  return global_batch_size / r;
}

DistributedSampler::DistributedSampler(const SamplerOptions& options) : options_(options) {
  if (options.dataset_size <= 0) {
    throw InvalidArgument("DistributedSampler: the data set is empty (" + std::to_string(options.dataset_size) +
                          " samples)");
  }
  if (options.num_replicas < 1) {
    throw InvalidArgument("DistributedSampler: num_replicas must be at least 1, got " +
                          std::to_string(options.num_replicas));
  }
  if (options.rank < 0 || options.rank >= options.num_replicas) {
    throw InvalidArgument("DistributedSampler: rank " + std::to_string(options.rank) + " is outside [0, " +
                          std::to_string(options.num_replicas) + ")");
  }
  if (options.drop_last && options.even && options.dataset_size < options.num_replicas) {
    throw InvalidArgument("DistributedSampler: drop_last with " + std::to_string(options.dataset_size) +
                          " samples and " + std::to_string(options.num_replicas) +
                          " ranks leaves no sample for any rank");
  }
  draw(0, 0);
}

void DistributedSampler::set_epoch(int64_t epoch) { lay_out(epoch, 0); }

void DistributedSampler::set_global_position(int64_t position) {
  if (position < 0) {
    throw InvalidArgument("DistributedSampler: cannot resume at global sample position " + std::to_string(position) +
                          ": positions count the samples an epoch has consumed and are never negative");
  }
  lay_out(epoch_, position);
}

void DistributedSampler::lay_out(int64_t epoch, int64_t start) {
  position_ = 0;
  if (epoch != epoch_ || start != start_) draw(epoch, start);  // else the same indices again
}

void DistributedSampler::draw(int64_t epoch, int64_t start) {
  epoch_ = epoch;
  start_ = start;
  const int64_t n = options_.dataset_size;
  const int64_t r = options_.num_replicas;
  const int64_t left = std::max<int64_t>(0, n - start);
  int64_t length = left;  // of the rest of the epoch, over all ranks
  if (options_.even) length = options_.drop_last ? left / r * r : (left + r - 1) / r * r;
  total_size_ = start + length;
  const std::vector<int64_t> perm = epoch_permutation(n, options_.seed, epoch, options_.shuffle);
  indices_.clear();
  // Positions past n are the padding: like PyTorch, the head of the permutation again (several times over
  // when the padding exceeds n).
  for (int64_t i = options_.rank; i < length; i += r) indices_.push_back(perm[static_cast<size_t>((start + i) % n)]);
}

int64_t DistributedSampler::whole_epoch_samples() const {
  const int64_t n = options_.dataset_size;
  const int64_t r = options_.num_replicas;
  if (!options_.even) return (n - options_.rank + r - 1) / r;
  return options_.drop_last ? n / r : (n + r - 1) / r;
}

void DistributedSampler::set_local_position(int64_t position) {
  if (position < 0 || position > num_samples()) {
    throw InvalidArgument("DistributedSampler: position " + std::to_string(position) + " is outside [0, " +
                          std::to_string(num_samples()) + "] for this rank's epoch");
  }
  position_ = position;
}

bool DistributedSampler::next_batch(int64_t batch_size, std::vector<int64_t>* out, bool drop_partial) {
  DDP_CHECK(batch_size > 0, "batch size must be positive, got " + std::to_string(batch_size));
  out->clear();
  const int64_t left = num_samples() - position_;
  if (left <= 0 || (drop_partial && left < batch_size)) return false;
  const int64_t take = std::min(left, batch_size);
  out->assign(indices_.begin() + position_, indices_.begin() + position_ + take);
  position_ += take;
  return true;
}

int64_t DistributedSampler::batches_per_epoch(int64_t batch_size, bool drop_partial) const {
  DDP_CHECK(batch_size > 0, "batch size must be positive, got " + std::to_string(batch_size));
  return drop_partial ? num_samples() / batch_size : (num_samples() + batch_size - 1) / batch_size;
}

void DistributedSampler::check_batch_size(int64_t batch_size) const {
  if (batch_size <= 0) throw InvalidArgument("batch size must be positive, got " + std::to_string(batch_size));
  if (batch_size > whole_epoch_samples()) {
    throw InvalidArgument("batch size " + std::to_string(batch_size) + " is larger than rank " +
                          std::to_string(options_.rank) + "'s shard of " + std::to_string(whole_epoch_samples()) +
                          " samples (" + std::to_string(options_.dataset_size) + " samples over " +
                          std::to_string(options_.num_replicas) + " ranks); lower the batch size or use fewer ranks");
  }
}

}  // namespace data
}  // namespace ddp
