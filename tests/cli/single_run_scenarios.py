"""CLI scenarios of one process (tests/cli/scenarios.py runs them, as cli.<name>): what `lockstep train`
refuses in a configuration file, resuming a small run, what `eval`, `encode` and `decode` make of its directory
or refuse, Ctrl-C during a run, and what `doctor` finds in the BLAS and a damaged data set."""
import os
import re
import shutil
import signal
import time

from scenario_kit import HERE, Failure, reject, scenario, tiny_run

@scenario(60)
def train_error_quoting_a_huge_value_is_shortened(run):
    # An error quoting a 400,000-character value (a path from a config file) shows its two ends: the
    # message stays a few KB.
    (run.dir / "huge.toml").write_text("[data]\ndir = \"" + "d" * 400000 + "\"\n")
    out = run.lockstep("train", "--config", "huge.toml", "--run-dir", "run", log="train.log", expect=1)
    run.expect(out, r"lockstep: error: Fashion-MNIST directory 'dddd.* \.\.\. \([0-9]+ characters left out\) "
               r"\.\.\. dddd", "the shortened value")
    reject(out, "d" * 4000, "the whole value")


@scenario(60)
def train_bad_config_file(run):
    (run.dir / "bad.toml").write_text("[train]\nepochz = 3\n")
    run.expect(run.lockstep("train", "--config", "bad.toml", log="train.log", expect=1), r"bad\.toml.*line 2",
               "the file and line")


@scenario(120)
def train_simvq_then_eval(run):
    # SimVQ from the CLI: trains (its map learns by gradient), saves, and the saved run evaluates.
    tiny_run(run, "--quantizer", "simvq", "--set", "quantizer.simvq.codebook_size=64")
    run.expect(run.lockstep("eval", "run", "--limit", 32, log="eval.log"),
               r"mse [0-9.]+  psnr [0-9.]+ dB  codes used [0-9]+/64", "eval of the SimVQ run")


@scenario(120)
def train_run_dir_taken(run):
    tiny_run(run)
    run.expect(run.lockstep("train", "--run-dir", "run", log="again.log", expect=1), "already holds a run.*--resume",
               "a second run in the directory")


@scenario(120)
def train_resume_extends(run):
    tiny_run(run)
    run.expect(run.lockstep("train", "--resume", "run", "--steps", 6, log="resume.log"),
               "resumed at step 4 of 6.*trained 6 steps", "the resumed run")


@scenario(120)
def train_resume_refuses_model_change(run):
    tiny_run(run)
    run.expect(run.lockstep("train", "--resume", "run", "--set", "model.channels=[4,4]", log="resume.log", expect=1),
               "cannot change 'model.channels'", "the refused key")


@scenario(120)
def train_resume_refuses_a_truncated_config(run):
    # config.toml cut before its [train] section: the run's steps and threads would fall back to defaults.
    tiny_run(run)
    config = run.dir / "run" / "config.toml"
    text = config.read_text()
    config.write_text(text[:text.index("[train]")])
    run.expect(run.lockstep("train", "--resume", "run", log="resume.log", expect=1),
               r"run/config\.toml does not set [0-9]+ key\(s\) that the checkpoint's configuration sets "
               r"\(.*train\.steps = 4.*cut short or edited", "the keys the file lost")


@scenario(120)
def train_resume_names_a_lost_key_before_checking_across_keys(run):
    # config.toml without train.batch_size, whose default (64) train.grad_accum = 3 does not divide: the
    # lost key is named, before any check across keys would blame the default.
    run.train("run", "--config", HERE / "small_run.toml", "--steps", 2, "--set", "train.grad_accum=3", "--set",
              "data.train_subset=64")
    config = run.dir / "run" / "config.toml"
    lines = config.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("batch_size = "))
    config.write_text("".join(lines[:first] + lines[first + 1:]))
    run.expect(run.lockstep("train", "--resume", "run", log="resume.log", expect=1),
               r"run/config\.toml does not set 1 key\(s\) that the checkpoint's configuration sets "
               r"\(train\.batch_size = 24\)", "the lost key")


@scenario(120)
def eval_run(run):
    tiny_run(run)
    run.expect(run.lockstep("eval", "run", "--limit", 50, "--grid", "grid.png", log="eval.log"),
               r"step 4.*mse [0-9.]+  psnr", "the run's figures")
    if not (run.dir / "grid.png").is_file():
        raise Failure("eval --grid wrote no grid.png")


