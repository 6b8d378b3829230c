#!/usr/bin/env bash
# Installs every Debian package the build, the examples and the tests need. Idempotent: packages already
# present are skipped and apt is not touched. Uses sudo when not root.
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java bazel-platforms bazel-skylib   # Bazel 4.2.3 and the repositories it needs
  g++ clang libclang-rt-14-dev                                    # compilers; clang + runtime for fuzzers
  cmake pkg-config make                                           # building against an installed runtime (tools/install.sh)
  openmpi-bin libopenmpi-dev                                      # MPI bootstrap and the CPU backend (and mpifort)
  gfortran                                                        # the Fortran module (capi/ddp.f90) and its tests
  openssh-client openssh-server                                   # several hosts: Open MPI's ssh launch, tested
  slurm-wlm slurmctld slurmd slurm-client munge                   # a real Slurm for tests/slurm (started by the test)
  libpmix2 libpmi2-0                                              # srun --mpi=pmix for Open MPI's ranks
  libopenblas-dev zlib1g-dev libdeflate-dev                       # CPU GEMM; gzip for the dataset and CRC32
  nlohmann-json3-dev libcli11-dev libfmt-dev                      # JSON, flags, formatting
  libgtest-dev libgmock-dev                                       # tests
  dataset-fashion-mnist                                           # the training example's data
  python3-torch python3-numpy                                     # PyTorch 1.13 for CPU comparisons and checks
  protobuf-compiler libprotobuf-dev python3-protobuf              # TensorBoard events: protoc, libprotobuf, the test's decoder
  libonnx-dev python3-onnx                                        # ONNX export (C++ ModelProto + checker); Python's checker
  python3-matplotlib                                              # tools/plot_run.py: pictures of a run's metrics
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: the CUDA 13 toolkit is expected under /usr/local/cuda (nvcc, cuBLAS, NCCL); it is not a Debian" \
       "package: install NVIDIA's CUDA toolkit and NCCL there first." >&2
  exit 1
fi
# ONNX Runtime for the ONNX export's test: npm's onnxruntime-node ships its CPU binaries for Linux x64 inside the
# package, installed into a folder of the checkout (git-ignored) and used offline from then on. Its install
# script would fetch CUDA binaries from nuget.org: skipped, the test runs on the CPU.
ort_dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/onnxruntime-node"
if [ ! -d "$ort_dir/node_modules/onnxruntime-node" ]; then
  if ! command -v npm >/dev/null; then
    echo "setup: npm is missing: install Node.js 18 or newer with npm, then rerun (ONNX Runtime comes from npm)" >&2
    exit 1
  fi
  echo "setup: installing onnxruntime-node into third_party/onnxruntime-node"
  if (cd "$ort_dir" && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --ignore-scripts); then
    rm -f "$ort_dir/npm-unreachable"
  elif ! npm ping >/dev/null 2>&1; then
    # No registry: the ONNX Runtime test skips with this reason instead of failing.
    echo "npm registry $(npm config get registry) unreachable on $(date -u +%F)" > "$ort_dir/npm-unreachable"
    echo "setup: npm's registry is unreachable: onnxruntime-node not installed, tests/training:onnx_runtime_test" \
         "will skip" >&2
  else
    echo "setup: npm ci in third_party/onnxruntime-node failed (above); fix that and rerun" >&2
    exit 1
  fi
fi
echo "setup: all packages present"
