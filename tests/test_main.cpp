// Test entry point: a fixed thread count keeps CPU results reproducible across machines.
#include <gtest/gtest.h>

#include <cstdio>

#include "model/system_info.h"
#include "util/runtime.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  vit::configure_threads(0);
  // The CPU paths this process takes (the instruction-set matrix runs the kernel tests capped: tests/CMakeLists.txt).
  std::printf("vit-test: paths %s\n", vit::cpu_paths_line().c_str());
  const int status = RUN_ALL_TESTS();
  // ctest runs the fast cases of a test file in one process (tests/ctest_cases.cmake): it reports the group skipped only
  // when this line says that no case ran to a pass or a failure.
  const auto& unit = *::testing::UnitTest::GetInstance();
  if (unit.skipped_test_count() > 0 && unit.successful_test_count() == 0 && unit.failed_test_count() == 0) {
    std::printf("vit-test: every case ran was skipped\n");
  }
  return status;
}
