# The CPU backend's tile products go through OpenBLAS (Debian: libopenblas-openmp-dev).  We link
# the OpenMP build statically: called from inside our own OpenMP workers it runs single-threaded
# (no oversubscription), and the resulting libtileattn.so needs no BLAS on the machine it is
# copied to.  Its symbols stay hidden so they cannot clash with numpy's or torch's BLAS.
set(TILEATTN_OPENBLAS_ROOT "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp"
    CACHE PATH "Folder holding the OpenMP build of libopenblas.a")
find_library(TILEATTN_OPENBLAS_STATIC NAMES libopenblas.a PATHS ${TILEATTN_OPENBLAS_ROOT} NO_DEFAULT_PATH)
find_path(TILEATTN_OPENBLAS_INCLUDE cblas.h
          PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
if(NOT TILEATTN_OPENBLAS_STATIC OR NOT TILEATTN_OPENBLAS_INCLUDE)
  message(FATAL_ERROR "OpenBLAS (OpenMP build) not found: apt-get install libopenblas-openmp-dev")
endif()
add_library(tileattn_openblas INTERFACE)
target_include_directories(tileattn_openblas SYSTEM INTERFACE ${TILEATTN_OPENBLAS_INCLUDE})
target_link_libraries(tileattn_openblas INTERFACE ${TILEATTN_OPENBLAS_STATIC})
