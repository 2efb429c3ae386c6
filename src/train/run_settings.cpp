// The table of `lockstep train`'s settings: each key bound to its member of RunSettings, whose
// default it takes, with its limits, help and use. docs/configuration.md documents these keys (a
// test checks that they list the same keys), so change both together.
#include "lockstep/train/run_settings.h"

#include <deque>
#include <type_traits>
#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/data/bucket_table.h"
#include "lockstep/quant/registry.h"
#include "lockstep/train/device.h"
#include "lockstep/train/step_geometry.h"

namespace lockstep::train {
namespace {

// The key "section.name" and an accessor of member section.name() of RunSettings: the key and
// the member cannot disagree.
#define LOCKSTEP_RUN_KEY(section, name) \
#section "." #name, [](auto& settings) -> auto& { return settings.section.name(); }

template <class T>
KeySpec spec_of(std::string key, const T& default_value, std::string help) {
  if constexpr (std::is_same_v<T, bool>) {
    return KeySpec::boolean(std::move(key), default_value, std::move(help));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return KeySpec::integer(std::move(key), default_value, std::move(help));
  } else if constexpr (std::is_same_v<T, double>) {
    return KeySpec::floating(std::move(key), default_value, std::move(help));
  } else if constexpr (std::is_same_v<T, std::string>) {
    return KeySpec::string(std::move(key), default_value, std::move(help));
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return KeySpec::int_list(std::move(key), default_value, std::move(help));
  } else {
    static_assert(std::is_same_v<T, std::vector<double>>, "a setting's type must be one of Value's");
    return KeySpec::float_list(std::move(key), default_value, std::move(help));
  }
}

// Appends the key bound to `member`; its default is the member's in a default RunSettings. Returns
// its schema entry, for the limits and uses to be chained on.
template <class Member>
KeySpec& add(std::deque<RunKey>& keys, const char* key, Member member, std::string help) {
  using T = std::decay_t<decltype(member(std::declval<RunSettings&>()))>;
  const RunSettings defaults;
  RunKey k;
  k.spec = spec_of<T>(key, member(defaults), std::move(help));
  k.read = [member](RunSettings& s, const Value& v) { member(s) = std::get<T>(v); };
  k.write = [member](const RunSettings& s) { return Value(std::in_place_type<T>, member(s)); };
  keys.push_back(std::move(k));
  return keys.back().spec;
}

void add_data_keys(std::deque<RunKey>& keys) {
  // A new dataset adds its name here (and its reader in data/).
  const std::vector<std::string> kDatasets = {"auto", "fashion-mnist", "folder"};
  add(keys, LOCKSTEP_RUN_KEY(data, dataset),
      "What data.dir holds: fashion-mnist (its IDX .gz files), folder (a tree of images), or auto "
      "(fashion-mnist when its files are there, else folder); a run records what auto chose.")
      .one_of(kDatasets);
  add(keys, LOCKSTEP_RUN_KEY(data, dir), "Fashion-MNIST's directory of IDX .gz files, or the root of an image folder.")
      .may_change_on_resume()
      .may_differ_per_rank()
      .shortcut("--data", "DIR",
                "Fashion-MNIST's directory of .gz files, or a folder of images (any depth; see docs/data.md)");
  add(keys, LOCKSTEP_RUN_KEY(data, train_subset), "Use only the first N training images; 0 uses them all.").at_least(0);
  add(keys, LOCKSTEP_RUN_KEY(data, test_subset), "Fashion-MNIST: use only the first N test images; 0 uses them all.")
      .at_least(0);
  add(keys, LOCKSTEP_RUN_KEY(data, buckets),
      "Image folders: the bucket sizes WIDTHxHEIGHT; each image goes to the bucket nearest its aspect "
      "ratio, resized to cover it and centre-cropped.")
      // Checked whatever the dataset, so a bad table is refused, not ignored, on a Fashion-MNIST run.
      .matching("WIDTHxHEIGHT,... (e.g. 256x256,320x224)",
                [](const std::string& v) { data::check_bucket_table(data::parse_bucket_table(v), 1); })
      .shortcut("--buckets", "WxH,...",
                "Image folders: bucket sizes, e.g. 256x256,384x192 (default: 7 sizes of about 256x256)");
  add(keys, LOCKSTEP_RUN_KEY(data, random_flip),
      "Image folders: mirror each training image left to right with probability 1/2 (drawn per image "
      "from the seed, epoch, step and its place in the global batch).");
  add(keys, LOCKSTEP_RUN_KEY(data, random_zoom),
      "Image folders: scale each training image to cover its bucket up to this many times over (uniform "
      "from 1) and crop a window placed at random; 1: the centre crop.")
      .in_range(1, 16);
  add(keys, LOCKSTEP_RUN_KEY(data, remainder),
      "A bucket's last partial global batch in an epoch is dropped (each epoch drops "
      "others) or padded with the bucket's first images.")
      .one_of({"drop", "pad"});
  add(keys, LOCKSTEP_RUN_KEY(data, channels), "Image folders: channels the images are converted to (1 gray, 3 RGB).")
      .in_range(1, 3)
      .one_of({"1", "3"});
  add(keys, LOCKSTEP_RUN_KEY(data, eval_images),
      "Image folders: images held out for evaluation (those whose paths hash lowest); 0 holds out "
      "a tenth of the readable images, at least 1 and at most 64.")
      .at_least(0);
  add(keys, LOCKSTEP_RUN_KEY(data, workers), "Image folders: threads decoding images ahead of the training step.")
      .in_range(1, 64)
      .may_change_on_resume()
      .may_differ_per_rank();
  add(keys, LOCKSTEP_RUN_KEY(data, prefetch), "Image folders: steps the loader may decode ahead.")
      .in_range(1, 1024)
      .may_change_on_resume()
      .may_differ_per_rank();
}

void add_model_keys(std::deque<RunKey>& keys) {
  add(keys, LOCKSTEP_RUN_KEY(model, architecture),
      "conv: strided convolutions with residual blocks at the lowest resolution; vqgan: taming-"
      "transformers' VQGAN encoder and decoder (GroupNorm residual blocks at every level, "
      "self-attention), see docs/models.md.")
      .one_of({"conv", "vqgan"});
  add(keys, LOCKSTEP_RUN_KEY(model, channels),
      "Channels at each resolution level; each level after the first halves the image size.")
      .in_range(1, 1024)
      .length(1, 5);
  add(keys, LOCKSTEP_RUN_KEY(model, res_blocks),
      "conv: residual blocks at the lowest resolution, in the encoder and in the decoder. vqgan: "
      "residual blocks per level in the encoder (at least 1), one more per level in the decoder.")
      .in_range(0, 8);
  add(keys, LOCKSTEP_RUN_KEY(model, batch_norm),
      "conv only: BatchNorm in the residual blocks. On several ranks each normalises with its own "
      "batch's statistics and the running estimates are averaged over ranks after every step.");
  add(keys, LOCKSTEP_RUN_KEY(model, attention_levels),
      "vqgan only: levels (0 = full resolution, len(channels) - 1 = the lowest) with single-head "
      "self-attention after each residual block; its cost grows with (h*w)^2 at that level.")
      .in_range(0, 4)
      .length(0, 5);
  add(keys, LOCKSTEP_RUN_KEY(model, mid_attention),
      "vqgan only: self-attention between the two middle residual blocks at the lowest resolution.");
  add(keys, LOCKSTEP_RUN_KEY(model, norm_groups),
      "vqgan only: GroupNorm groups; every entry of model.channels must be a multiple of it.")
      .in_range(1, 1024);
}

void add_train_keys(std::deque<RunKey>& keys) {
  add(keys, LOCKSTEP_RUN_KEY(train, epochs), "Passes over the training set.")
      .in_range(1, 100000)
      .may_change_on_resume()
      .shortcut("--epochs", "INT", "Epochs to train");
  add(keys, LOCKSTEP_RUN_KEY(train, steps), "Stop after this many optimizer steps; 0 runs all the epochs.")
      .at_least(0)
      .may_change_on_resume()
      .shortcut("--steps", "INT", "Stop after this many steps (0 = all epochs)");
  add(keys, LOCKSTEP_RUN_KEY(train, batch_size), "Training images per optimizer step.")
      .in_range(1, 65536)
      .shortcut("--batch-size", "INT", "Images per step, over all ranks")
      .shortcut("--global-batch", "INT",
                "Images per step, over all ranks: each rank takes its part (the same as --batch-size)");
  add(keys, LOCKSTEP_RUN_KEY(train, lr), "Learning rate of the optimizer.")
      .greater_than(0)
      .at_most(10)
      .shortcut("--lr", "FLOAT", "Learning rate");
  add(keys, LOCKSTEP_RUN_KEY(train, warmup_steps),
      "Steps over which the learning rate rises linearly from lr / warmup_steps to lr; 0: none.")
      .at_least(0);
  add(keys, LOCKSTEP_RUN_KEY(train, lr_decay),
      "After the warm-up: constant, or cosine from lr down to lr x train.lr_final_ratio at the last step.")
      .one_of({"constant", "cosine"});
  add(keys, LOCKSTEP_RUN_KEY(train, lr_final_ratio), "Cosine decay: the last step's learning rate as a fraction of lr.")
      .in_range(0, 1);
  add(keys, LOCKSTEP_RUN_KEY(train, grad_clip),
      "Clip the gradients to this global L2 norm (the same on every rank, after their mean); 0: no "
      "clipping.")
      .in_range(0, 1e6);
  add(keys, LOCKSTEP_RUN_KEY(train, precision),
      "float32, or bfloat16: the training forward (model, losses, discriminator) under autocast to "
      "bfloat16; quantizers, gradients, optimizer state and evaluation stay float32.")
      .one_of({"float32", "bfloat16"});
  add(keys, LOCKSTEP_RUN_KEY(train, grad_accum),
      "Gradient accumulation: each step's global batch is cut into this many micro-batches, run "
      "forward and backward one after the other (memory for one); it must divide train.batch_size.")
      .in_range(1, 4096);
  add(keys, LOCKSTEP_RUN_KEY(train, shard_size),
      "0: each rank's part of a micro-batch is one forward and backward, and gradients are summed over "
      "ranks in float32 (each step equals one process's to rounding). n > 0: the global batch is cut "
      "into shards of n images that ranks hold whole; each shard is its own forward and backward, and "
      "gradients and losses are summed exactly, so a run on any number of ranks is bit for bit the "
      "one-process run, step after step (with the same train.threads).")
      .in_range(0, 65536);
  add(keys, LOCKSTEP_RUN_KEY(train, ema_decay),
      "Keep a moving average of the weights (a <- decay a + (1 - decay) w after each step), saved and "
      "evaluated beside them; 0: none.")
      .at_least(0)
      .less_than(1);
  add(keys, LOCKSTEP_RUN_KEY(train, weight_decay), "Weight decay of the optimizer; 0 turns it off.").in_range(0, 10);
  add(keys, LOCKSTEP_RUN_KEY(train, seed), "Seed for weight initialisation and data shuffling; same seed, same run.")
      .at_least(0)
      .shortcut("--seed", "INT", "Seed of every random choice");
  add(keys, LOCKSTEP_RUN_KEY(train, threads),
      "Intra-op CPU threads per rank; 0 uses OMP_NUM_THREADS when set, else this machine's cores shared "
      "among the ranks on it (LOCAL_WORLD_SIZE).")
      .at_least(0)
      .may_change_on_resume()
      .may_differ_per_rank()
      .shortcut("--threads", "INT",
                "Intra-op threads (0 = OMP_NUM_THREADS when set, else the cores shared among the ranks on this node)");
  add(keys, LOCKSTEP_RUN_KEY(train, device),
      "Where each rank trains: cpu, cuda (under a launcher, the rank's LOCAL_RANK'th GPU) or cuda:N. "
      "Distributed runs on CUDA move tensors with NCCL.")
      // The reason in a word: the key, the value and the forms accepted are the message around it.
      .matching("cpu, cuda or cuda:N",
                [](const std::string& v) {
                  try {
                    parse_device_spec(v);
                  } catch (const InvalidArgument&) {
                    throw InvalidArgument("not a device");
                  }
                })
      .shortcut("--device", "DEVICE", "cpu, cuda (under a launcher, each rank its LOCAL_RANK'th GPU) or cuda:N")
      .may_change_on_resume()
      .may_differ_per_rank();
  add(keys, LOCKSTEP_RUN_KEY(train, grad_bucket_kb),
      "Distributed runs: gradients are all-reduced in buckets of about this many KiB, each sent "
      "as soon as backward has produced it.")
      .in_range(1, 1 << 20)
      .may_change_on_resume();
  add(keys, LOCKSTEP_RUN_KEY(train, log_every), "Steps between two lines of training metrics.")
      .at_least(1)
      .may_change_on_resume();
  add(keys, LOCKSTEP_RUN_KEY(train, checkpoint_every), "Steps between checkpoints; 0 saves only at the end.")
      .at_least(0)
      .may_change_on_resume();
  add(keys, LOCKSTEP_RUN_KEY(train, eval_every), "Steps between test-set evaluations; 0 evaluates only at the end.")
      .at_least(0)
      .may_change_on_resume();
}

void add_loss_keys(std::deque<RunKey>& keys) {
  add(keys, LOCKSTEP_RUN_KEY(loss, l2), "Weight of the mean squared error between image and reconstruction.")
      .in_range(0, 1e6);
  add(keys, LOCKSTEP_RUN_KEY(loss, l1), "Weight of the mean absolute error between image and reconstruction.")
      .in_range(0, 1e6);
  add(keys, LOCKSTEP_RUN_KEY(loss, perceptual),
      "Weight of the LPIPS distance between image and reconstruction (needs loss.lpips_weights); 0: "
      "none.")
      .in_range(0, 1e6);
  add(keys, LOCKSTEP_RUN_KEY(loss, lpips_weights),
      "LPIPS-VGG weights as a safetensors file (docs/losses.md): the perceptual loss's network, and "
      "an LPIPS figure in every evaluation; empty: none.")
      .may_change_on_resume()
      .may_differ_per_rank();
  add(keys, LOCKSTEP_RUN_KEY(loss, adversarial),
      "Weight of the adversarial loss from a PatchGAN discriminator trained beside the model; 0: "
      "no discriminator.")
      .in_range(0, 1e6);
  add(keys, LOCKSTEP_RUN_KEY(loss, gan_loss), "The adversarial objective: hinge or non_saturating.")
      .one_of({"hinge", "non_saturating"});
  add(keys, LOCKSTEP_RUN_KEY(loss, gan_start_step),
      "The discriminator trains, and the adversarial loss counts, from this step on.")
      .at_least(0);
  add(keys, LOCKSTEP_RUN_KEY(loss, adaptive_weight),
      "Scale the adversarial loss by |grad of the reconstruction losses| / |grad of the adversarial "
      "loss| at the decoder's last layer (over the global batch), as VQGAN does.");
  add(keys, LOCKSTEP_RUN_KEY(loss, lecam),
      "Weight of LeCam regularisation of the discriminator (its outputs kept near moving averages of "
      "the other side's); 0: none.")
      .in_range(0, 1e6);
  add(keys, LOCKSTEP_RUN_KEY(loss, disc_lr), "Learning rate of the discriminator's optimizer; 0: train.lr.")
      .in_range(0, 10);
  add(keys, LOCKSTEP_RUN_KEY(loss, disc_channels),
      "Channels of the discriminator's first layer (doubling per layer, "
      "at most 8x).")
      .in_range(1, 1024);
  add(keys, LOCKSTEP_RUN_KEY(loss, disc_layers),
      "Stride-2 layers of the PatchGAN discriminator; each output judges a patch of the image.")
      .in_range(1, 6);
}

void add_eval_keys(std::deque<RunKey>& keys) {
  add(keys, LOCKSTEP_RUN_KEY(eval, batch_size), "Test images per batch when evaluating.")
      .in_range(1, 65536)
      .may_change_on_resume();
  add(keys, LOCKSTEP_RUN_KEY(eval, fid_weights),
      "pytorch-fid's Inception weights as a safetensors file (docs/losses.md): every evaluation adds "
      "rFID, the held-out images against their reconstructions; empty: none.")
      .may_change_on_resume()
      .may_differ_per_rank();
  add(keys, LOCKSTEP_RUN_KEY(eval, grid_images), "Test images shown beside their reconstructions in the PNG grid.")
      .in_range(1, 256)
      .may_change_on_resume();
}

// Every key, in the order the schema and docs/configuration.md list them.
std::vector<RunKey> build_run_keys() {
  std::deque<RunKey> keys;
  add_data_keys(keys);
  add_model_keys(keys);
  // The quantizer's own sections follow this key in the schema (config_schema.cpp).
  add(keys, LOCKSTEP_RUN_KEY(quantizer, name), "Which quantizer turns the encoder's output into tokens.")
      .one_of(quant::quantizer_names())
      .shortcut("--quantizer", "NAME", "Quantizer");
  add_train_keys(keys);
  add_loss_keys(keys);
  add_eval_keys(keys);
  return {std::make_move_iterator(keys.begin()), std::make_move_iterator(keys.end())};
}

#undef LOCKSTEP_RUN_KEY

}  // namespace

const std::vector<RunKey>& run_keys() {
  static const std::vector<RunKey> keys = build_run_keys();
  return keys;
}

RunSettings read_run_settings(const Config& config) {
  RunSettings settings;
  for (const RunKey& k : run_keys()) k.read(settings, config.get(k.spec.key));
  return settings;
}

RunSettings run_settings(const Config& config) {
  RunSettings settings = read_run_settings(config);
  check_run_settings(settings);
  return settings;
}

void record_run_settings(const RunSettings& settings, Config& config) {
  for (const RunKey& k : run_keys()) {
    Value value = k.write(settings);
    if (value != config.get(k.spec.key)) config.set(k.spec.key, std::move(value));
  }
}

void check_run_settings(const RunSettings& s) {
  const TrainSettings& t = s.train;
  StepGeometry::of(t).check();
  // Fashion-MNIST's 28x28 images are used as they are.
  LOCKSTEP_CHECK_ARG(s.data.dataset() != "fashion-mnist" || (!s.data.random_flip() && s.data.random_zoom() == 1.0),
                     "data.random_flip and data.random_zoom apply to image folders; this run trains on Fashion-MNIST "
                     "(data.dir = ",
                     s.data.dir(), ")");
  // Shards are whole passes: statistics of one pass (BatchNorm's) or gradients compared over the
  // whole batch (VQGAN's adaptive weight) would be a shard's.
  LOCKSTEP_CHECK_ARG(t.shard_size() == 0 || !s.model.batch_norm(), "train.shard_size = ", t.shard_size(),
                     " runs each shard as its own pass, so model.batch_norm would normalise with a shard's "
                     "statistics; set one of them off");
  LOCKSTEP_CHECK_ARG(t.shard_size() == 0 || s.loss.adversarial() <= 0, "train.shard_size = ", t.shard_size(),
                     " does not support loss.adversarial = ", s.loss.adversarial(),
                     " (the discriminator's step and the adaptive weight take the whole batch); set one of them to 0");
  const LossSettings& l = s.loss;
  LOCKSTEP_CHECK_ARG(l.perceptual() == 0 || !l.lpips_weights().empty(), "loss.perceptual = ", l.perceptual(),
                     " needs loss.lpips_weights, the LPIPS-VGG weights file (docs/losses.md)");
  LOCKSTEP_CHECK_ARG(l.adversarial() <= 0 || !l.adaptive_weight() || l.l2() + l.l1() + l.perceptual() > 0,
                     "loss.adaptive_weight compares the adversarial loss's gradient with the reconstruction "
                     "losses', but loss.l2, loss.l1 and loss.perceptual are all 0");
}

namespace {
std::vector<std::string> keys_where(bool KeySpec::*use) {
  std::vector<std::string> keys;
  for (const RunKey& k : run_keys()) {
    if (k.spec.*use) keys.push_back(k.spec.key);
  }
  return keys;
}
}  // namespace

std::vector<std::string> resumable_keys() { return keys_where(&KeySpec::resumable); }
std::vector<std::string> per_rank_keys() { return keys_where(&KeySpec::per_rank); }

}  // namespace lockstep::train
