// Multi-rank GoogleTest binaries share one World, made by mpi_gtest_main.cc before the tests run.
#pragma once

#include "runtime/distributed/world.h"

namespace ddp::testing {

World& test_world();

}  // namespace ddp::testing
