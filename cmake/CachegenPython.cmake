# The Python module `cachegen` (python/): pybind11 bindings of the core,
# store and stream layers, built into <build>/python/cachegen so that
# PYTHONPATH=<build>/python imports it, and installed into the interpreter's
# package folder under the install prefix (CACHEGEN_PYTHON_INSTALL_DIR).
set(CACHEGEN_PYTHON AUTO CACHE STRING "Build the Python module (AUTO, ON, OFF)")
set_property(CACHE CACHEGEN_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(CACHEGEN_HAVE_PYTHON OFF)
if(CACHEGEN_PYTHON STREQUAL "OFF" OR CACHEGEN_FUZZ OR CACHEGEN_SANITIZE)
  # Sanitizer runtimes cannot be loaded into an uninstrumented interpreter.
  return()
endif()

# Debian's interpreter by default: python3-numpy and pybind11-dev are built for it.
if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3)
endif()
find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
if(Python_FOUND)
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 2.6 CONFIG QUIET)
endif()
if(NOT Python_FOUND OR NOT pybind11_FOUND)
  if(CACHEGEN_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "CACHEGEN_PYTHON=ON but Python development files or pybind11 were not found "
                        "(Debian: python3-dev pybind11-dev)")
  endif()
  message(STATUS "cachegen: Python module off (needs python3-dev and pybind11-dev)")
  return()
endif()
set(CACHEGEN_HAVE_PYTHON ON)
message(STATUS "cachegen: Python module for ${Python_EXECUTABLE} (${Python_VERSION})")
# The interpreter it is built for, for scripts that run its tests (scripts/test.sh, tests/install/run.sh).
file(WRITE ${PROJECT_BINARY_DIR}/python/interpreter "${Python_EXECUTABLE}\n")

file(GLOB cachegen_python_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/src/*.cc)
pybind11_add_module(cachegen_python MODULE ${cachegen_python_sources})
target_include_directories(cachegen_python PRIVATE ${PROJECT_SOURCE_DIR}/python/src)
# The static layers (position-independent): the module carries the library,
# so an installed module needs no libcachegen_*.so beside it.
target_link_libraries(cachegen_python PRIVATE cachegen_stream cachegen_store cachegen_core)
set(cachegen_python_dir ${PROJECT_BINARY_DIR}/python/cachegen)
set_target_properties(cachegen_python PROPERTIES OUTPUT_NAME _cachegen LIBRARY_OUTPUT_DIRECTORY ${cachegen_python_dir})

# The pure-Python part, copied next to the extension at build time.
file(GLOB cachegen_python_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/cachegen/*.py)
set(cachegen_python_copies "")
foreach(f ${cachegen_python_files})
  get_filename_component(n ${f} NAME)
  add_custom_command(OUTPUT ${cachegen_python_dir}/${n} COMMAND ${CMAKE_COMMAND} -E copy ${f} ${cachegen_python_dir}/${n}
                     DEPENDS ${f} VERBATIM)
  list(APPEND cachegen_python_copies ${cachegen_python_dir}/${n})
endforeach()
add_custom_target(cachegen_python_files ALL DEPENDS ${cachegen_python_copies})
add_dependencies(cachegen_python cachegen_python_files)

# Relative to the install prefix: Debian's interpreter reads
# <prefix>/lib/python3.X/dist-packages for /usr/local, others site-packages.
execute_process(
  COMMAND ${Python_EXECUTABLE} -c [=[
import sys, sysconfig
rel = sysconfig.get_path("platlib", "posix_prefix", vars={"base": "", "platbase": ""}).lstrip("/")
deb = rel.replace("site-packages", "dist-packages")
print(deb if sys.argv[1].rstrip("/") + "/" + deb in sys.path else rel)
]=] ${CMAKE_INSTALL_PREFIX}
  OUTPUT_VARIABLE cachegen_python_default_dir OUTPUT_STRIP_TRAILING_WHITESPACE)
set(CACHEGEN_PYTHON_INSTALL_DIR "${cachegen_python_default_dir}" CACHE STRING
    "Where cmake --install puts the cachegen package (relative: under the prefix)")
install(TARGETS cachegen_python LIBRARY DESTINATION ${CACHEGEN_PYTHON_INSTALL_DIR}/cachegen)
install(FILES ${cachegen_python_files} DESTINATION ${CACHEGEN_PYTHON_INSTALL_DIR}/cachegen)

if(CACHEGEN_BUILD_TESTS)
  # python/tests with pytest (Debian: python3-pytest, python3-numpy), against the build folder's module.
  add_test(NAME python_test COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/python/tests)
  set_tests_properties(python_test PROPERTIES ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python" TIMEOUT 300)
endif()
