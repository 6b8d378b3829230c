// Every tensor-level op, for code that wants them all.
#pragma once

#include "runtime/ops/activation.h"   // relu, gelu
#include "runtime/ops/elementwise.h"  // add, scale, mul, to_device
#include "runtime/ops/linear.h"       // linear with fused activation
#include "runtime/ops/loss.h"         // cross_entropy, mse_loss, argmax, count_correct, accuracy
