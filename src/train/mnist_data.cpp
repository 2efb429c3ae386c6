// Fashion-MNIST as training data (one bucket of 28x28 images, the test split for evaluation), and
// the choice between it and an image folder.
#include <filesystem>
#include <numeric>

#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/data/batch.h"
#include "lockstep/data/image_set.h"
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

std::unique_ptr<TrainData> open_fashion_mnist(const Config& config, const DataContext& context) {
  const std::string dir = config.get_string("data.dir");
  const int64_t subset = config.get_int("data.train_subset");
  auto d = std::make_unique<FashionMnistData>(
      data::first_images(data::load_fashion_mnist(dir, data::Split::Train), subset),
      data::first_images(data::load_fashion_mnist(dir, data::Split::Test), config.get_int("data.test_subset")),
      plan_options(config), subset, dir);
  d->set_rank(context.rank, context.world_size);
  return d;
}

std::unique_ptr<TrainData> open_train_data(Config& config, const DataContext& context) {
  const int64_t batch = config.get_int("train.batch_size"), micro = config.get_int("train.grad_accum");
  LOCKSTEP_CHECK_ARG(batch % micro == 0, "train.grad_accum = ", micro, " must divide train.batch_size = ", batch,
                     " (each step's global batch is cut into micro-batches of equal size)");
  LOCKSTEP_CHECK_ARG(batch / micro >= context.world_size, "train.batch_size = ", batch, " is the global batch",
                     micro > 1 ? detail::concat(", cut into ", micro, " micro-batches of ", batch / micro) : "",
                     ": it needs at least one image for each of the ", context.world_size, " ranks",
                     micro > 1 ? " in each micro-batch" : "");
  if (config.get_string("data.dataset") == "auto") {
    const std::string dir = config.get_string("data.dir");
    // Without throwing for a name the system refuses (too long): the loader then says what is wrong.
    std::error_code ec;
    const bool mnist = std::filesystem::exists(data::fashion_mnist_images_path(dir, data::Split::Train), ec);
    // A missing Fashion-MNIST directory keeps its own error (which names the Debian package).
    const bool folder = !mnist && std::filesystem::is_directory(dir, ec);
    config.set("data.dataset", std::string(folder ? "folder" : "fashion-mnist"));
  }
  if (config.get_string("data.dataset") == "folder") return open_image_folder(config, context);
  // Fashion-MNIST's 28x28 images are used as they are.
  LOCKSTEP_CHECK_ARG(!config.get_bool("data.random_flip") && config.get_float("data.random_zoom") == 1.0,
                     "data.random_flip and data.random_zoom apply to image folders; this run trains on Fashion-MNIST "
                     "(data.dir = ",
                     config.get_string("data.dir"), ")");
  return open_fashion_mnist(config, context);
}

}  // namespace lockstep::train
