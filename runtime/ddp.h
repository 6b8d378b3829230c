// The runtime's public header: include this and depend on //:ddp.
#pragma once

#include "runtime/core/check.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/distributed/nccl_communicator.h"
#include "runtime/distributed/world.h"
