#!/usr/bin/env bash
# The runtime outside Bazel: tools/install.sh puts the public headers, libddp.so, ddp.pc, the CMake package and
# ddprun into a prefix (from the Bazel outputs of this build: nothing is compiled twice); a program built with
# Debian's cmake (find_package(ddp), ddp::ddp) and one built by a plain Makefile through pkg-config then run on
# 2 CPU ranks under the installed ddprun. The installed headers are ddp.h, the public headers named beside it
# (tools/public_headers.txt) and what they include, nothing internal, and compile without MPI, NCCL or CUDA on
# the include path.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
source "$root/bazel/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
prefix="$TEST_TMPDIR/prefix"
work="$TEST_TMPDIR/work"
mkdir -p "$work"

"$root/tools/install.sh" --prebuilt "$root" "$prefix" || fail "tools/install.sh failed"
for f in include/ddp.h lib/libddp.so lib/pkgconfig/ddp.pc lib/cmake/ddp/ddpConfig.cmake \
         lib/cmake/ddp/ddpConfigVersion.cmake bin/ddprun include/ddp/runtime/distributed/session.h \
         include/ddp_mpi.h include/ddp_c.h share/ddp/fortran/ddp.f90; do
  [ -f "$prefix/$f" ] || fail "$f was not installed"
done
internal=$(cd "$prefix/include" && find . -name 'world_mpi.h' -o -name 'nccl_communicator.h' -o -name 'process_group_*.h' \
  -o -name 'mpi_nccl_errors.h' -o -name 'dispatch.h' -o -path '*/cpu/*' -o -name '*.cuh')
[ -z "$internal" ] || fail "internal headers were installed: $internal"
printf '#include <%s>\n' ddp.h $(grep -v -e '^#' -e '^$' "$root/tools/public_headers.txt") >"$work/public.cc"
echo 'int main() { return 0; }' >>"$work/public.cc"
"${CXX:-c++}" -std=c++20 -fsyntax-only -I"$prefix/include" -I"$prefix/include/ddp" "$work/public.cc" ||
  fail "the installed ddp.h and public headers do not compile without MPI/NCCL/CUDA include paths"

# CMake.
begin=$(date +%s)
cmake -S "$root/examples/installed/cmake" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" 2>&1 &&
  cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log"; fail "the CMake consumer did not build"; }
out=$("$prefix/bin/ddprun" -np 2 -- "$work/cmake/two_clusters" 2>&1) || fail "the CMake consumer failed: $out"
grep -q '^\[rank 0\] two_clusters: ranks=2 device=cpu accuracy [0-9.]* OK$' <<<"$out" || fail "CMake consumer: $out"
echo "cmake consumer ($(($(date +%s) - begin)) s): $(grep two_clusters <<<"$out")"

# A plain Makefile through pkg-config (the runtime's .pc, and Open MPI's, OpenBLAS's and zlib's it requires).
begin=$(date +%s)
mkdir -p "$work/make" && cp -rL "$root/examples/installed/make/." "$work/make/"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" make -C "$work/make" >"$work/make.log" 2>&1 ||
  { cat "$work/make.log"; fail "the Makefile consumer did not build"; }
