# Fails when a Catch test name holds a character that breaks its ctest entry (cmake -P,
# TESTS=path of vitlens_tests). catch_discover_tests registers one ctest per name and runs it with
# the name as Catch's filter: CMake splits a name at ';' into two entries, and Catch reads '\' as
# an escape, so such an entry's filter matches no test: it prints "No tests ran" and counts as
# passed.
if(NOT DEFINED TESTS)
  message(FATAL_ERROR "test_names_check: -DTESTS=... is required")
endif()
execute_process(COMMAND "${TESTS}" --list-test-names-only OUTPUT_VARIABLE names RESULT_VARIABLE rc)
if(NOT rc MATCHES "^[0-9]+$")  # Catch2 v2 returns the number of names listed
  message(FATAL_ERROR "${TESTS} --list-test-names-only failed: ${rc}")
endif()
string(LENGTH "${names}" length)
if(length LESS 1000)
  message(FATAL_ERROR "${TESTS} listed almost no test names (${length} characters)")
endif()
foreach(bad ";" "\\")
  string(FIND "${names}" "${bad}" at)
  if(NOT at EQUAL -1)
    string(SUBSTRING "${names}" ${at} 120 rest)
    message(FATAL_ERROR "a test name holds '${bad}' (its ctest entry would run nothing), near: ${rest}")
  endif()
endforeach()
