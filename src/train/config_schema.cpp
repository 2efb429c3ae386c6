// Every key `lockstep train` accepts. docs/configuration.md documents this table (a test checks
// that they list the same keys), so change both together.
#include "lockstep/core/error.h"
#include "lockstep/data/bucket_table.h"
#include "lockstep/quant/option_specs.h"
#include "lockstep/train/config.h"
#include "lockstep/train/device.h"

namespace lockstep::train {
namespace {

// One quantizer option as a key of the configuration ("quantizer.vq." + "decay").
KeySpec key_spec(const std::string& prefix, const quant::OptionSpec& o) {
  using Type = quant::OptionSpec::Type;
  KeySpec k = o.type == Type::Bool    ? KeySpec::boolean(prefix + o.key, std::get<bool>(o.default_value), o.help)
              : o.type == Type::Int   ? KeySpec::integer(prefix + o.key, std::get<int64_t>(o.default_value), o.help)
              : o.type == Type::Float ? KeySpec::floating(prefix + o.key, std::get<double>(o.default_value), o.help)
              : o.type == Type::String
                  ? KeySpec::string(prefix + o.key, std::get<std::string>(o.default_value), o.help).one_of(o.choices)
                  : KeySpec::int_list(prefix + o.key, std::get<std::vector<int64_t>>(o.default_value), o.help);
  k.min = o.min;
  k.max = o.max;
  k.min_exclusive = o.min_exclusive;
  k.max_exclusive = o.max_exclusive;
  k.min_len = o.min_len;
  k.max_len = o.max_len;
  return k;
}

Schema build_schema() {
  // The names users may choose; a new quantizer or dataset adds its name here and its section below.
  // (Not taken from quant::quantizer_names(), which would pull torch in; a test keeps them equal.)
  const std::vector<std::string> kDatasets = {"auto", "fashion-mnist", "folder"};
  const std::vector<std::string> kQuantizers = {"fsq",
                                                "lfq",
                                                "vq",
                                                "simvq",
                                                "latent",
                                                "fsp",
                                                "residual-vq",
                                                "residual-fsq",
                                                "residual-lfq",
                                                "residual-simvq",
                                                "grouped-residual-vq",
                                                "grouped-residual-fsq",
                                                "grouped-residual-lfq"};

  Schema s;
  using K = KeySpec;

  s.add(K::string("data.dataset", "auto",
                  "What data.dir holds: fashion-mnist (its IDX .gz files), folder (a tree of images), or auto "
                  "(fashion-mnist when its files are there, else folder); a run records what auto chose.")
            .one_of(kDatasets));
  s.add(K::string("data.dir", "/usr/share/datasets/fashion-mnist",
                  "Fashion-MNIST's directory of IDX .gz files, or the root of an image folder."));
  s.add(K::integer("data.train_subset", 0, "Use only the first N training images; 0 uses them all.").at_least(0));
  s.add(K::integer("data.test_subset", 0, "Fashion-MNIST: use only the first N test images; 0 uses them all.")
            .at_least(0));
  s.add(K::string("data.buckets", "256x256,288x224,224x288,320x224,224x320,384x192,192x384",
                  "Image folders: the bucket sizes WIDTHxHEIGHT; each image goes to the bucket nearest its aspect "
                  "ratio, resized to cover it and centre-cropped.")
            // Checked whatever the dataset, so a bad table is refused, not ignored, on a Fashion-MNIST run.
            .matching("WIDTHxHEIGHT,... (e.g. 256x256,320x224)",
                      [](const std::string& v) { data::check_bucket_table(data::parse_bucket_table(v), 1); }));
  s.add(K::boolean("data.random_flip", false,
                   "Image folders: mirror each training image left to right with probability 1/2 (drawn per image "
                   "from the seed, epoch, step and its place in the global batch)."));
  s.add(K::floating("data.random_zoom", 1.0,
                    "Image folders: scale each training image to cover its bucket up to this many times over (uniform "
                    "from 1) and crop a window placed at random; 1: the centre crop.")
            .in_range(1, 16));
  s.add(K::string("data.remainder", "drop",
                  "A bucket's last partial global batch in an epoch is dropped (each epoch drops "
                  "others) or padded with the bucket's first images.")
            .one_of({"drop", "pad"}));
  s.add(K::integer("data.channels", 3, "Image folders: channels the images are converted to (1 gray, 3 RGB).")
            .in_range(1, 3));
  s.add(K::integer("data.eval_images", 0,
                   "Image folders: images held out for evaluation (those whose paths hash lowest); 0 holds out "
                   "a tenth of the readable images, at least 1 and at most 64.")
            .at_least(0));
  s.add(K::integer("data.workers", 2, "Image folders: threads decoding images ahead of the training step.")
            .in_range(1, 64));
  s.add(K::integer("data.prefetch", 4, "Image folders: steps the loader may decode ahead.").in_range(1, 1024));

  s.add(K::string("model.architecture", "conv",
                  "conv: strided convolutions with residual blocks at the lowest resolution; vqgan: taming-"
                  "transformers' VQGAN encoder and decoder (GroupNorm residual blocks at every level, "
                  "self-attention), see docs/models.md.")
            .one_of({"conv", "vqgan"}));
  s.add(K::int_list("model.channels", {16, 32, 64},
                    "Channels at each resolution level; each level after the first halves the image size.")
            .in_range(1, 1024)
            .length(1, 5));
  s.add(K::integer("model.res_blocks", 1,
                   "conv: residual blocks at the lowest resolution, in the encoder and in the decoder. vqgan: "
                   "residual blocks per level in the encoder (at least 1), one more per level in the decoder.")
            .in_range(0, 8));
  s.add(K::boolean("model.batch_norm", false,
                   "conv only: BatchNorm in the residual blocks. On several ranks each normalises with its own "
                   "batch's statistics and the running estimates are averaged over ranks after every step."));
  s.add(K::int_list("model.attention_levels", {},
                    "vqgan only: levels (0 = full resolution, len(channels) - 1 = the lowest) with single-head "
                    "self-attention after each residual block; its cost grows with (h*w)^2 at that level.")
            .in_range(0, 4)
            .length(0, 5));
  s.add(K::boolean("model.mid_attention", true,
                   "vqgan only: self-attention between the two middle residual blocks at the lowest resolution."));
  s.add(K::integer("model.norm_groups", 32,
                   "vqgan only: GroupNorm groups; every entry of model.channels must be a multiple of it.")
            .in_range(1, 1024));

  s.add(K::string("quantizer.name", "fsq", "Which quantizer turns the encoder's output into tokens.")
            .one_of(kQuantizers));
  // Each quantizer's keys, defaults and limits as the library declares them (quant/option_specs.h).
  for (const auto& section : quant::quantizer_option_sections()) {
    for (const auto& option : section.options) s.add(key_spec("quantizer." + section.name + ".", option));
  }

  s.add(K::integer("train.epochs", 1, "Passes over the training set.").in_range(1, 100000));
  s.add(K::integer("train.steps", 0, "Stop after this many optimizer steps; 0 runs all the epochs.").at_least(0));
  s.add(K::integer("train.batch_size", 64, "Training images per optimizer step.").in_range(1, 65536));
  s.add(K::floating("train.lr", 2e-3, "Learning rate of the optimizer.").greater_than(0).at_most(10));
  s.add(K::integer("train.warmup_steps", 0,
                   "Steps over which the learning rate rises linearly from lr / warmup_steps to lr; 0: none.")
            .at_least(0));
  s.add(K::string("train.lr_decay", "constant",
                  "After the warm-up: constant, or cosine from lr down to lr x train.lr_final_ratio at the last step.")
            .one_of({"constant", "cosine"}));
  s.add(K::floating("train.lr_final_ratio", 0.1, "Cosine decay: the last step's learning rate as a fraction of lr.")
            .in_range(0, 1));
  s.add(K::floating("train.grad_clip", 0.0,
                    "Clip the gradients to this global L2 norm (the same on every rank, after their mean); 0: no "
                    "clipping.")
            .in_range(0, 1e6));
  s.add(K::string("train.precision", "float32",
                  "float32, or bfloat16: the training forward (model, losses, discriminator) under autocast to "
                  "bfloat16; quantizers, gradients, optimizer state and evaluation stay float32.")
            .one_of({"float32", "bfloat16"}));
  s.add(K::integer("train.grad_accum", 1,
                   "Gradient accumulation: each step's global batch is cut into this many micro-batches, run "
                   "forward and backward one after the other (memory for one); it must divide train.batch_size.")
            .in_range(1, 4096));
  s.add(K::floating("train.ema_decay", 0.0,
                    "Keep a moving average of the weights (a <- decay a + (1 - decay) w after each step), saved and "
                    "evaluated beside them; 0: none.")
            .at_least(0)
            .less_than(1));
  s.add(K::floating("train.weight_decay", 0.0, "Weight decay of the optimizer; 0 turns it off.").in_range(0, 10));
  s.add(K::integer("train.seed", 0, "Seed for weight initialisation and data shuffling; same seed, same run.")
            .at_least(0));
  s.add(K::integer("train.threads", 0,
                   "Intra-op CPU threads per rank; 0 uses OMP_NUM_THREADS when set, else this machine's cores shared "
                   "among the ranks on it (LOCAL_WORLD_SIZE).")
            .at_least(0));
  s.add(K::string("train.device", "cpu",
                  "Where each rank trains: cpu, cuda (under a launcher, the rank's LOCAL_RANK'th GPU) or cuda:N. "
                  "Distributed runs on CUDA move tensors with NCCL.")
            // The reason in a word: the key, the value and the forms accepted are the message around it.
            .matching("cpu, cuda or cuda:N", [](const std::string& v) {
              try {
                parse_device_spec(v);
              } catch (const InvalidArgument&) {
                throw InvalidArgument("not a device");
              }
            }));
  s.add(K::integer("train.grad_bucket_kb", 1024,
                   "Distributed runs: gradients are all-reduced in buckets of about this many KiB, each sent "
                   "as soon as backward has produced it.")
            .in_range(1, 1 << 20));
  s.add(K::integer("train.log_every", 50, "Steps between two lines of training metrics.").at_least(1));
  s.add(K::integer("train.checkpoint_every", 500, "Steps between checkpoints; 0 saves only at the end.").at_least(0));
  s.add(K::integer("train.eval_every", 0, "Steps between test-set evaluations; 0 evaluates only at the end.")
            .at_least(0));

  s.add(K::floating("loss.l2", 1.0, "Weight of the mean squared error between image and reconstruction.")
            .in_range(0, 1e6));
  s.add(K::floating("loss.l1", 0.0, "Weight of the mean absolute error between image and reconstruction.")
            .in_range(0, 1e6));
  s.add(K::floating("loss.perceptual", 0.0,
                    "Weight of the LPIPS distance between image and reconstruction (needs loss.lpips_weights); 0: "
                    "none.")
            .in_range(0, 1e6));
  s.add(K::string("loss.lpips_weights", "",
                  "LPIPS-VGG weights as a safetensors file (docs/losses.md): the perceptual loss's network, and "
                  "an LPIPS figure in every evaluation; empty: none."));
  s.add(K::floating("loss.adversarial", 0.0,
                    "Weight of the adversarial loss from a PatchGAN discriminator trained beside the model; 0: "
                    "no discriminator.")
            .in_range(0, 1e6));
  s.add(K::string("loss.gan_loss", "hinge", "The adversarial objective: hinge or non_saturating.")
            .one_of({"hinge", "non_saturating"}));
  s.add(K::integer("loss.gan_start_step", 0,
                   "The discriminator trains, and the adversarial loss counts, from this step on.")
            .at_least(0));
  s.add(K::boolean("loss.adaptive_weight", true,
                   "Scale the adversarial loss by |grad of the reconstruction losses| / |grad of the adversarial "
                   "loss| at the decoder's last layer (over the global batch), as VQGAN does."));
  s.add(K::floating("loss.lecam", 0.0,
                    "Weight of LeCam regularisation of the discriminator (its outputs kept near moving averages of "
                    "the other side's); 0: none.")
            .in_range(0, 1e6));
  s.add(
      K::floating("loss.disc_lr", 0.0, "Learning rate of the discriminator's optimizer; 0: train.lr.").in_range(0, 10));
  s.add(K::integer("loss.disc_channels", 64,
                   "Channels of the discriminator's first layer (doubling per layer, "
                   "at most 8x).")
            .in_range(1, 1024));
  s.add(K::integer("loss.disc_layers", 3,
                   "Stride-2 layers of the PatchGAN discriminator; each output judges a patch of the image.")
            .in_range(1, 6));
  s.add(K::integer("eval.batch_size", 500, "Test images per batch when evaluating.").in_range(1, 65536));
  s.add(K::string("eval.fid_weights", "",
                  "pytorch-fid's Inception weights as a safetensors file (docs/losses.md): every evaluation adds "
                  "rFID, the held-out images against their reconstructions; empty: none."));
  s.add(K::integer("eval.grid_images", 16, "Test images shown beside their reconstructions in the PNG grid.")
            .in_range(1, 256));
  return s;
}

}  // namespace

const Schema& lockstep_schema() {
  static const Schema schema = build_schema();
  return schema;
}

}  // namespace lockstep::train
