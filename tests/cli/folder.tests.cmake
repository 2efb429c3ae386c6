# CLI tests of training on a real image folder: OpenCV's example images (Debian package opencv-doc,
# fetched at test time by fetch_opencv_images.sh, never committed; 91 images of many sizes and
# aspect ratios), plus a file that is not an image. Buckets of about 64x64 keep each run to seconds.
if(NOT LOCKSTEP_HAVE_OPENCV)  # a build without OpenCV cannot read image folders: say so in the report
  add_test(NAME cli.folder_tests_need_opencv
           COMMAND sh -c "echo 'skipped: this build has no OpenCV, so the image-folder CLI tests are not defined'; exit 77")
  set_tests_properties(cli.folder_tests_need_opencv PROPERTIES SKIP_RETURN_CODE 77)
  return()
endif()
set(LS $<TARGET_FILE:lockstep_cli>)
set(OPENCV_IMAGES ${CMAKE_BINARY_DIR}/test-data/opencv-images)
set(IMAGES "bash ${CMAKE_CURRENT_LIST_DIR}/fetch_opencv_images.sh ${OPENCV_IMAGES} && cp -r ${OPENCV_IMAGES} images && echo junk > images/not-really.jpg")
set(FOLDER "--buckets 64x64,80x64,64x80 --global-batch 8 --threads 1 --set data.eval_images=8 --set model.channels=[8,16] --set train.log_every=2")
separate_arguments(FOLDER_ARGS UNIX_COMMAND "${FOLDER}")

# The runs on 2 and 3 ranks compared with one process (G5) are scenarios in tests/cli/scenarios.py.
# The (plan hash, steps) check: rank 1's node holds one more image; both ranks stop at the first
# epoch naming rank 1, instead of training on different data (exit 4: ranks differ).
lockstep_cli_test(folder_ranks_with_different_folders_stop EXIT 4
                  OUTPUT "epoch 0: the data plan of rank\\(s\\) 1 \\([0-9]+ steps over 84 images\\) differs from rank 0's \\([0-9]+ steps over 83 images\\)"
                  TIMEOUT 120
                  SETUP "${IMAGES} && cp -r images images1 && cp images/apple.jpg images1/apple-again.jpg"
                  RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/two_ranks.sh "--set data.dir=images1"
                  ARGS train --run-dir run --data images --steps 4 ${FOLDER_ARGS})
# A run resumed on a folder that changed cannot continue its sequence: named, not trained.
lockstep_cli_test(folder_resume_refuses_a_changed_folder EXIT 1
                  OUTPUT "cannot resume run exactly: image folder images changed since the run started: 1 added \\(apple-again.jpg\\)"
                  TIMEOUT 120
                  SETUP "${IMAGES} && ${LS} train --data images --steps 2 --run-dir run ${FOLDER} > run.log && cp images/apple.jpg images/apple-again.jpg"
                  ARGS train --resume run --steps 4)
# encode writes one .npy per bucket and an index; decode turns them back into a folder of PNGs at
# the source paths.
# An index naming one image twice (or no file at all) would overwrite images: refused.
lockstep_cli_test(folder_decode_refuses_a_path_listed_twice EXIT 1 OUTPUT "tokens/index.json: path .* is listed twice"
                  TIMEOUT 120
                  SETUP "${IMAGES} && ${LS} train --data images --steps 1 --run-dir run ${FOLDER} > run.log && ${LS} encode run -o tokens > encode.log && python3 ${CMAKE_CURRENT_LIST_DIR}/duplicate_index_path.py tokens"
                  ARGS decode run --tokens tokens -o decoded)
lockstep_cli_test(folder_encode_then_decode EXIT 0 OUTPUT "wrote 91 PNG images to decoded" TIMEOUT 120
                  SETUP "${IMAGES} && ${LS} train --data images --steps 2 --run-dir run ${FOLDER} > run.log && ${LS} encode run -o tokens > encode.log && grep -q 'encoded 91 images of images .* 1 unreadable files left out' encode.log && test -f tokens/80x64.npy"
                  ARGS decode run --tokens tokens -o decoded)
