#!/usr/bin/env bash
# Installs the runtime into PREFIX for programs built with CMake, a plain Makefile or anything else:
#   PREFIX/include/ddp.h, and under PREFIX/include/ddp/ the public headers tools/public_headers.txt names and
#   exactly the headers these and ddp.h include (nothing internal);
#   PREFIX/include/ddp_mpi.h (a Session on an application's MPI_Comm) and PREFIX/include/ddp_c.h (the C API);
#   PREFIX/share/ddp/fortran/ddp.f90, the Fortran module's source (programs compile it with their compiler);
#   PREFIX/lib/libddp.so, the whole runtime as one shared library, the C API included;
#   PREFIX/lib/pkgconfig/ddp.pc                 pkg-config --cflags --libs ddp
#   PREFIX/lib/cmake/ddp/ddpConfig.cmake        find_package(ddp) gives the imported targets ddp::ddp (C++),
#                                               ddp::ddp_c (C) and ddp::fortran (the module, compiled into
#                                               the program), for the languages the project enables
#   PREFIX/bin/ddprun, the launcher.
# Both ddp.pc and ddp::ddp carry the CUDA, NCCL, MPI (Open MPI, through pkg-config's mpi-c or CMake's FindMPI)
# and OpenBLAS include and link flags, and C++20.
#
#   tools/install.sh PREFIX                     builds //:libddp and //launcher:ddprun with Bazel, then installs
#   tools/install.sh --prebuilt DIR PREFIX      installs from DIR without building: DIR holds ddp.h, the
#                                               public headers and what they include, tools/public_headers.txt,
#                                               ddp_mpi.h, capi/ddp_c.h, capi/ddp.f90,
#                                               libddp.so and launcher/ddprun (what a Bazel test's runfiles hold:
#                                               tests/api/install_test.sh)
# CUDA_HOME (default /usr/local/cuda, where the build takes it from) names the CUDA toolkit the flags point at.
# Installing again over an older copy replaces its files; nothing else under PREFIX is touched.
set -euo pipefail
usage() { echo "usage: tools/install.sh [--prebuilt DIR] PREFIX" >&2; exit 2; }

