# cachegen_add_layer(NAME [DIRS dir...] [SOURCES file...] [LAYERS layer...]
#                    [PRIVATE_DEPS target...] [STATIC_DEPS target...] [PUBLIC_DEPS target...])
#
# One library layer, compiled once (position-independent objects) and linked
# twice: cachegen_NAME (static; exported as cachegen::NAME_static) and, with
# CACHEGEN_BUILD_SHARED, cachegen_NAME_shared (libcachegen_NAME.so with a
# versioned SONAME; exported as cachegen::NAME).
#   DIRS          folders under src/ whose .cc files (recursively) it holds;
#                 src/engine/llama/ and src/cuda/ are layers of their own
#   SOURCES       further source files
#   LAYERS        the cachegen layers below it that it calls
#   PRIVATE_DEPS  what its sources compile against (headers, link libraries)
#   STATIC_DEPS   external libraries a user of the static library links too
#                 (the shared library links them privately)
#   PUBLIC_DEPS   libraries both forms pass on to their users
# The shared library is linked with --no-undefined: a symbol of a layer it
# does not name fails the build, so the layering is checked, not assumed.
function(cachegen_add_layer name)
  cmake_parse_arguments(ARG "" "" "DIRS;SOURCES;LAYERS;PRIVATE_DEPS;STATIC_DEPS;PUBLIC_DEPS" ${ARGN})
  set(sources ${ARG_SOURCES})
  foreach(dir ${ARG_DIRS})
    file(GLOB_RECURSE found CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${dir}/*.cc)
    list(APPEND sources ${found})
  endforeach()
  if(ARG_DIRS)
    list(FILTER sources EXCLUDE REGEX "/src/(engine/llama|cuda)/")
  endif()

  set(obj cachegen_${name}_obj)
  add_library(${obj} OBJECT ${sources})
  target_include_directories(${obj} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set(static_layers "")
  set(shared_layers "")
  foreach(layer ${ARG_LAYERS})
    list(APPEND static_layers cachegen_${layer})
    list(APPEND shared_layers cachegen_${layer}_shared)
  endforeach()
  target_link_libraries(${obj} PRIVATE ${static_layers} ${ARG_PRIVATE_DEPS} ${ARG_STATIC_DEPS} ${ARG_PUBLIC_DEPS})
  set_target_properties(${obj} PROPERTIES POSITION_INDEPENDENT_CODE ON)

  set(public_includes $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  add_library(cachegen_${name} STATIC $<TARGET_OBJECTS:${obj}>)
  target_include_directories(cachegen_${name} PUBLIC ${public_includes})
  target_link_libraries(cachegen_${name} PUBLIC ${static_layers} ${ARG_STATIC_DEPS} ${ARG_PUBLIC_DEPS} Threads::Threads)
  set_target_properties(cachegen_${name} PROPERTIES EXPORT_NAME ${name}_static)
  add_library(cachegen::${name}_static ALIAS cachegen_${name})
  set_property(GLOBAL APPEND PROPERTY CACHEGEN_LAYER_TARGETS cachegen_${name})

  if(CACHEGEN_BUILD_SHARED)
    add_library(cachegen_${name}_shared SHARED $<TARGET_OBJECTS:${obj}>)
    target_include_directories(cachegen_${name}_shared PUBLIC ${public_includes})
    target_link_libraries(cachegen_${name}_shared PUBLIC ${shared_layers} ${ARG_PUBLIC_DEPS} Threads::Threads
                                                  PRIVATE ${ARG_STATIC_DEPS})
    set_target_properties(cachegen_${name}_shared PROPERTIES
      OUTPUT_NAME cachegen_${name} EXPORT_NAME ${name}
      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
      # Installed side by side: a layer finds the layers below it next to itself.
      INSTALL_RPATH "$ORIGIN")
    target_link_options(cachegen_${name}_shared PRIVATE LINKER:--no-undefined)
    add_library(cachegen::${name} ALIAS cachegen_${name}_shared)
    set_property(GLOBAL APPEND PROPERTY CACHEGEN_LAYER_TARGETS cachegen_${name}_shared)
  endif()
  set_property(GLOBAL APPEND PROPERTY CACHEGEN_COMPONENTS ${name})
endfunction()
