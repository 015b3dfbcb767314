# oscarkv_add_test(NAME name SOURCES ... LIBS ... LABELS unit|integration|gpu|slow [TIMEOUT s])
function(oscarkv_add_test)
  if(NOT OSCARKV_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gmock GTest::gtest_main)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "OSCARKV_SOURCE_DIR=${PROJECT_SOURCE_DIR};OSCARKV_BINARY_DIR=${PROJECT_BINARY_DIR}")
endfunction()