version=0.1.0
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
prebuilt=""
if [ "${1:-}" = "--prebuilt" ]; then
  [ $# -eq 3 ] || usage
  prebuilt="$2"
  shift 2
fi
[ $# -eq 1 ] || usage
case "$1" in -*) usage ;; esac
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"

if [ -n "$prebuilt" ]; then
  src="$prebuilt"
  bin="$prebuilt"
else
  cd "$(dirname "$0")/.."
  bazel build //:libddp //launcher:ddprun
  src="$PWD"
  bin="$(bazel info bazel-bin 2>/dev/null)"
fi
for f in "$src/ddp.h" "$src/tools/public_headers.txt" "$src/ddp_mpi.h" "$src/capi/ddp_c.h" "$src/capi/ddp.f90" \
         "$bin/libddp.so" "$bin/launcher/ddprun"; do
  [ -e "$f" ] || { echo "install: $f is missing" >&2; exit 1; }
done

# The public headers: ddp.h, those included by name beside it, and every header of the runtime they reach, as the
# compiler sees them.
public_tu=$(printf '#include <%s>\n' ddp.h $(grep -v -e '^#' -e '^$' "$src/tools/public_headers.txt"))
headers=$("${CXX:-c++}" -std=c++20 -MM -MT ddp -I"$src" -x c++ - <<<"$public_tu" | tr ' \\' '\n\n' |
  grep -v -e '^$' -e '^ddp:$' -e '^-$')
mkdir -p "$prefix/include/ddp" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/ddp" "$prefix/bin" "$prefix/share/ddp/fortran"
count=0
while read -r header; do
  case "$header" in
    "$src/ddp.h") continue ;;
    "$src"/*) relative="${header#"$src"/}" ;;
    *) echo "install: a public header reaches $header, which is not the runtime's" >&2; exit 1 ;;
  esac
  mkdir -p "$prefix/include/ddp/$(dirname "$relative")"
  install -m 0644 "$header" "$prefix/include/ddp/$relative"
  count=$((count + 1))
done <<<"$headers"
install -m 0644 "$src/ddp.h" "$prefix/include/ddp.h"
install -m 0644 "$src/ddp_mpi.h" "$prefix/include/ddp_mpi.h"
install -m 0644 "$src/capi/ddp_c.h" "$prefix/include/ddp_c.h"
install -m 0644 "$src/capi/ddp.f90" "$prefix/share/ddp/fortran/ddp.f90"
install -m 0755 "$bin/libddp.so" "$prefix/lib/libddp.so"
install -m 0755 "$bin/launcher/ddprun" "$prefix/bin/ddprun"

# pkg-config: relocatable (${pcfiledir}), MPI, OpenBLAS and zlib through their own .pc files.
cat >"$prefix/lib/pkgconfig/ddp.pc" <<EOF
prefix=\${pcfiledir}/../..
includedir=\${prefix}/include
libdir=\${prefix}/lib
cudadir=$cuda_home
# The Fortran module's source: compile it with the program (mpifort \$(pkg-config --variable=fortran_module ddp) ...).
fortran_module=\${prefix}/share/ddp/fortran/ddp.f90

Name: ddp
Description: Data-parallel training in C++: DistributedDataParallel over NCCL (GPUs) and MPI (CPUs)
Version: $version
Requires: mpi-c openblas zlib
Cflags: -I\${includedir} -I\${includedir}/ddp -I\${cudadir}/include -DOMPI_SKIP_MPICXX=1
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lddp -L\${cudadir}/lib64 -Wl,-rpath,\${cudadir}/lib64 -lnccl -lcublasLt -lcublas -lcudart -lpthread
EOF

# CMake: the imported target ddp::ddp, found relative to this file.
cat >"$prefix/lib/cmake/ddp/ddpConfig.cmake" <<EOF
# find_package(ddp) gives the imported target ddp::ddp: the runtime's shared library, ddp.h on the include path,
# C++20, and the CUDA, NCCL, MPI and OpenBLAS flags. Written by tools/install.sh.
include(CMakeFindDependencyMacro)
get_filename_component(_ddp_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(_ddp_cuda "$cuda_home")
# MPI for the languages the project enables: C++ (ddp::ddp), C (ddp::ddp_c), Fortran (ddp::fortran).
get_property(_ddp_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
set(_ddp_mpi_components)
foreach(_ddp_language CXX C Fortran)
  if(_ddp_language IN_LIST _ddp_languages)
    list(APPEND _ddp_mpi_components \${_ddp_language})
  endif()
endforeach()
# FindThreads compiles a C or C++ test, which a Fortran-only project cannot: there the thread library is named
# as the pkg-config file names it.
if("C" IN_LIST _ddp_languages OR "CXX" IN_LIST _ddp_languages)
  find_dependency(Threads)
  set(_ddp_threads Threads::Threads)
else()
  set(_ddp_threads -lpthread)
endif()
find_dependency(ZLIB)
set(MPI_CXX_SKIP_MPICXX ON)  # Open MPI's C++ bindings are not used (and break the link)
find_dependency(MPI COMPONENTS \${_ddp_mpi_components})
set(_ddp_libraries)
foreach(_ddp_lib nccl cublasLt cublas cudart)
  find_library(DDP_\${_ddp_lib}_LIBRARY NAMES \${_ddp_lib} HINTS "\${_ddp_cuda}/lib64" NO_DEFAULT_PATH)
  if(NOT DDP_\${_ddp_lib}_LIBRARY)
    set(ddp_FOUND FALSE)
    set(ddp_NOT_FOUND_MESSAGE "ddp: lib\${_ddp_lib} is not in \${_ddp_cuda}/lib64 (install the CUDA toolkit and NCCL there, or reinstall ddp with CUDA_HOME set)")
    return()
  endif()
  list(APPEND _ddp_libraries "\${DDP_\${_ddp_lib}_LIBRARY}")
endforeach()
find_library(DDP_openblas_LIBRARY NAMES openblas)
if(NOT DDP_openblas_LIBRARY)
  set(ddp_FOUND FALSE)
  set(ddp_NOT_FOUND_MESSAGE "ddp: OpenBLAS not found (apt-get install libopenblas-dev)")
  return()
endif()
set(_ddp_link "\${_ddp_libraries};\${DDP_openblas_LIBRARY};ZLIB::ZLIB;\${_ddp_threads}")
if("C" IN_LIST _ddp_languages AND NOT TARGET ddp::ddp_c)
  # The C API: ddp_c.h (it includes mpi.h) and the same library.
  add_library(ddp::ddp_c SHARED IMPORTED)
  set_target_properties(ddp::ddp_c PROPERTIES
    IMPORTED_LOCATION "\${_ddp_prefix}/lib/libddp.so"
    IMPORTED_SONAME "libddp.so"
    INTERFACE_INCLUDE_DIRECTORIES "\${_ddp_prefix}/include"
    INTERFACE_LINK_LIBRARIES "MPI::MPI_C;\${_ddp_link}")
endif()
if("Fortran" IN_LIST _ddp_languages AND NOT TARGET ddp::fortran)
  # The Fortran module: its source is compiled into each program that links this (a .mod file is specific to
  # the compiler), over the C API in libddp.so.
  add_library(ddp::fortran INTERFACE IMPORTED)
  set_target_properties(ddp::fortran PROPERTIES
    INTERFACE_SOURCES "\${_ddp_prefix}/share/ddp/fortran/ddp.f90"
    INTERFACE_LINK_LIBRARIES "\${_ddp_prefix}/lib/libddp.so;MPI::MPI_Fortran;\${_ddp_link}")
endif()
if("CXX" IN_LIST _ddp_languages AND NOT TARGET ddp::ddp)
  add_library(ddp::ddp SHARED IMPORTED)
  set_target_properties(ddp::ddp PROPERTIES
    IMPORTED_LOCATION "\${_ddp_prefix}/lib/libddp.so"
    IMPORTED_SONAME "libddp.so"
    INTERFACE_INCLUDE_DIRECTORIES "\${_ddp_prefix}/include;\${_ddp_prefix}/include/ddp;\${_ddp_cuda}/include"
    INTERFACE_COMPILE_DEFINITIONS "OMPI_SKIP_MPICXX=1"
    INTERFACE_COMPILE_FEATURES "cxx_std_20"
    INTERFACE_LINK_LIBRARIES "MPI::MPI_CXX;\${_ddp_link}")
endif()
EOF
cat >"$prefix/lib/cmake/ddp/ddpConfigVersion.cmake" <<EOF
# ddp $version: compatible with requests for the same major version and no newer.
set(PACKAGE_VERSION "$version")
string(REGEX MATCH "^[0-9]+" _ddp_major "\${PACKAGE_VERSION}")
if(PACKAGE_FIND_VERSION AND (PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION OR
                             NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL _ddp_major))
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
EOF
echo "install: ddp $version in $prefix ($count headers under include/ddp, ddp_mpi.h, ddp_c.h, the Fortran module, lib/libddp.so, bin/ddprun, pkg-config and CMake files)"
