# Finds the CUTLASS/CuTe headers the CUDA kernels are written with.  They come from the pinned PyPI
# wheel nvidia-cutlass==4.2.0.0 (headers only are used), downloaded once into the build folder, so
# no CUTLASS file is ever committed.  -DTILEATTN_CUTLASS_DIR=<dir> points at an existing copy
# instead: either a CUTLASS checkout (with include/cute) or an unpacked wheel's
# cutlass_library/source folder.
#
# Sets TILEATTN_CUTLASS_INCLUDE_DIRS.
set(TILEATTN_CUTLASS_VERSION "4.2.0.0")
set(TILEATTN_CUTLASS_DIR "" CACHE PATH
    "CUTLASS source folder (holding include/cute); empty = download the nvidia-cutlass wheel")

if(TILEATTN_CUTLASS_DIR)
  set(_cutlass_root "${TILEATTN_CUTLASS_DIR}")
else()
  set(_deps "${CMAKE_BINARY_DIR}/_deps")
  set(_cutlass_root "${_deps}/cutlass_library/source")
  if(NOT EXISTS "${_cutlass_root}/include/cute/tensor.hpp")
    file(GLOB _wheel "${_deps}/nvidia_cutlass-${TILEATTN_CUTLASS_VERSION}-*.whl")
    if(NOT _wheel)
      find_package(Python3 REQUIRED COMPONENTS Interpreter)
      message(STATUS "tileattn: downloading nvidia-cutlass==${TILEATTN_CUTLASS_VERSION} into ${_deps}")
      execute_process(
        COMMAND ${Python3_EXECUTABLE} -m pip download --no-deps --only-binary=:all:
                nvidia-cutlass==${TILEATTN_CUTLASS_VERSION} -d ${_deps}
        RESULT_VARIABLE _rc)
      file(GLOB _wheel "${_deps}/nvidia_cutlass-${TILEATTN_CUTLASS_VERSION}-*.whl")
      if(NOT _rc EQUAL 0 OR NOT _wheel)
        message(FATAL_ERROR "tileattn: could not download nvidia-cutlass==${TILEATTN_CUTLASS_VERSION}; "
                            "pass -DTILEATTN_CUTLASS_DIR=<CUTLASS source folder> instead")
      endif()
    endif()
    list(GET _wheel 0 _wheel)
    # A wheel is a zip archive; cmake -E tar unpacks it.
    execute_process(COMMAND ${CMAKE_COMMAND} -E tar xf ${_wheel}
                    WORKING_DIRECTORY ${_deps} RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0 OR NOT EXISTS "${_cutlass_root}/include/cute/tensor.hpp")
      message(FATAL_ERROR "tileattn: ${_wheel} did not unpack to ${_cutlass_root}/include/cute")
    endif()
  endif()
endif()

if(NOT EXISTS "${_cutlass_root}/include/cute/tensor.hpp")
  message(FATAL_ERROR "tileattn: no CuTe headers under ${_cutlass_root}/include")
endif()
set(TILEATTN_CUTLASS_INCLUDE_DIRS "${_cutlass_root}/include" "${_cutlass_root}/tools/util/include")
message(STATUS "tileattn: CUTLASS headers from ${_cutlass_root}")