@scenario(60)
def eval_corrupt_checkpoint(run):
    (run.dir / "bad.safetensors").write_bytes(os.urandom(300))
    run.expect(run.lockstep("eval", "bad.safetensors", log="eval.log", expect=1), r"bad\.safetensors",
               "the file named")


@scenario(120)
def eval_weight_average(run):
    # A run keeping a moving average of its weights: eval takes it with --ema.
    tiny_run(run, "--set", "train.ema_decay=0.9")
    run.expect(run.lockstep("eval", "run", "--ema", "--limit", 32, log="eval.log"), r"step 4.*mse [0-9.]+  psnr",
               "the weight average's figures")


@scenario(120)
def eval_weight_average_of_a_run_without_one(run):
    tiny_run(run)
    run.expect(run.lockstep("eval", "run", "--ema", "--limit", 32, log="eval.log", expect=1),
               "holds no moving average of the weights: its run had train.ema_decay = 0", "the refusal")


@scenario(120)
def eval_lpips(run):
    # LPIPS from the user's weights: eval --lpips measures any run.
    tiny_run(run)
    run.python("make_lpips_weights.py", run.dir / "w.safetensors", log="weights.log")
    run.expect(run.lockstep("eval", "run", "--lpips", "w.safetensors", "--limit", 32, log="eval.log"),
               r"step 4.*ssim [0-9.]+  lpips [0-9]+\.[0-9]+", "the LPIPS figure")


@scenario(120)
def eval_lpips_missing_weights(run):
    tiny_run(run)
    run.expect(run.lockstep("eval", "run", "--lpips", "nowhere.safetensors", "--limit", 32, log="eval.log", expect=1),
               "--lpips = nowhere.safetensors: no such file", "the missing file")


@scenario(180)
def train_perceptual_with_weights(run):
    run.python("make_lpips_weights.py", run.dir / "w.safetensors", log="weights.log")
    out = run.train("run", "--config", HERE / "small_run.toml", "--steps", 2, "--batch-size", 8, "--set",
                    "data.train_subset=16", "--set", "data.test_subset=16", "--set", "loss.perceptual=1", "--set",
                    "loss.lpips_weights=w.safetensors")
    run.expect(out, r"test: mse [0-9.]+ .*lpips [0-9]+\.[0-9]+", "the run's LPIPS figure")


@scenario(120)
def eval_fid_missing_weights(run):
    tiny_run(run)
    run.expect(run.lockstep("eval", "run", "--fid", "nowhere.safetensors", "--limit", 32, log="eval.log", expect=1),
               "--fid = nowhere.safetensors: no such file", "the missing file")


@scenario(120)
def encode_decode_round_trip(run):
    tiny_run(run)
    run.expect(run.lockstep("encode", "run", "--limit", 10, "-o", "tokens.npy", log="encode.log"),
               r"tokens of shape \[10, 14, 14\]", "the tokens' shape")
    run.expect(run.lockstep("decode", "run", "--tokens", "tokens.npy", "-o", "out", "--grid", "grid.png",
                            log="decode.log"),
               r"wrote 10 PNG images to out \([0-9]+ images/s\)", "the decoded images")


@scenario(120)
def encode_png_inputs(run):
    tiny_run(run)
    run.lockstep("encode", "run", "--limit", 3, "-o", "t.npy", log="encode.log")
    run.lockstep("decode", "run", "--tokens", "t.npy", "-o", "imgs", log="decode.log")
    images = [f"imgs/00000{i}.png" for i in range(3)]
    run.expect(run.lockstep("encode", "run", "--images", *images, "-o", "again.npy", log="again.log"),
               "encoded 3 images of 28x28", "the PNG inputs encoded")


def _decode_refuses(run, descr, shape, fill, pattern):
    """A tiny run, then decode of a .npy of `descr` and `shape` filled with byte `fill`: exit 1, `pattern`."""
    tiny_run(run)
    run.python("make_npy.py", run.dir / "f.npy", descr, shape, fill, log="npy.log")
    out = run.lockstep("decode", "run", "--tokens", "f.npy", "-o", "out", log="decode.log", expect=1)
    run.expect(out, pattern, "the refusal")
    return out


@scenario(120)
def decode_rejects_float_tokens(run):
    _decode_refuses(run, "<f4", "1,14,14", 0, "must be integers")


