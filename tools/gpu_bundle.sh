#!/usr/bin/env bash
# Builds, on this machine, everything that needs a GPU (the `gpu`/`multigpu`-tagged tests, the examples and
# the benchmarks) and copies the binaries into .gpu/, a folder git ignores, for a GPU machine that has no
# Bazel. There, `bash tools/gpu_run.sh` runs them all and prints one summary. With the workplace's device
# tool: run `tools/gpu_bundle.sh` here, then on the device `bash tools/gpu_run.sh` carrying `.gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."

tests=$(bazel query 'attr(tags, "\bgpu\b|\bmultigpu\b", kind("cc_test", tests(//...)))' 2>/dev/null)
# Binaries the GPU jobs (tools/gpu_jobs.txt) start under mpirun, and the benchmarks.
extra=$(bazel query 'attr(tags, "\bgpu_bundle\b", //...) + //examples:allreduce_sum + //launcher:ddprun' 2>/dev/null)
bazel build $tests $extra

rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for label in $tests $extra; do
  path="bazel-bin/$(sed -e 's|^//||' -e 's|:|/|' <<<"$label")"
  [ -f "$path" ] || continue
  cp "$path" .gpu/bin/
  chmod u+w ".gpu/bin/$(basename "$path")"
  strip --strip-debug ".gpu/bin/$(basename "$path")"
done
echo "$tests" | sed -e 's|.*:||' >.gpu/tests.txt

# Libraries from Debian that the GPU machine's image may lack; CUDA, NCCL and Open MPI come from that machine.
for bin in .gpu/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libopenblas|libgfortran|libquadmath|libfmt|libgtest|libdeflate|libprotobuf|libonnx' || true
done | sort -u | while read -r lib; do cp -L "$lib" .gpu/lib/; done
# The transfer to the GPU machine is capped (64 MiB): OpenBLAS alone is 36 MB, 4 MB compressed, and the
# binaries about 50 MB, 5 MB compressed (tools/gpu_run.sh unpacks both).
tar -C .gpu -cJf .gpu/lib.tar.xz lib && rm -rf .gpu/lib
ls .gpu/bin
tar -C .gpu -cf - bin | xz -T0 -6 >.gpu/bin.tar.xz && rm -rf .gpu/bin
# GPU_BUNDLE_DATA=1 adds the Fashion-MNIST files (30 MB) for the training jobs; the GPU machine has no
# Debian package for them.
if [ "${GPU_BUNDLE_DATA:-0}" = 1 ]; then
  mkdir -p .gpu/data
  cp /usr/share/datasets/fashion-mnist/*.gz .gpu/data/
fi
du -sh .gpu
