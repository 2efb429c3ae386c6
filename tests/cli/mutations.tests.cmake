# Issue #12 section 7 as a table (tests/cli/mutations.py): 101 malformed inputs of every kind
# lockstep reads (checkpoints, config.toml, IDX, token .npy, image folders, command lines), each run
# with a time limit; every one must end cleanly with the expected status and message.
set(LOCKSTEP_MUTATIONS_DIR ${CMAKE_CURRENT_BINARY_DIR}/cli/malformed_inputs)
file(MAKE_DIRECTORY ${LOCKSTEP_MUTATIONS_DIR})
add_test(NAME cli.malformed_inputs_end_cleanly
         COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/mutations.py $<TARGET_FILE:lockstep_cli>
         WORKING_DIRECTORY ${LOCKSTEP_MUTATIONS_DIR})
# The suite's longest entry (154 s here, 412 s under ASan): started first where ctest has no timings yet (CI),
# so that the other entries fill the other core beside it instead of it running alone at the end.
set_tests_properties(cli.malformed_inputs_end_cleanly PROPERTIES TIMEOUT 900 COST 500)