# The run's folder has moved: encode and eval say so and how to go on, rather than looking for
# Fashion-MNIST there (encode did) or failing on the first image (eval did).
lockstep_cli_test(folder_run_whose_folder_moved EXIT 1
                  OUTPUT "image folder images is not a directory \\(it is where this run trained: pass --data"
                  TIMEOUT 120
                  SETUP "${IMAGES} && ${LS} train --data images --steps 1 --run-dir run ${FOLDER} > run.log && mv images moved && ! ${LS} eval run > eval.log 2>&1 && grep -q 'pass --data with where the images are now' eval.log && ${LS} eval run --data moved > eval2.log"
                  ARGS encode run -o tokens)
# A step that cannot fit in memory (8 images of 8192x8192 per rank: hundreds of GiB of activations)
# is named before training, with the figures, instead of failing in LibTorch's allocator.
lockstep_cli_test(folder_step_too_big_for_memory EXIT 1
                  OUTPUT "a training step on 8 images of 8192x8192 per rank \\(train.batch_size = 8, train.grad_accum = 1; lower the batch, accumulate over more micro-batches, or lower the image size\\) needs [0-9.]+ GiB, more than the [0-9.]+ GiB of memory this machine has available"
                  TIMEOUT 120
                  SETUP "${IMAGES}"
                  ARGS train --data images --steps 1 --run-dir run --buckets 8192x8192 --global-batch 8 --threads 1)
# A small folder trains with the defaults: a global batch left at its default that no bucket can fill
# becomes what the fullest bucket holds, said once on rank 0; given explicitly, it stays an error.
set(SMALL_FOLDER "${IMAGES} && mkdir small && LC_ALL=C ls images | grep -v not-really | head -30 | xargs -I{} cp images/{} small/")
set(SMALL_FOLDER_ARGS --data small --run-dir run --steps 2 --buckets 64x64,80x64,64x80 --threads 1 --set model.channels=[8,16])
lockstep_cli_test(folder_small_trains_with_the_default_batch EXIT 0
                  OUTPUT "rank 0/2. train.batch_size: the default global batch of 64 is more than any bucket of small holds \\(the fullest, [0-9]+x[0-9]+, holds [0-9]+ of the 27 training images\\), so this run trains with a global batch of [0-9]+.*trained 2 steps"
                  TIMEOUT 240 SETUP "${SMALL_FOLDER}"
                  ARGS launch -n 2 -- train ${SMALL_FOLDER_ARGS})
# In shards (train.shard_size = 8) the batch chosen is whole shards, at least one per rank.
lockstep_cli_test(folder_small_in_shards_trains_with_whole_shards EXIT 0
                  OUTPUT "so this run trains with a global batch of (16|24|32|40|48|56);.*trained 2 steps"
                  TIMEOUT 240 SETUP "${SMALL_FOLDER}"
                  ARGS launch -n 2 -- train ${SMALL_FOLDER_ARGS} --set train.shard_size=8)
lockstep_cli_test(folder_small_with_a_batch_given_is_refused EXIT 1
                  OUTPUT "no bucket can fill one global batch of 64 images; the fullest, [0-9]+x[0-9]+, holds [0-9]+ of the 27 training images"
                  REJECT "so this run trains with" TIMEOUT 120 SETUP "${SMALL_FOLDER}"
                  ARGS train ${SMALL_FOLDER_ARGS} --batch-size 64)
# doctor --data on an image folder says what a run would find there (the scan train makes), not that
# Fashion-MNIST is missing.
lockstep_cli_test(folder_doctor_scans_an_image_folder EXIT 0
                  OUTPUT "image folder +images: 91 of 92 image files readable \\(`lockstep train --data images` trains on them\\)"
                  REJECT "Fashion-MNIST is missing" TIMEOUT 120 SETUP "${IMAGES}"
                  ARGS doctor --quick --data images)