out=$("$prefix/bin/ddprun" -np 2 -- "$work/make/ring" 2>&1) || fail "the Makefile consumer failed: $out"
grep -q '^\[rank 0\] ring: ranks=2 device=cpu sum 3.0 OK$' <<<"$out" || fail "Makefile consumer: $out"
echo "make consumer ($(($(date +%s) - begin)) s): $(grep 'ring:' <<<"$out")"
# The C and Fortran programs of an MPI application (examples/embedded) through CMake and through pkg-config,
# each at 2 and 3 ranks under plain mpirun: a surrogate trained on a split communicator while the program keeps
# using its own communicators. Then docs/embedding.md's pkg-config lines and Fortran-only CMake project, as printed.
run_embedded() {  # DIR LABEL
  for ranks in 2 3; do
    for program in surrogate surrogate_f; do
      out=$(cd "$1" && mpirun -np "$ranks" --oversubscribe --bind-to none "./$program" "$TEST_TMPDIR/ckpt-$2-$program-$ranks" 2>&1) ||
        fail "$2 $program at $ranks ranks: $out"
      grep -q "^$program: OK$" <<<"$out" || fail "$2 $program at $ranks ranks: $out"
      echo "$2 $program: $(grep "^$program: ranks" <<<"$out")"
    done
  done
}
begin=$(date +%s)
cmake -S "$root/examples/embedded" -B "$work/embedded-cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$work/embedded-cmake.log" 2>&1 &&
  cmake --build "$work/embedded-cmake" >>"$work/embedded-cmake.log" 2>&1 ||
  { tail -30 "$work/embedded-cmake.log"; fail "the CMake C and Fortran consumers did not build"; }
run_embedded "$work/embedded-cmake" cmake
mkdir -p "$work/embedded-make" && cp -L "$root/examples/embedded/"{Makefile,surrogate.c,surrogate.f90} "$work/embedded-make/"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" make -C "$work/embedded-make" >"$work/embedded-make.log" 2>&1 ||
  { cat "$work/embedded-make.log"; fail "the pkg-config C and Fortran consumers did not build"; }
run_embedded "$work/embedded-make" pkg-config
echo "C and Fortran consumers ($(($(date +%s) - begin)) s)"

# docs/embedding.md's build lines, run as printed there: the fenced block after each `<!-- install_test: NAME -->`,
# in a folder holding the embedded programs as prog.c and prog.f90.
doc_block() {
  awk -v marker="<!-- install_test: $1 -->" '$0 == marker { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    found && inside { print }' "$root/docs/embedding.md"
}
run_prog() {  # DIR PROGRAM NAME_IT_PRINTS LABEL
  out=$(cd "$1" && mpirun -np 2 --oversubscribe --bind-to none "./$2" "$TEST_TMPDIR/ckpt-docs-$4-$2" 2>&1) ||
    fail "$4 $2: $out"
  grep -q "^$3: OK$" <<<"$out" || fail "$4 $2: $out"
  echo "docs $4 $2: $(grep "^$3: ranks" <<<"$out")"
}
for block in pkg-config cmake-fortran; do
  dir="$work/docs-$block"
  mkdir -p "$dir" && cp -L "$root/examples/embedded/surrogate.c" "$dir/prog.c" &&
    cp -L "$root/examples/embedded/surrogate.f90" "$dir/prog.f90"
  lines=$(doc_block "$block")
  [ -n "$lines" ] || fail "docs/embedding.md has no block marked install_test: $block"
  echo "docs/embedding.md, $block:"
  echo "$lines"
done
(cd "$work/docs-pkg-config" && PKG_CONFIG_PATH="$prefix/lib/pkgconfig" bash -euo pipefail -c "$(doc_block pkg-config)") \
  >"$work/docs-pkg-config.log" 2>&1 || { cat "$work/docs-pkg-config.log"; fail "the docs' pkg-config lines failed"; }
run_prog "$work/docs-pkg-config" prog surrogate pkg-config
run_prog "$work/docs-pkg-config" prog_f surrogate_f pkg-config
doc_block cmake-fortran >"$work/docs-cmake-fortran/CMakeLists.txt"
cmake -S "$work/docs-cmake-fortran" -B "$work/docs-cmake-fortran/build" -DCMAKE_PREFIX_PATH="$prefix" \
  >"$work/docs-cmake-fortran.log" 2>&1 && cmake --build "$work/docs-cmake-fortran/build" >>"$work/docs-cmake-fortran.log" 2>&1 ||
  { tail -30 "$work/docs-cmake-fortran.log"; fail "the docs' Fortran-only CMake project did not build"; }
run_prog "$work/docs-cmake-fortran/build" prog_f surrogate_f cmake-fortran
echo "install: all checks passed"
