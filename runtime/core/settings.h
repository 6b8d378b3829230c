// Every DDP_* environment variable, in one table: its name, type, default, who reads it and what it does.
//
// The runtime reads the environment only through the accessors below, which take an entry of the table
// (`setting("DDP_KERNEL_PDL")` fails to compile for a name that is not in it) and refuse a malformed value
// with an InvalidArgument that names the variable, its value and what it takes. The variables that shell scripts
// and tests read are in the table too, so that it is the one list: docs/settings.md shows it, and
// tests/core/settings_test.cc fails when the page and the table differ. Adding a variable is one line of kTable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ddp::settings {

enum class Type {
  kFlag,     // 0 or 1
  kInteger,  // a decimal integer
  kSeconds,  // a number of seconds above 0 and at most kMaxSeconds
  kChoice,   // one of `choices`, separated by '|'
  kText,     // anything; the reader parses it
};

enum class Reader {
  kRuntime,   // the library, for every program
  kRestarts,  // the library, set by ddprun --max-restarts
  kTestSeam,  // the library, for the reliability tests: faults injected on purpose
  kScripts,   // the shell scripts and tests (tools/, tests/, bench/), not the library
};

struct Setting {
  std::string_view name;
  Type type;
  std::string_view default_value;  // what an unset (or empty) variable means, in the variable's own syntax
  std::string_view choices;        // kChoice: "auto|nccl|mpi"
  Reader reader;
  std::string_view summary;
};

inline constexpr double kMaxSeconds = 1e6;  // about 11.6 days

// clang-format off
inline constexpr Setting kTable[] = {
    {"DDP_BACKEND", Type::kChoice, "auto", "auto|nccl|mpi", Reader::kRuntime, "The process group's backend where the program names none (`SessionOptions::backend`, `train_mlp --backend`): `nccl` (one GPU per rank), `mpi` (CPUs, or ranks sharing a GPU); `auto` is NCCL on GPUs and MPI on CPUs. `ddprun --backend` sets it."},
    {"DDP_COLLECTIVE_TIMEOUT_S", Type::kSeconds, "300", "", Reader::kRuntime, "The deadline of every collective; one past it ends the job with a report of which rank is behind and where (docs/reliability.md)."},
    {"DDP_CUDA_GRAPH", Type::kFlag, "1", "", Reader::kRuntime, "`0`: the C and Fortran API's training steps run kernel by kernel instead of replaying a captured CUDA graph (the same bits; to rule the graph out when looking for a fault)."},
    {"DDP_FUSED_MLP", Type::kFlag, "1", "", Reader::kRuntime, "`0`: the C and Fortran API's training steps of a narrow MLP on a GPU go layer by layer through autograd instead of the fused pass (`ddp::FusedMlpMse`; the same loss and gradients to float rounding)."},
    {"DDP_DEBUG", Type::kChoice, "", "collectives", Reader::kRuntime, "`collectives`: compare what every rank is about to issue before each collective and end the job at the first difference, naming both sides. A mode to find a bug in: it costs an allgather per collective."},
    {"DDP_FLIGHT_RECORDER", Type::kFlag, "1", "", Reader::kRuntime, "`0` turns off the flight recorder (each rank's last collectives and phase, for hang reports and `ddprun --dump`)."},
    {"DDP_GEMM_LOG", Type::kFlag, "0", "", Reader::kRuntime, "`1`: one line on stderr for each new GEMM configuration of the GPU Linear: its shape, types, epilogue and the split of K of cuBLASLt's algorithm."},
    {"DDP_PROGRESS_BAR", Type::kChoice, "", "0|1", Reader::kRuntime, "`1`: rank 0 draws a progress bar, `0`: plain progress lines; unset: a bar when its own output is a terminal. `ddprun` sets `1` when its output is a terminal (a value already set wins)."},
    {"DDP_KERNEL_PDL", Type::kFlag, "1", "", Reader::kRuntime, "`0` launches the runtime's own CUDA kernels in plain stream order instead of with programmatic dependent launch."},
    {"DDP_RESUME", Type::kFlag, "0", "", Reader::kRestarts, "`1`: a program with a checkpoint directory continues from its newest complete checkpoint if there is one, and starts afresh (saying so) if there is none. Set by `ddprun --max-restarts` on a relaunch; may be set by hand (a requeued Slurm job)."},
    {"DDP_RESTART", Type::kInteger, "0", "", Reader::kRestarts, "Which relaunch of a failed job this is (1, 2, ...), set by `ddprun --max-restarts`; 0 on the first attempt."},
    {"DDP_FAULT_STALL", Type::kText, "", "", Reader::kTestSeam, "`RANK:PHASE:STEP[:stop|:SECONDS]`: that rank stalls (or stops itself, or pauses SECONDS) the first time it enters PHASE (user, data, forward, backward, optimizer, checkpoint, evaluation) at step STEP or later."},
    {"DDP_FAULT_KILL_STEP", Type::kInteger, "-1", "", Reader::kTestSeam, "The trainer's rank `DDP_FAULT_KILL_RANK` fails after this optimizer step, on the first attempt only; -1: never."},
    {"DDP_FAULT_KILL_RANK", Type::kInteger, "-1", "", Reader::kTestSeam, "The rank that `DDP_FAULT_KILL_STEP` fails; -1: every rank."},
    {"DDP_FAULT_KIND", Type::kChoice, "kill", "kill|throw", Reader::kTestSeam, "How `DDP_FAULT_KILL_STEP` fails the rank: SIGKILL, or an error of that rank alone."},
    {"DDP_FAULT_KILL_STAMP", Type::kText, "", "", Reader::kTestSeam, "A file where the failing rank writes the time of its fault, for a test to time how fast the job ends."},
    {"DDP_MPI_SIMULATE_CUDA_AWARE", Type::kFlag, "0", "", Reader::kTestSeam, "`1`: the MPI backend runs its CUDA-aware path (averages by a device kernel) while its MPI calls still stage through the host, so that path is tested where MPI is not CUDA-aware."},
    {"DDP_TEST_DEVICE", Type::kChoice, "auto", "auto|cpu|cuda", Reader::kScripts, "The device of the multi-rank GoogleTest suites (`tests/distributed/mpi_gtest_main.cc`)."},
    {"DDP_TEST_ASAN", Type::kFlag, "1", "", Reader::kScripts, "`0`: `tools/test.sh` skips its pass under AddressSanitizer and UndefinedBehaviorSanitizer."},
    {"DDP_TEST_FUZZ", Type::kFlag, "1", "", Reader::kScripts, "`0`: `tools/test.sh` skips the bounded fuzzer runs."},
    {"DDP_TEST_EXTERNAL", Type::kFlag, "1", "", Reader::kScripts, "`0`: `tools/test.sh` skips building the runtime as another workspace's dependency."},
    {"DDP_EXTERNAL_IDLE_S", Type::kInteger, "120", "", Reader::kScripts, "How long the Bazel server of `tools/test_external_workspace.sh` waits idle before it exits."},
    {"DDP_SANITIZER_MPI_NO_LEAKS", Type::kFlag, "0", "", Reader::kScripts, "`1` (set by `--config=asan`): multi-rank tests run without leak detection (`bazel/mpi_env.sh`)."},
    {"DDP_RECORD", Type::kFlag, "0", "", Reader::kScripts, "`1`: `tests/examples/train_mlp_outputs_test.sh` rewrites its record instead of comparing against it."},
    {"DDP_GPU_DATA", Type::kText, "", "", Reader::kScripts, "The Fashion-MNIST directory of the GPU jobs and benchmarks (`tools/gpu_run.sh` sets it to `.gpu/data`)."},
};
// clang-format on

