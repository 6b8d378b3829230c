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
// Resume at any world size: the position to save is the global sample position P, the number of permutation
// positions the epoch has consumed (rank r's local position j is global position r + R*j, so after every rank
// took j samples, P = R*j). Resuming with R' ranks, whatever R was, lays the rest of the epoch out anew: the
// permutation's positions P, P+1, ... up to the data set's size, padded (or cut) to a multiple of R' exactly as
// a whole epoch is, with rank r taking P + r, P + r + R', ... So every sample the interrupted epoch had not
// reached is seen exactly once across the R' ranks (the padding only repeats the head of the permutation, which
// the epoch saw before P), the ranks still take the same number of batches, and positions go on counting from P:
// a checkpoint taken after the resume saves P + R'*j' and can be resumed at yet another size. With R' = R the
// layout is the original one from position P on, so same-size resumes are bitwise the same run.
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

// The per-rank batch that keeps a global batch on `num_replicas` ranks; throws InvalidArgument, naming the
// nearest sizes that split, when it does not divide evenly.
int64_t per_replica_batch_size(int64_t global_batch_size, int num_replicas);

class DistributedSampler {
 public:
  // Throws InvalidArgument for an empty data set, num_replicas < 1, or a rank outside [0, num_replicas).
  explicit DistributedSampler(const SamplerOptions& options);

  // Draws the epoch's permutation and rewinds to its start. Laying out the epoch and start already laid out only
  // rewinds (drawing a large data set's permutation is host time the device may wait for): a training loop can
  // lay out the next epoch while the device finishes this one and set it again where the epoch begins.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Lays out the rest of the current epoch from global sample position `position` (a checkpoint's, saved at
  // any world size: see the top of this file); a position at or past the data set's end leaves nothing of the
  // epoch. Throws InvalidArgument for a negative position.
  void set_global_position(int64_t position);

  // This rank's samples in the epoch as laid out (from its start, or from the resume point), and the global
  // position where the epoch ends (the padded or cut length of the permutation when it was laid out from 0).
  int64_t num_samples() const { return static_cast<int64_t>(indices_.size()); }
  int64_t total_size() const { return total_size_; }
  // This rank's sample indices, in order, for the epoch as laid out.
  const std::vector<int64_t>& indices() const { return indices_; }

  // Position within the epoch: local counts this rank's samples taken from indices(), global counts
  // permutation positions consumed by all ranks since the epoch's start.
  int64_t local_position() const { return position_; }
  int64_t global_position() const { return start_ + position_ * options_.num_replicas; }
  void set_local_position(int64_t position);
  // Whether this rank has taken every sample of the epoch.
  bool epoch_finished() const { return position_ == num_samples(); }

  // Fills `out` with the next up-to-`batch_size` indices and advances; false (and `out` empty) at the end of
  // the epoch. With drop_partial, a last batch shorter than batch_size is not returned.
  bool next_batch(int64_t batch_size, std::vector<int64_t>* out, bool drop_partial = false);
  // This rank's batches in the epoch as laid out (all of them, or those left after a resume point).
  int64_t batches_per_epoch(int64_t batch_size, bool drop_partial = false) const;
  // Throws InvalidArgument unless 0 < batch_size <= this rank's samples in a whole epoch, saying what to change.
  void check_batch_size(int64_t batch_size) const;

  const SamplerOptions& options() const { return options_; }

 private:
  // Lays out `epoch` from global position `start` and rewinds; draws only when that is not the current layout.
  void lay_out(int64_t epoch, int64_t start);
  // Draws `epoch`'s permutation and this rank's indices of it from `start`.
  void draw(int64_t epoch, int64_t start);
  // This rank's samples in an epoch laid out from its start.
  int64_t whole_epoch_samples() const;

  SamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;  // the global position the epoch was laid out from
  int64_t total_size_ = 0;
  int64_t position_ = 0;
  std::vector<int64_t> indices_;
};

}  // namespace data
}  // namespace ddp
