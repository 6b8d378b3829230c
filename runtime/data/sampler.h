// DistributedSampler: which samples each rank sees, in which order, in every epoch.
//
// It follows PyTorch's torch.utils.data.DistributedSampler so results carry over: one permutation of the whole
// data set per epoch, drawn from (seed, epoch) alone (never from the rank count), padded by repeating its head
// until it divides evenly (or cut, with drop_last), and rank r takes positions r, r+R, r+2R, ... Because rank r's
// local position j is global position r + R*j, step s of R ranks with batch b covers global positions
// [s*R*b, (s+1)*R*b): exactly the samples of step s of one rank with batch R*b (padding aside, which only ever
// touches the last step).
//
// The generator is fixed by this file, not by the standard library's distributions (whose output differs
// between implementations): std::mt19937_64 (its sequence is fixed by the C++ standard) seeded with
// splitmix64(seed ^ splitmix64(epoch)), and a Fisher-Yates shuffle whose bounded draws use rejection sampling on
// the raw 64-bit outputs. So a run is reproducible on any compiler, and a resumed run sees the same order.
//
// Resume: the position to save is the global sample position, the number of permutation positions consumed in
// the epoch (local position * ranks). Resuming with R' ranks starts every rank at local position P / R'; P must
// be a multiple of R' (it always is with the same R, and with any R' that divides P), otherwise some samples
// would be seen twice or not at all, and set_global_position refuses.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp {
namespace data {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int num_replicas = 1;
  int rank = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  // false: pad to ceil(N/R)*R by repeating the head of the permutation (PyTorch's default).
  // true: cut to floor(N/R)*R.
  bool drop_last = false;
  // false: neither pad nor cut, ranks get ceil or floor of N/R samples (for evaluation, where duplicates would
  // count twice). Ranks may then run different numbers of batches, so use it only where no collective follows
  // each batch.
  bool even = true;
};

// The per-epoch permutation of 0..n-1, identical on every rank (shuffle=false gives the identity).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle = true);

class DistributedSampler {
 public:
  // Throws InvalidArgument for an empty data set, num_replicas < 1, or a rank outside [0, num_replicas).
  explicit DistributedSampler(const SamplerOptions& options);

  // Draws the epoch's permutation and rewinds to its start.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // Samples this rank sees per epoch, and the padded (or cut) length of the global permutation.
  int64_t num_samples() const { return static_cast<int64_t>(indices_.size()); }
  int64_t total_size() const { return total_size_; }
  // This rank's sample indices for the epoch, in order.
  const std::vector<int64_t>& indices() const { return indices_; }

  // Position within the epoch: local counts this rank's samples, global counts permutation positions.
  int64_t local_position() const { return position_; }
  int64_t global_position() const { return position_ * options_.num_replicas; }
  void set_local_position(int64_t position);
  // Resume point (see the top of this file); throws InvalidArgument when it does not divide evenly.
  void set_global_position(int64_t position);

  // Fills `out` with the next up-to-`batch_size` indices and advances; false (and `out` empty) at the end of
  // the epoch. With drop_partial, a last batch shorter than batch_size is not returned.
  bool next_batch(int64_t batch_size, std::vector<int64_t>* out, bool drop_partial = false);
  // Batches per epoch for this rank.
  int64_t batches_per_epoch(int64_t batch_size, bool drop_partial = false) const;
  // Throws InvalidArgument unless 0 < batch_size <= this rank's samples per epoch, saying what to change.
  void check_batch_size(int64_t batch_size) const;

  const SamplerOptions& options() const { return options_; }

 private:
  SamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t total_size_ = 0;
  int64_t position_ = 0;
  std::vector<int64_t> indices_;
};

}  // namespace data
}  // namespace ddp
