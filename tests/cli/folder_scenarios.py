"""CLI scenarios of training on a real image folder (tests/cli/scenarios.py runs them, as cli.<name>):
OpenCV's example images (91 images of many sizes and aspect ratios, fetched at test time, never committed),
plus a file that is not an image, in buckets of about 64x64 that keep each run to seconds. A build without
OpenCV skips them (cli.folder_tests_need_opencv says so)."""
import json
import shutil

from scenario_kit import Failure, reject, scenario

FOLDER = ("--buckets", "64x64,80x64,64x80", "--global-batch", 8, "--threads", 1, "--set", "data.eval_images=8",
          "--set", "model.channels=[8,16]", "--set", "train.log_every=2")
IMAGES = ("images",)


def trained(run, steps, *args):
    """OpenCV's images in ./images and a run of `steps` steps on them in ./run."""
    run.images()
    run.train("run", "--data", "images", "--steps", steps, *FOLDER, *args)


@scenario(120, needs=IMAGES)
def folder_ranks_with_different_folders_stop(run):
    # The (plan hash, steps) check: rank 1's node holds one more image; both ranks stop at the first epoch
    # naming rank 1, instead of training on different data (exit 4: ranks differ).
    run.images()
    shutil.copytree(run.dir / "images", run.dir / "images1")
    shutil.copy(run.dir / "images" / "apple.jpg", run.dir / "images1" / "apple-again.jpg")
    out = run.two_ranks("train", "--run-dir", "run", "--data", "images", "--steps", 4, *FOLDER,
                        rank1_extra=("--set", "data.dir=images1"), expect=4)
    run.expect(out, r"epoch 0: the data plan of rank\(s\) 1 \([0-9]+ steps over 84 images\) differs from rank 0's "
               r"\([0-9]+ steps over 83 images\)", "the ranks' plans compared")


@scenario(120, needs=IMAGES)
def folder_resume_refuses_a_changed_folder(run):
    # A run resumed on a folder that changed cannot continue its sequence: named, not trained.
    trained(run, 2)
    shutil.copy(run.dir / "images" / "apple.jpg", run.dir / "images" / "apple-again.jpg")
    run.expect(run.lockstep("train", "--resume", "run", "--steps", 4, log="resume.log", expect=1),
               r"cannot resume run exactly: image folder images changed since the run started: 1 added "
               r"\(apple-again\.jpg\)", "the change named")


@scenario(120, needs=IMAGES)
def folder_decode_refuses_a_path_listed_twice_or_a_link(run):
    # An index naming one image twice would overwrite images: refused.
    trained(run, 1)
    run.lockstep("encode", "run", "-o", "tokens", log="encode.log")
    index_path = run.dir / "tokens" / "index.json"
    index = json.loads(index_path.read_text())
    bucket = next(b for b in index["buckets"] if len(b["paths"]) > 1)
    bucket["paths"][1] = bucket["paths"][0]
    index_path.write_text(json.dumps(index))
    run.expect(run.lockstep("decode", "run", "--tokens", "tokens", "-o", "decoded", log="decode.log", expect=1),
               r"tokens/index\.json: path .* is listed twice", "the refusal")
    # A folder inside the output that is a link to elsewhere would take the images there: refused, and
    # nothing is written where it points.
    bucket["paths"][1] = "sub/" + bucket["paths"][1]
    index_path.write_text(json.dumps(index))
    (run.dir / "elsewhere").mkdir()
    (run.dir / "linked").mkdir()
    (run.dir / "linked" / "sub").symlink_to(run.dir / "elsewhere")
    run.expect(run.lockstep("decode", "run", "--tokens", "tokens", "-o", "linked", log="decode-link.log", expect=1),
               r"linked/sub is a symbolic link; lockstep does not write through links", "the refusal of the link")
    if any((run.dir / "elsewhere").iterdir()):
        raise Failure(f"decode wrote through the link: {sorted((run.dir / 'elsewhere').iterdir())}")


@scenario(120, needs=IMAGES)
def folder_encode_then_decode(run):
    # encode writes one .npy per bucket and an index; decode turns them back into a folder of PNGs at the
    # source paths.
    trained(run, 2)
    run.expect(run.lockstep("encode", "run", "-o", "tokens", log="encode.log"),
               r"encoded 91 images of images .* 1 unreadable files left out", "what encode read")
    if not (run.dir / "tokens" / "80x64.npy").is_file():
        raise Failure("encode wrote no tokens/80x64.npy")
    run.expect(run.lockstep("decode", "run", "--tokens", "tokens", "-o", "decoded", log="decode.log"),
               "wrote 91 PNG images to decoded", "the decoded folder")


