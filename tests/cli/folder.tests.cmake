# The CLI's image-folder tests are scenarios (tests/cli/folder_scenarios.py, and the runs compared over
# ranks in scenarios.py) on OpenCV's example images, fetched at test time by fetch_opencv_images.sh. A
# build without OpenCV cannot read image folders: they report themselves skipped, and this says why.
if(NOT LOCKSTEP_HAVE_OPENCV)
  add_test(NAME cli.folder_tests_need_opencv
           COMMAND sh -c "echo 'skipped: this build has no OpenCV, so the image-folder CLI tests are not defined'; exit 77")
  set_tests_properties(cli.folder_tests_need_opencv PROPERTIES SKIP_RETURN_CODE 77)
endif()
