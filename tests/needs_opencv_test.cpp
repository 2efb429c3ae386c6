// A build without OpenCV cannot read image folders, so the tests that write and decode images are
// compiled out. These stand in for them, so that every test report says what was not run.
#include <gtest/gtest.h>

#include "lockstep/config_build.h"

#if !LOCKSTEP_HAVE_OPENCV
namespace lockstep {
namespace {

constexpr const char* kWhy = "this build has no OpenCV (scripts/install-deps installs it): image-folder tests ";

TEST(NeedsOpenCV, ImageFolderTests) { GTEST_SKIP() << kWhy << "(tests/data/image_folder_test.cpp) not built"; }
TEST(NeedsOpenCV, FolderLoaderTests) { GTEST_SKIP() << kWhy << "(tests/data/folder_loader_test.cpp) not built"; }
TEST(NeedsOpenCV, BucketFittingTests) { GTEST_SKIP() << kWhy << "(tests/data/buckets_test.cpp) not built"; }
TEST(NeedsOpenCV, FolderTrainerTests) { GTEST_SKIP() << kWhy << "(tests/train/folder_trainer_test.cpp) not built"; }
TEST(NeedsOpenCV, DistributedFolderTests) {
  GTEST_SKIP() << kWhy << "(tests/train/distributed_trainer_test.cpp) not built";
}

}  // namespace
}  // namespace lockstep
#endif
