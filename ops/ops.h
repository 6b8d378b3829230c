// Every tensor-level op, for code that wants them all.
#pragma once

#include "ops/activation.h"   // relu, gelu
#include "ops/elementwise.h"  // add, scale, mul, to_device
#include "ops/linear.h"       // linear with fused activation
#include "ops/loss.h"         // cross_entropy, mse_loss, argmax, count_correct, accuracy
