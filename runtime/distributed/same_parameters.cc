#include "runtime/distributed/same_parameters.h"

#include <mpi.h>

#include <string>

#include "runtime/core/check.h"
#include "runtime/distributed/mpi_nccl_errors.h"
#include "runtime/distributed/world_mpi.h"

namespace ddp {
namespace {

// One line per parameter; comparing lines finds the first difference.
std::vector<std::string> describe_all(const std::vector<ParameterSpec>& parameters) {
  std::vector<std::string> lines;
  lines.reserve(parameters.size());
  for (const ParameterSpec& p : parameters) lines.push_back(p.describe());
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < s.size()) {
    const std::size_t end = s.find('\n', start);
    lines.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace

void verify_parameters_match(const World& world, const std::vector<ParameterSpec>& parameters) {
  const std::vector<std::string> mine = describe_all(parameters);
  std::string reference = join(mine);
  long long length = static_cast<long long>(reference.size());
  run_host_collective("verify_parameters_match", 1, DType::kInt64, [&](MPI_Request* request) {
    return MPI_Ibcast(&length, 1, MPI_LONG_LONG, 0, mpi_comm(world), request);
  });
  reference.resize(static_cast<std::size_t>(length));
  run_host_collective("verify_parameters_match", length, DType::kUInt8, [&](MPI_Request* request) {
    return MPI_Ibcast(&reference[0], static_cast<int>(length), MPI_CHAR, 0, mpi_comm(world), request);
  });

  std::string error;
  if (world.rank() != 0) {
    const std::vector<std::string> theirs = split(reference);
    std::size_t i = 0;
    while (i < mine.size() && i < theirs.size() && mine[i] == theirs[i]) ++i;
    if (i < mine.size() && i < theirs.size()) {
      error = "parameter " + std::to_string(i) + " is " + mine[i] + " here but " + theirs[i] + " on rank 0";
    } else if (mine.size() != theirs.size()) {
      error = "this rank has " + std::to_string(mine.size()) + " parameters, rank 0 has " +
              std::to_string(theirs.size()) + (i < mine.size() ? " (first extra: " + mine[i] + ")"
                                               : " (first missing: " + theirs[i] + ")");
    }
  }
  world.agree(error, "the model differs across ranks (every rank must build the same model)");
}

}  // namespace ddp
