// Test entry point: a fixed thread count keeps CPU results reproducible across machines.
#include <gtest/gtest.h>

#include "util/runtime.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  vit::configure_threads(0);
  return RUN_ALL_TESTS();
}
