// Every tensor-level op, for code that wants them all.
#pragma once

#include "runtime/ops/activation.h"   // relu, gelu, silu
#include "runtime/ops/elementwise.h"  // add, scale, mul, to_device
#include "runtime/ops/layers.h"       // layer_norm, frequency_encoding, dropout, embedding, columns
#include "runtime/ops/linear.h"       // linear with fused activation
#include "runtime/ops/loss.h"         // cross_entropy, mse_loss, argmax, count_correct, accuracy
