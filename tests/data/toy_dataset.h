// The data set the data-layer tests share: row i has features {i, i + 0.5, -i, ...} (the first `features` of
// them) and label i % 10, so a batch's contents name the rows it holds.
#pragma once

#include <cstdint>

#include "runtime/data/idx.h"

namespace ddp::data::testing {

inline Dataset toy(int64_t n, int64_t features = 2) {
  Dataset d;
  d.size = n;
  d.feature_count = features;
  d.num_classes = 10;
  for (int64_t i = 0; i < n; ++i) {
    const float row[] = {static_cast<float>(i), static_cast<float>(i) + 0.5f, -static_cast<float>(i)};
    for (int64_t f = 0; f < features; ++f) d.features.push_back(row[f % 3]);
    d.labels.push_back(static_cast<int32_t>(i % 10));
  }
  return d;
}

}  // namespace ddp::data::testing
