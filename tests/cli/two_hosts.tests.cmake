# Issue #12 §8, two hosts (tests/cli/two_hosts.sh): two training ranks in two network namespaces,
# cabled through a third one (a switch), lose the cable mid-run; both name the other within the
# collective timeout plus slack and exit 3, no process is left, and once the cable is mended the
# run resumes on both hosts and matches one process. It needs root and network namespaces: where
# they cannot be made the script says why and exits 77, which ctest shows as skipped.
set(LOCKSTEP_TWO_HOSTS_DIR ${CMAKE_CURRENT_BINARY_DIR}/cli/two_hosts_link_cut_is_reported_and_resumes)
file(MAKE_DIRECTORY ${LOCKSTEP_TWO_HOSTS_DIR})
add_test(NAME cli.two_hosts_link_cut_is_reported_and_resumes
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/two_hosts.sh $<TARGET_FILE:lockstep_cli>
                 ${CMAKE_CURRENT_LIST_DIR}/compare_metrics.py
         WORKING_DIRECTORY ${LOCKSTEP_TWO_HOSTS_DIR})
set_tests_properties(cli.two_hosts_link_cut_is_reported_and_resumes PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
