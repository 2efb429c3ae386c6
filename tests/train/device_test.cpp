// train.device: which texts name a device, which device each rank of a node takes, and the errors
// when the device is not there.
#include "lockstep/train/device.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/train/config.h"

namespace lockstep::train {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainDevice, ParsesCpuCudaAndCudaN) {
  EXPECT_FALSE(parse_device_spec("cpu").cuda);
  const DeviceSpec cuda = parse_device_spec("cuda");
  EXPECT_TRUE(cuda.cuda);
  EXPECT_EQ(cuda.index, -1);
  EXPECT_EQ(parse_device_spec("cuda:0").index, 0);
  EXPECT_EQ(parse_device_spec("cuda:12").index, 12);
  for (const char* text : {"cpu", "cuda", "cuda:0", "cuda:7"}) EXPECT_EQ(parse_device_spec(text).to_string(), text);
}

TEST(TrainDevice, RefusesWhatIsNotADevice) {
  for (const char* text :
       {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:+1", "cuda:01", "cuda:1x", " cpu", "cuda:99999", "", "mps"}) {
    const std::string e = error_of([&] { parse_device_spec(text); });
    EXPECT_NE(e.find(std::string("'") + text + "' is not a device"), std::string::npos) << text << ": " << e;
  }
}

TEST(TrainDevice, EachRankOfANodeTakesItsLocalRanksGpu) {
  EXPECT_EQ(cuda_index_for(parse_device_spec("cpu"), 3, 0, "none"), -1);
  EXPECT_EQ(cuda_index_for(parse_device_spec("cuda"), -1, 2, ""), 0);  // no launcher: the first device
  EXPECT_EQ(cuda_index_for(parse_device_spec("cuda"), 0, 2, ""), 0);
  EXPECT_EQ(cuda_index_for(parse_device_spec("cuda"), 1, 2, ""), 1);
  EXPECT_EQ(cuda_index_for(parse_device_spec("cuda:1"), 0, 2, ""), 1);  // an explicit device wins
  const std::string too_many = error_of([] { cuda_index_for(parse_device_spec("cuda"), 2, 2, ""); });
  EXPECT_NE(too_many.find("LOCAL_RANK 2 has none: this process sees 2 CUDA device(s)"), std::string::npos) << too_many;
  const std::string missing = error_of([] { cuda_index_for(parse_device_spec("cuda:3"), -1, 2, ""); });
  EXPECT_NE(missing.find("train.device = cuda:3, but this process sees 2 CUDA device(s): cuda:0 to cuda:1"),
            std::string::npos)
      << missing;
  const std::string none = error_of([] { cuda_index_for(parse_device_spec("cuda"), -1, 0, "no driver here"); });
  EXPECT_NE(none.find("train.device = cuda, but no driver here; use the CPU (train.device = cpu)"), std::string::npos)
      << none;
}

TEST(TrainDevice, WithoutAGpuAskingForCudaSaysWhy) {
  if (LOCKSTEP_HAVE_CUDA && torch::cuda::device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  const std::string e = error_of([] { cuda_index_for(parse_device_spec("cuda")); });
  const char* why = LOCKSTEP_HAVE_CUDA ? "no CUDA device visible" : "built without CUDA";
  EXPECT_NE(e.find(why), std::string::npos) << e;
}

TEST(TrainDevice, TheConfigRefusesAMalformedDeviceWhenSet) {
  Config c(lockstep_schema());
  c.set_from_string("train.device=cuda:1");
  EXPECT_EQ(c.get_string("train.device"), "cuda:1");
  const std::string e = error_of([&] { c.set_from_string("train.device=gpu0"); });
  EXPECT_NE(e.find("train.device = \"gpu0\" is not valid"), std::string::npos) << e;
  EXPECT_NE(e.find("use cpu, cuda or cuda:N"), std::string::npos) << e;
  EXPECT_EQ(c.get_string("train.device"), "cuda:1");  // a refused value changes nothing
  EXPECT_EQ(lockstep_schema().find("train.device")->constraint_text(), "cpu, cuda or cuda:N");
}

}  // namespace
}  // namespace lockstep::train
