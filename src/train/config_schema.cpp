// Every key `lockstep train` accepts. docs/configuration.md documents this table (a test checks
// that they list the same keys), so change both together.
#include "lockstep/train/config.h"
#include "lockstep/train/device.h"

namespace lockstep::train {
namespace {

Schema build_schema() {
  // The names users may choose; a new quantizer or dataset adds its name here and its section below.
  // (Not taken from quant::quantizer_names(), which would pull torch in; a test keeps them equal.)
  const std::vector<std::string> kDatasets = {"auto", "fashion-mnist", "folder"};
  const std::vector<std::string> kQuantizers = {"fsq", "lfq", "vq", "residual-vq", "residual-fsq", "residual-lfq"};

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
                  "ratio, resized to cover it and centre-cropped."));
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

  s.add(K::int_list("model.channels", {16, 32, 64},
                    "Channels at each resolution level; each level after the first halves the image size.")
            .in_range(1, 1024)
            .length(1, 5));
  s.add(
      K::integer("model.res_blocks", 1, "Residual blocks at the lowest resolution, in the encoder and in the decoder.")
          .in_range(0, 8));
  s.add(K::boolean("model.batch_norm", false,
                   "BatchNorm in the residual blocks. On several ranks each normalises with its own batch's "
                   "statistics and the running estimates are averaged over ranks after every step."));

