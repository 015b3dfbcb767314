# cmake -DBUILD_DIR=... -DCONSUMER_DIR=... -DWORK_DIR=... -DGENERATOR=... -P package_test.cmake
# Installs the `client` component of BUILD_DIR into WORK_DIR/prefix, then builds and runs the
# consumer project (find_package(oscarkv CONFIG REQUIRED); links oscarkv::client, oscarkv::c
# for consumer_c, both APIs through oscarkv::c_static for consumer_both), and checks that a
# program linking oscarkv::c and oscarkv::client is refused when the project is generated.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --component client --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
run(${WORK_DIR}/build/consumer_c)
run(${WORK_DIR}/build/consumer_both)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build_wrong_pair
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_WRONG_PAIR=ON
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "OSCARKV_C_STATIC_BESIDE_CLIENT")
  message(FATAL_ERROR "oscarkv::c with oscarkv::client was not refused (${rc}):\n${out}\n${err}")
endif()
message(STATUS "oscarkv::c with oscarkv::client refused at generate time, as it must be")
# The installed libraries carry no process launchers (testing/no_launchers_check.sh).
if(NO_LAUNCHERS_CHECK)
  file(GLOB_RECURSE installed_libs ${WORK_DIR}/prefix/liboscarkv_client.a
       ${WORK_DIR}/prefix/liboscarkv_c.so)
  if(NOT installed_libs)
    message(FATAL_ERROR "no liboscarkv_client.a / liboscarkv_c.so under ${WORK_DIR}/prefix")
  endif()
  run(bash ${NO_LAUNCHERS_CHECK} ${installed_libs})
endif()