// The entry named `name`; a name that is not in kTable does not compile. (nvcc compiles C++17, which has no
// consteval: CUDA sources bind the entry to a constexpr variable to get the same check.)
#if defined(__cpp_consteval)
#define DDP_SETTINGS_CONSTEVAL consteval
#else
#define DDP_SETTINGS_CONSTEVAL constexpr
#endif
DDP_SETTINGS_CONSTEVAL const Setting& setting(std::string_view name) {
  for (const Setting& s : kTable) {
    if (s.name == name) return s;
  }
  throw "not a DDP_* setting: add it to ddp::settings::kTable";  // not a constant expression: a compile error
}

// Whether the variable is set to something other than the empty string.
bool is_set(const Setting& s);

// The variable's value, or its default when unset or empty. Each throws InvalidArgument for a value its type
// does not take: "DDP_KERNEL_PDL=yes: expected 0 or 1".
bool flag(const Setting& s);
std::int64_t integer(const Setting& s);
double seconds(const Setting& s);
std::string text(const Setting& s);  // kChoice (checked against its choices) and kText

// Why a run resumes, as a message says it: "DDP_RESUME=1, restart 2 of ddprun --max-restarts" on a relaunch by
// ddprun (DDP_RESTART >= 1), "DDP_RESUME=1" when it was set otherwise (by hand, a requeued Slurm job's script),
// where "a ddprun restart" would be wrong on a job's first run.
std::string resume_reason();

// One line per variable of the table that is set to a value its type refuses; empty when all are well formed.
// The runtime checks this at the first collective, so a malformed value ends every rank with one message.
std::string environment_errors();

// kTable as the Markdown table docs/settings.md holds.
std::string markdown_table();

}  // namespace ddp::settings
