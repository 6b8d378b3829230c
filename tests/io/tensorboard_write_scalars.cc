// Writes a known series of scalars with TensorBoardWriter into the directory given as argument, for
// tensorboard_events_test.py to decode with a schema of its own: loss = 1/step for steps 1..20, every 5th step
// also test/accuracy = step/100 in the same event.
#include <cstdio>
#include <string>

#include "runtime/io/tensorboard.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  ddp::io::TensorBoardWriter writer(argv[1]);
  for (int step = 1; step <= 20; ++step) {
    if (step % 5 == 0) {
      writer.scalars({{"train/loss", 1.0 / step}, {"test/accuracy", step / 100.0}}, step);
    } else {
      writer.scalar("train/loss", 1.0 / step, step);
    }
  }
  std::printf("%s\n", writer.path().c_str());
  return 0;
}