@scenario(120, needs=IMAGES)
def folder_run_whose_folder_moved(run):
    # The run's folder has moved: eval and encode say so and how to go on, rather than looking for
    # Fashion-MNIST there (encode did) or failing on the first image (eval did).
    trained(run, 1)
    (run.dir / "images").rename(run.dir / "moved")
    run.expect(run.lockstep("eval", "run", log="eval.log", expect=1), "pass --data with where the images are now",
               "eval's way on")
    run.lockstep("eval", "run", "--data", "moved", log="eval2.log")
    run.expect(run.lockstep("encode", "run", "-o", "tokens", log="encode.log", expect=1),
               r"image folder images is not a directory \(it is where this run trained: pass --data", "encode's way on")


@scenario(120, needs=IMAGES)
def folder_step_too_big_for_memory(run):
    # A step that cannot fit in memory (8 images of 8192x8192 per rank: hundreds of GiB of activations) is
    # named before training, with the figures, instead of failing in LibTorch's allocator.
    run.images()
    out = run.lockstep("train", "--data", "images", "--steps", 1, "--run-dir", "run", "--buckets", "8192x8192",
                       "--global-batch", 8, "--threads", 1, log="train.log", expect=1)
    run.expect(out, r"a training step on 8 images of 8192x8192 per rank \(train\.batch_size = 8, train\.grad_accum = 1; "
               r"lower the batch, accumulate over more micro-batches, or lower the image size\) needs [0-9.]+ GiB, "
               r"more than the [0-9.]+ GiB of memory this machine has available", "the step's memory named")


SMALL_FOLDER = ("--data", "small", "--run-dir", "run", "--steps", 2, "--buckets", "64x64,80x64,64x80", "--threads", 1,
                "--set", "model.channels=[8,16]")


def small_folder(run):
    """./small: the first 30 images of OpenCV's (by name, bytewise), 27 of them for training."""
    run.images()
    (run.dir / "small").mkdir()
    names = sorted((p.name for p in (run.dir / "images").iterdir() if p.name != "not-really.jpg"),
                   key=lambda name: name.encode())
    for name in names[:30]:
        shutil.copy(run.dir / "images" / name, run.dir / "small" / name)


@scenario(240, needs=IMAGES)
def folder_small_trains_with_the_default_batch(run):
    # A global batch left at its default that no bucket can fill becomes what the fullest bucket holds, said
    # once on rank 0.
    small_folder(run)
    out = run.lockstep("launch", "-n", 2, "--", "train", *SMALL_FOLDER, log="launch.log")
    run.expect(out, r"rank 0/2. train\.batch_size: the default global batch of 64 is more than any bucket of small "
               r"holds \(the fullest, [0-9]+x[0-9]+, holds [0-9]+ of the 27 training images\), so this run trains "
               r"with a global batch of [0-9]+.*trained 2 steps", "the batch fitted")


@scenario(240, needs=IMAGES)
def folder_small_in_shards_trains_with_whole_shards(run):
    # In shards (train.shard_size = 8) the batch chosen is whole shards, at least one per rank.
    small_folder(run)
    out = run.lockstep("launch", "-n", 2, "--", "train", *SMALL_FOLDER, "--set", "train.shard_size=8",
                       log="launch.log")
    run.expect(out, r"so this run trains with a global batch of (16|24|32|40|48|56);.*trained 2 steps",
               "whole shards")


@scenario(120, needs=IMAGES)
def folder_small_with_a_batch_given_is_refused(run):
    # Given explicitly, a batch no bucket can fill stays an error.
    small_folder(run)
    out = run.lockstep("train", *SMALL_FOLDER, "--batch-size", 64, log="train.log", expect=1)
    run.expect(out, r"no bucket can fill one global batch of 64 images; the fullest, [0-9]+x[0-9]+, holds [0-9]+ "
               r"of the 27 training images", "the refusal")
    reject(out, "so this run trains with", "a fitted batch")


@scenario(120, needs=IMAGES)
def folder_doctor_scans_an_image_folder(run):
    # doctor --data on an image folder says what a run would find there (the scan train makes), not that
    # Fashion-MNIST is missing.
    run.images()
    out = run.lockstep("doctor", "--quick", "--data", "images", log="doctor.log")
    run.expect(out, r"image folder +images: 91 of 92 image files readable \(`lockstep train --data images` trains on "
               r"them\)", "the folder scanned")
    reject(out, "Fashion-MNIST is missing", "Fashion-MNIST named")