  s.add(K::string("quantizer.name", "fsq", "Which quantizer turns the encoder's output into tokens.")
            .one_of(kQuantizers));
  s.add(K::int_list("quantizer.fsq.levels", {8, 5, 5, 5},
                    "FSQ levels per latent channel; the codebook size is their product (8*5*5*5 = 1000).")
            .in_range(2, 256)
            .length(1, 16));
  s.add(K::integer("quantizer.fsq.dim", 0,
                   "Channels fed to FSQ, projected to len(levels) x num_codebooks and back; 0 means no projection.")
            .in_range(0, 4096));
  s.add(K::integer("quantizer.fsq.num_codebooks", 1, "FSQ codebooks per token, each with all the levels.")
            .in_range(1, 64));
  s.add(K::boolean("quantizer.fsq.preserve_symmetry", false,
                   "Symmetric bound 2/(L-1) floor((L-1)(tanh z + 1)/2 + 0.5) - 1 instead of the default."));
  s.add(K::floating("quantizer.fsq.noise_dropout", 0.0,
                    "Training only, needs preserve_symmetry: probability that a code element gets U[-0.5, 0.5) "
                    "noise, clamped to [-1, 1].")
            .at_least(0)
            .less_than(1));
  s.add(K::integer("quantizer.lfq.codebook_size", 1024,
                   "LFQ codebook size K, a power of two; the latent has log2 K channels, one bit each.")
            .in_range(2, 1 << 24));
  s.add(K::integer("quantizer.lfq.dim", 0,
                   "Channels fed to LFQ, projected to num_codebooks x log2 K bits and back; 0 means num_codebooks x "
                   "log2 K.")
            .in_range(0, 4096));
  s.add(K::floating("quantizer.lfq.entropy_loss_weight", 0.1, "Weight of the entropy loss (per-sample minus codebook).")
            .at_least(0));
  // The reference (and LfqOptions) default to 0; without it an autoencoder's straight-through
  // latents drift and the codes collapse (10 of 1024 used after 300 demo steps, 1010 with 0.25).
  s.add(K::floating("quantizer.lfq.commitment_loss_weight", 0.25,
                    "Weight of the commitment loss mse(x, code); 0 leaves it out. The reference defaults to 0, "
                    "which lets training collapse onto few codes.")
            .at_least(0));
  s.add(K::floating("quantizer.lfq.diversity_gamma", 1.0,
                    "How much the codebook entropy (usage across the global batch) counts in the entropy loss.")
            .at_least(0));
  s.add(K::floating("quantizer.lfq.inv_temperature", 100.0, "Inverse temperature of the code probabilities.")
            .greater_than(0));
  s.add(K::floating("quantizer.lfq.codebook_scale", 1.0, "Each code coordinate is +scale or -scale.").greater_than(0));
  s.add(K::boolean("quantizer.lfq.spherical", false,
                   "Binary spherical quantization: l2-normalise the latent and the codes (times the scale)."));
  s.add(K::integer("quantizer.lfq.num_codebooks", 1, "LFQ codebooks per token, each of log2 K bits.").in_range(1, 64));
  s.add(K::floating("quantizer.lfq.frac_per_sample_entropy", 1.0,
                    "Fraction of each batch's tokens that enter the entropy loss: each token with this probability, "
                    "by a hash of its place in the global batch (the reference takes exactly that share).")
            .greater_than(0)
            .at_most(1));
  s.add(K::integer("quantizer.vq.dim", 8, "Channels of each latent token, the length of each code vector.")
            .in_range(1, 4096));
  s.add(K::integer("quantizer.vq.codebook_size", 512, "Number of codes K.").in_range(1, 1 << 20));
  s.add(K::floating("quantizer.vq.decay", 0.8, "EMA decay of the codebook statistics.").in_range(0, 0.9999));
  s.add(
      K::floating("quantizer.vq.commitment_weight", 1.0, "Weight of the commitment loss mse(q, x).").in_range(0, 1000));
  s.add(
      K::boolean("quantizer.vq.kmeans_init", false, "Initialise the codebook by k-means on the first training batch."));
  s.add(K::integer("quantizer.vq.kmeans_iters", 10, "Rounds of k-means when kmeans_init is on.").in_range(1, 1000));
  s.add(K::floating("quantizer.vq.threshold_ema_dead_code", 0.0,
                    "Codes whose EMA cluster size falls below this get a batch vector; 0 turns it off.")
            .at_least(0));
  s.add(K::boolean("quantizer.vq.cosine", false, "Cosine similarity: l2-normalise tokens and codes."));
  s.add(K::boolean("quantizer.vq.rotation_trick", true,
                   "Rotation-trick gradient estimator; false uses straight-through."));
  s.add(K::integer("quantizer.vq.heads", 1, "Vectors each token is split into, each quantized on its own.")
            .in_range(1, 64));
  s.add(K::boolean("quantizer.vq.separate_codebook_per_head", false,
                   "One codebook per head instead of one shared by all heads."));
  s.add(K::integer("quantizer.vq.codebook_dim", 0,
                   "Length of each code; projections in and out when heads x codebook_dim != dim; 0 means dim.")
            .in_range(0, 4096));
  s.add(K::floating("quantizer.vq.orthogonal_reg_weight", 0.0,
                    "Weight of the orthogonal regulariser over the codes (reported; the EMA codebook takes no "
                    "gradient from it).")
            .at_least(0));
  s.add(K::boolean("quantizer.vq.stochastic_sample_codes", false,
                   "Training draws each code from softmax(-distance / temperature) instead of the nearest."));
  s.add(K::floating("quantizer.vq.sample_codebook_temp", 1.0, "Temperature of stochastic code sampling.").at_least(0));
  s.add(K::integer("quantizer.residual.num_quantizers", 4, "Layers of the residual-* quantizers.").in_range(1, 64));
  s.add(K::boolean("quantizer.residual.quantize_dropout", false,
                   "Training keeps only the first c+1 layers, c drawn per step from the shared generator."));
  s.add(K::integer("quantizer.residual.quantize_dropout_cutoff_index", 0,
                   "Smallest c quantize dropout draws (layers 0..c always run); below num_quantizers.")
            .at_least(0));
  s.add(K::integer("quantizer.residual.quantize_dropout_multiple_of", 1,
                   "Quantize dropout keeps a multiple of this many layers.")
            .at_least(1));

  s.add(K::integer("train.epochs", 1, "Passes over the training set.").in_range(1, 100000));
  s.add(K::integer("train.steps", 0, "Stop after this many optimizer steps; 0 runs all the epochs.").at_least(0));
  s.add(K::integer("train.batch_size", 64, "Training images per optimizer step.").in_range(1, 65536));
  s.add(K::floating("train.lr", 2e-3, "Learning rate of the optimizer.").greater_than(0).at_most(10));
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
            .matching("cpu, cuda or cuda:N", [](const std::string& v) { parse_device_spec(v); }));
  s.add(K::integer("train.grad_bucket_kb", 1024,
                   "Distributed runs: gradients are all-reduced in buckets of about this many KiB, each sent "
                   "as soon as backward has produced it.")
            .in_range(1, 1 << 20));
  s.add(K::integer("train.log_every", 50, "Steps between two lines of training metrics.").at_least(1));
  s.add(K::integer("train.checkpoint_every", 500, "Steps between checkpoints; 0 saves only at the end.").at_least(0));
  s.add(K::integer("train.eval_every", 0, "Steps between test-set evaluations; 0 evaluates only at the end.")
            .at_least(0));

  s.add(K::integer("eval.batch_size", 500, "Test images per batch when evaluating.").in_range(1, 65536));
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
