# ctest install_runs_from_anywhere (MODE install) and deb_package_runs (MODE deb): vitlens installed
# by `cmake --install` into a fresh prefix, or the Debian package `cpack -G DEB` makes unpacked with
# dpkg-deb (its prefix is /usr); then the installed vitlens, run from a folder outside the source
# and build trees, must find its own assets under PREFIX/share/vitlens (not the source tree it was
# built from), name its bundled models, print its version and export with a bundled model given by
# name.
#   cmake -DMODE=install|deb -DBUILD_DIR=... -DROOT=... -DWORK=... -DVERSION=... -P install_check.cmake
foreach(var MODE BUILD_DIR ROOT WORK VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_check.cmake: -D${var}= is required")
  endif()
endforeach()
# Only this test's own folders are cleared.
file(REMOVE_RECURSE ${ROOT} ${WORK})
file(MAKE_DIRECTORY ${ROOT} ${WORK})
set(ENV{VITLENS_ASSETS} "")

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${out}${err}")
  endif()
endfunction()

if(MODE STREQUAL "install")
  set(PREFIX ${ROOT})
  run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
elseif(MODE STREQUAL "deb")
  set(PREFIX ${ROOT}/root/usr)
  run("cpack -G DEB" ${CMAKE_CPACK_COMMAND} -G DEB --config ${BUILD_DIR}/CPackConfig.cmake -B ${ROOT}/package)
  file(GLOB debs ${ROOT}/package/vitlens_${VERSION}_*.deb)
  list(LENGTH debs count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "cpack made ${count} packages named vitlens_${VERSION}_*.deb in ${ROOT}/package, not one")
  endif()
  run("dpkg-deb --field" dpkg-deb --field ${debs} Depends)
  run("dpkg-deb -x" dpkg-deb -x ${debs} ${ROOT}/root)
else()
  message(FATAL_ERROR "install_check.cmake: MODE is install or deb, not '${MODE}'")
endif()

foreach(f bin/vitlens share/vitlens/models/vitlens-designed.safetensors share/vitlens/images/vitlens-demo.png
          share/vitlens/labels/imagenet-1k.txt
          share/applications/vitlens.desktop share/pixmaps/vitlens.png)
  if(NOT EXISTS ${PREFIX}/${f})
    message(FATAL_ERROR "${MODE}: ${f} was not installed")
  endif()
endforeach()

set(VITLENS ${PREFIX}/bin/vitlens)
function(run_installed expect_rc)
  execute_process(COMMAND ${VITLENS} ${ARGN} WORKING_DIRECTORY ${WORK}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "installed 'vitlens ${ARGN}' exited ${rc} (expected ${expect_rc}): ${out}${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

run_installed(0 --version)
if(NOT out MATCHES "vitlens ${VERSION}")
  message(FATAL_ERROR "vitlens --version printed '${out}', not 'vitlens ${VERSION}'")
endif()

run_installed(0 models)
foreach(name designed random fashion-mnist mae-photos)
  if(NOT out MATCHES "\n  ${name} ")
    message(FATAL_ERROR "vitlens models does not list '${name}':\n${out}")
  endif()
endforeach()
string(FIND "${out}" "${PREFIX}/share/vitlens/models" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the installed vitlens does not use its installed models (${PREFIX}/share/vitlens/models):\n${out}")
endif()

run_installed(0 export ${PREFIX}/share/vitlens/images/vitlens-demo.png --model fashion-mnist --out maps --quiet)
if(NOT EXISTS ${WORK}/maps/vitlens-demo_montage.png)
  message(FATAL_ERROR "the installed vitlens' export with --model fashion-mnist wrote no maps/vitlens-demo_montage.png")
endif()
run_installed(0 info --model mae-photos)
if(NOT out MATCHES "${PREFIX}/share/vitlens/models/vitlens-mae-photos.safetensors")
  message(FATAL_ERROR "vitlens info --model mae-photos did not open the installed file:\n${out}")
endif()
message(STATUS "installed vitlens ran from ${WORK}")