@scenario(120)
def decode_rejects_out_of_range(run):
    _decode_refuses(run, "<i4", "1,14,14", 127,
                    r"f\.npy: token id 2139062143 at \[0, 0, 0\] is outside .0, 1000. \(196 of the 196 ids are\)")


@scenario(120)
def decode_rejects_an_empty_grid(run):
    out = _decode_refuses(run, "<i4", "2,0,7", 0, r"with no side of length 0, got \[2, 0, 7\]")
    reject(out, "frame #", "a stack trace")


@scenario(60)
def decode_without_a_destination(run):
    (run.dir / "t.npy").touch()
    run.expect(run.lockstep("decode", "nowhere", "--tokens", "t.npy", log="decode.log", expect=2),
               "say where to write: --output DIR and/or --grid FILE.png", "the usage error")


@scenario(60)
def decode_empty_output(run):
    (run.dir / "t.npy").touch()
    run.expect(run.lockstep("decode", "nowhere", "--tokens", "t.npy", "-o", "", log="decode.log", expect=2),
               "--output: must name a file or directory, not an empty string", "the usage error")


@scenario(60)
def encode_empty_output(run):
    out = run.lockstep("encode", "nowhere", "-o", "", log="encode.log", expect=2)
    run.expect(out, "--output: must name a file or directory, not an empty string", "the usage error")
    reject(out, "write_file_atomic", "the library's function name")


# A run whose steps are long (480 micro-batches each), logging every step.
LONG_STEPS = ("--run-dir", "run", "--config", HERE / "small_run.toml", "--steps", 100000, "--batch-size", 480,
              "--set", "train.grad_accum=480", "--set", "model.channels=[32,32]", "--set", "train.log_every=1")


def _interrupted_twice(run, second_after):
    """Ctrl-C (SIGINT) just after step 1 is logged, while step 2 is under way; a second `second_after` s after
    the run says it stops after that step (at once with 0, as one Ctrl-C reaching a rank both from the terminal
    and from its launcher). Exit status 130; returns what the run printed."""
    process = run.start("train", *LONG_STEPS, log="train.log")
    metrics = run.dir / "run" / "metrics.jsonl"
    run.wait_until(lambda: (metrics.exists() and metrics.stat().st_size > 0) or process.poll() is not None, 30)
    process.send_signal(signal.SIGINT)
    if second_after > 0:
        run.wait_until(lambda: "stopping after the step under way" in (run.dir / "train.log").read_text(errors="replace"),
                       5)
        time.sleep(second_after)
    process.send_signal(signal.SIGINT)
    return run.wait(process, "train.log", expect=130)


@scenario(180)
def train_second_interrupt_stops_at_once(run):
    # Ctrl-C twice: the first asks the run to stop after the step under way, and says so; a second, 0.25 s or
    # more later, ends the process at once, saying so (exit 130), the first run's checkpoint untouched.
    out = _interrupted_twice(run, 0.4)
    run.expect(out, r"stopping after the step under way.*stopped at once \(a second interrupt\)", "both interrupts")
    reject(out, "interrupted at step", "a checkpoint after the second interrupt")


@scenario(180)
def train_one_interrupt_delivered_twice_stops_after_the_step(run):
    # Two interrupts at once count as one: the run stops after the step under way, saved.
    out = _interrupted_twice(run, 0)
    run.expect(out, r"interrupted at step [0-9]+; checkpoint saved", "the run stopped after its step")
    reject(out, "stopped at once", "a second interrupt")


NO_BLAS_CHOICE = {"OPENBLAS_CORETYPE": None, "LOCKSTEP_BLAS_REEXEC": None, "LOCKSTEP_NO_REEXEC": None}


