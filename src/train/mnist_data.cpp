// Fashion-MNIST as training data (one bucket of 28x28 images, the test split for evaluation), and
// the choice between it and an image folder.
#include <numeric>

#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/data/batch.h"
#include "lockstep/data/image_set.h"
#include "lockstep/train/step_geometry.h"
#include "train_data.h"

namespace lockstep::train {
namespace {

class FashionMnistData final : public TrainData {
 public:
  FashionMnistData(data::ImageSet train, data::ImageSet test, const data::PlanOptions& options, int64_t subset,
                   const std::string& dir)
      : train_(std::move(train)), plan_options_(options) {
    // Evaluation measures the model on images like those it trained on: another size (a damaged or
    // mixed-up test file) would be reported as a PSNR of something else.
    LOCKSTEP_THROW_IF_NOT(test.height == train_.height && test.width == train_.width, CorruptInput,
                          "Fashion-MNIST's test images are ", test.width, "x", test.height, " but its training images ",
                          train_.width, "x", train_.height, " (",
                          data::fashion_mnist_images_path(dir, data::Split::Test), ")");
    test_.push_back(std::move(test));  // moved, not copied through an initializer list
    LOCKSTEP_CHECK_ARG(options.global_batch <= train_.count, "train.batch_size = ", options.global_batch,
                       " exceeds the ", train_.count, " training images (data.train_subset = ", subset, ")");
    hash_ = fnv1a(train_.pixels.data(), train_.pixels.size());
    steps_per_epoch_ = plan(0).steps();
  }

  int64_t channels() const override { return train_.channels; }
  int64_t training_images() const override { return train_.count; }
  int64_t steps_per_epoch() const override { return steps_per_epoch_; }
  int64_t global_batch() const override { return plan_options_.global_batch; }
  std::vector<data::BucketSize> image_sizes() const override { return {{train_.width, train_.height}}; }
  uint64_t data_hash() const override { return hash_; }

  data::EpochPlan plan(int64_t epoch) const override {
    std::vector<int64_t> ids(static_cast<size_t>(train_.count));
    std::iota(ids.begin(), ids.end(), int64_t{0});
    return data::EpochPlan({std::move(ids)}, plan_options_, epoch);
  }

  StepBatch batch(int64_t step) override {
    const int64_t epoch = step / steps_per_epoch();
    if (epoch != plan_epoch_) {
      plan_ = std::make_unique<data::EpochPlan>(plan(epoch));
      plan_epoch_ = epoch;
    }
    StepBatch out;
    out.images = data::images_to_tensor(train_, plan_->rank_part(step % steps_per_epoch(), world_size_, rank_));
    return out;
  }

  const std::vector<data::ImageSet>& evaluation_images() const override { return test_; }

  std::string describe() const override {
    return detail::concat("Fashion-MNIST: ", train_.count, " training images of ", train_.width, "x", train_.height,
                          ", ", test_.front().count, " test images; ", steps_per_epoch(), " steps per epoch");
  }

  void set_rank(int rank, int world_size) {
    rank_ = rank;
    world_size_ = world_size;
  }

 private:
  data::ImageSet train_;
  std::vector<data::ImageSet> test_;  // one set: the test split
  data::PlanOptions plan_options_;
  uint64_t hash_ = 0;
  int64_t steps_per_epoch_ = 0;
  int rank_ = 0, world_size_ = 1;
  int64_t plan_epoch_ = -1;
  std::unique_ptr<data::EpochPlan> plan_;
};

}  // namespace

std::unique_ptr<TrainData> open_fashion_mnist(const RunSettings& settings, const DataContext& context) {
  const DataSettings& d = settings.data;
  auto data = std::make_unique<FashionMnistData>(
      data::first_images(data::load_fashion_mnist(d.dir(), data::Split::Train), d.train_subset()),
      data::first_images(data::load_fashion_mnist(d.dir(), data::Split::Test), d.test_subset()), plan_options(settings),
      d.train_subset(), d.dir());
  data->set_rank(context.rank, context.world_size);
  return data;
}

std::unique_ptr<TrainData> open_train_data(const RunSettings& settings, const DataContext& context) {
  StepGeometry::of(settings.train).check_ranks(context.world_size);
  LOCKSTEP_CHECK_ARG(settings.data.dataset() != "auto", "open_train_data: data.dataset = auto must be resolved first ",
                     "(resolve_dataset)");
  if (settings.data.dataset() == "folder") return open_image_folder(settings, context);
  return open_fashion_mnist(settings, context);
}

}  // namespace lockstep::train
