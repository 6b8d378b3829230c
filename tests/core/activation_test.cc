// Each activation has one spelling: what activation_name writes, parse_activation reads back, and a name it
// does not know is refused with the choices.
#include "runtime/core/activation.h"

#include <gtest/gtest.h>

#include <string>

#include "runtime/core/check.h"

namespace ddp {
namespace {

TEST(ActivationName, ReadsBackWhatItWrites) {
  for (Activation act : {Activation::kRelu, Activation::kGelu, Activation::kTanh, Activation::kSigmoid,
                         Activation::kSilu}) {
    EXPECT_EQ(parse_activation(activation_name(act)), act) << activation_name(act);
  }
  EXPECT_STREQ(activation_name(Activation::kGelu), "gelu");
  EXPECT_STREQ(activation_name(Activation::kSilu), "silu");
  EXPECT_STREQ(activation_name(Activation::kNone), "identity");
}

TEST(ActivationName, AnUnknownNameIsRefusedWithTheChoices) {
  try {
    parse_activation("identity");
    FAIL() << "identity is not an activation a layer applies";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown activation 'identity': use relu, gelu, tanh, sigmoid or silu"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_activation("ReLU"), InvalidArgument);
}

}  // namespace
}  // namespace ddp