@scenario(120, labels=("channel",))
def doctor_reexec_follows_the_coretype_rule(run):
    # With OPENBLAS_CORETYPE unset, lockstep re-executes itself so that OpenBLAS loads the kernels this CPU
    # should use, exactly when OpenBLAS's own choice differs from them, and otherwise leaves the variable unset.
    # Which case a CPU falls in depends on its model: the scenario checks the rule either way.
    own = run.lockstep("doctor", "--quick", "--threads", 1, log="own.log",
                       env={**NO_BLAS_CHOICE, "LOCKSTEP_NO_REEXEC": "1"})
    if not re.search(r"(?m)^BLAS vendor *OpenBLAS", own):
        print("the BLAS is not OpenBLAS: nothing to choose")
        return
    chosen = re.search(r"(?m)^BLAS core *([A-Za-z0-9]*)", own)
    if not chosen:
        raise Failure(f"no BLAS core row:\n{own}")
    chosen = chosen.group(1)
    wanted = re.search(r"(?m)^BLAS core .*\(recommended for this CPU: ([A-Za-z0-9]*)\)", own)
    wanted = wanted.group(1) if wanted else ""
    run.expect(own, r"(?m)^OPENBLAS_CORETYPE *unset", "LOCKSTEP_NO_REEXEC=1 leaving the variable unset")
    out = run.lockstep("doctor", "--quick", "--threads", 1, log="doctor.log", env=NO_BLAS_CHOICE)
    if wanted and chosen.lower() != wanted.lower():
        run.expect(out, rf"(?m)^BLAS core *{wanted}", f"the core {wanted} after OpenBLAS chose {chosen}")
        run.expect(out, rf"(?m)^OPENBLAS_CORETYPE *{wanted} \(set by lockstep", "the variable lockstep set")
    else:
        run.expect(out, r"(?m)^OPENBLAS_CORETYPE *unset", f"OpenBLAS's own choice {chosen} left alone")
        run.expect(out, rf"(?m)^BLAS core *{chosen}", f"OpenBLAS's own choice {chosen} kept")


@scenario(60, labels=("channel",))
def doctor_reads_the_data_set(run):
    # The doctor opens the data set: a damaged file (here cut short) is a warning naming it.
    source = "/usr/share/datasets/fashion-mnist"
    shutil.copytree(source, run.dir / "data")
    images = "t10k-images-idx3-ubyte.gz"
    (run.dir / "data" / images).write_bytes((run.dir / "data" / images).read_bytes()[:5000])
    out = run.lockstep("doctor", "--quick", "--threads", 1, "--data", "data", log="doctor.log")
    run.expect(out, r"Fashion-MNIST +damaged in data.*WARNING: Fashion-MNIST in data cannot be read: "
               r".*t10k-images-idx3-ubyte\.gz", "the damaged file named")


@scenario(90)
def doctor_says_what_a_data_path_is(run):
    # An empty folder, a FIFO and a loop of links were each reported as "Fashion-MNIST is missing".
    (run.dir / "empty").mkdir()
    os.mkfifo(run.dir / "fifo")
    os.symlink("loop", run.dir / "loop")
    for path, row, warning in (
            ("empty", r"missing \(4 of 4 files absent from empty\)",
             r"empty holds neither Fashion-MNIST's 4 files nor an image file"),
            ("fifo", r"not looked for: fifo is a FIFO", r"fifo is a FIFO, not a directory: pass --data the directory"),
            ("loop", r"not looked for: loop is a loop of symbolic links", r"loop is a loop of symbolic links, not a")):
        out = run.lockstep("doctor", "--quick", "--threads", 1, "--data", path, log=f"doctor-{path}.log")
        run.expect(out, rf"Fashion-MNIST +{row}.*WARNING: {warning}", f"what {path} is")
        if "Fashion-MNIST is missing" in out:
            raise Failure(f"doctor --data {path} still says Fashion-MNIST is missing:\n{out}")


@scenario(60)
def train_failing_before_it_starts_leaves_no_run_directory(run):
    # Without --run-dir a run goes to runs/<date-time>/; one refused before it starts (a model the images cannot
    # pass) used to leave that directory behind, empty but for its lock.
    run.lockstep("train", "--set", "model.channels=[4,4,4,4]", log="train.log", expect=1)
    left = sorted(str(p.relative_to(run.dir)) for p in (run.dir / "runs").glob("*")) if (run.dir / "runs").exists() else []
    if left:
        raise Failure(f"a failed run left {left}")


@scenario(60)
def empty_paths_are_refused(run):
    # An empty path given as its own argument ("") would mean a default: `train --resume ''` started a new
    # run, `doctor --data ''` looked nowhere and exited 0. Both are bad command lines now.
    for args in (("train", "--resume", ""), ("doctor", "--quick", "--data", "")):
        out = run.lockstep(*args, log="empty.log", expect=2)
        run.expect(out, rf"{args[-2]}: must name a file or directory, not an empty string", f"{args[0]}'s refusal")
