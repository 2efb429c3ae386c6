# Everything lockstep links against, found once for every target.

# LibTorch: PyPI's torch (2.x) when LOCKSTEP_TORCH_ROOT names its package directory (the Makefile
# passes `scripts/python-env --torch-root`), else whatever find_package finds (Debian's 1.13).
set(LOCKSTEP_TORCH_ROOT "" CACHE PATH "torch's Python package directory (PyPI's LibTorch 2.x); empty: the system's LibTorch")
# Built by pip (scikit-build-core, pyproject.toml): the torch of the Python that builds. Under pip's
# build isolation that Python sees only the build requirements (pip's PYTHONPATH and a
# sitecustomize hide the environment's packages), so the environment's own torch is asked for with
# -E, which ignores them: the extension must match the torch it will be imported beside.
if(SKBUILD AND NOT LOCKSTEP_TORCH_ROOT)
  foreach(isolation_flags IN ITEMS "" "-E")
    execute_process(COMMAND "${Python_EXECUTABLE}" ${isolation_flags} -c
                            "import os, torch; print(os.path.dirname(torch.__file__))"
                    OUTPUT_VARIABLE skbuild_torch OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE skbuild_rc
                    ERROR_QUIET)
    if(skbuild_rc EQUAL 0)
      break()
    endif()
  endforeach()
  if(NOT skbuild_rc EQUAL 0)
    message(FATAL_ERROR "pip install of lockstep builds against the torch of the installing Python "
                        "(${Python_EXECUTABLE}), which has none: install torch there first (pip install torch)")
  endif()
  set(LOCKSTEP_TORCH_ROOT "${skbuild_torch}" CACHE PATH "" FORCE)
  set(Python3_EXECUTABLE "${Python_EXECUTABLE}")
endif()
if(LOCKSTEP_TORCH_ROOT)
  if(NOT EXISTS "${LOCKSTEP_TORCH_ROOT}/share/cmake/Torch/TorchConfig.cmake")
    message(FATAL_ERROR "LOCKSTEP_TORCH_ROOT=${LOCKSTEP_TORCH_ROOT} holds no share/cmake/Torch/TorchConfig.cmake "
                        "(run scripts/python-env --torch-root for the right directory)")
  endif()
  # <Package>_ROOT is searched first by the find_library calls inside TorchConfig too, so the
  # wheel's libraries win over a system LibTorch installed beside it.
  set(Torch_ROOT "${LOCKSTEP_TORCH_ROOT}")
endif()
# The CUDA toolkit found the same way whatever PATH holds. Found through PATH, a shell with
# /usr/local/cuda/bin gave -isystem /usr/local/cuda/include and one without /usr/local/cuda-13.0/include
# (through a wrapper in /usr/local/bin): every torch-including compile then missed the compiler cache
# that the other had filled (CI's did). CUDACXX, CUDAToolkit_ROOT or CMAKE_CUDA_COMPILER still choose.
if(NOT LOCKSTEP_PYTHON_ONLY AND NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND NOT CUDAToolkit_ROOT
   AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "nvcc of the CUDA toolkit in /usr/local/cuda")
  set(CUDAToolkit_ROOT /usr/local/cuda)
  set(CUDA_TOOLKIT_ROOT_DIR /usr/local/cuda)  # torch's own FindCUDA (its link and run paths)
endif()
if(LOCKSTEP_PYTHON_ONLY AND LOCKSTEP_TORCH_ROOT)
  # The Python package alone takes torch as torch.utils.cpp_extension does: the wheel's headers and
  # libraries. find_package(Torch) would look for the CUDA toolkit (nvcc) that a CUDA wheel's users
  # need not have; the package runs CUDA tensors through torch's own operations and NCCL backend.
  set(TORCH_INSTALL_PREFIX "${LOCKSTEP_TORCH_ROOT}")
  set(TORCH_LIBRARY "${LOCKSTEP_TORCH_ROOT}/lib/libtorch.so")
  file(STRINGS "${LOCKSTEP_TORCH_ROOT}/version.py" torch_version_line REGEX "^__version__")
  string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" Torch_VERSION "${torch_version_line}")
  add_library(lockstep_torch INTERFACE IMPORTED)
  target_include_directories(lockstep_torch SYSTEM INTERFACE "${LOCKSTEP_TORCH_ROOT}/include"
                                                            "${LOCKSTEP_TORCH_ROOT}/include/torch/csrc/api/include")
  target_compile_definitions(lockstep_torch INTERFACE USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
  target_compile_features(lockstep_torch INTERFACE cxx_std_20)  # what the wheel's headers require
  target_link_libraries(lockstep_torch INTERFACE "${LOCKSTEP_TORCH_ROOT}/lib/libtorch.so"
                                                 "${LOCKSTEP_TORCH_ROOT}/lib/libtorch_cpu.so"
                                                 "${LOCKSTEP_TORCH_ROOT}/lib/libc10.so")
  set(TORCH_LIBRARIES lockstep_torch)
else()
  find_package(Torch REQUIRED)
endif()
# Headers of one LibTorch with libraries of another crash at run time: refuse the mix here.
get_filename_component(LOCKSTEP_TORCH_LIBDIR "${TORCH_LIBRARY}" DIRECTORY)
get_filename_component(LOCKSTEP_TORCH_LIBDIR "${LOCKSTEP_TORCH_LIBDIR}" REALPATH)
get_filename_component(LOCKSTEP_TORCH_PREFIX "${TORCH_INSTALL_PREFIX}" REALPATH)
string(FIND "${LOCKSTEP_TORCH_LIBDIR}" "${LOCKSTEP_TORCH_PREFIX}/" LOCKSTEP_TORCH_LIB_AT)
if(NOT LOCKSTEP_TORCH_LIB_AT EQUAL 0)
  message(FATAL_ERROR "LibTorch's CMake package is in ${TORCH_INSTALL_PREFIX} but its library was found at "
                      "${TORCH_LIBRARY}: two LibTorch installations are mixed (set LOCKSTEP_TORCH_ROOT)")
endif()
# PyPI's torch links NCCL, cuDNN and the CUDA runtime from the nvidia-* wheels beside it (through
# its RPATH). The CUDA toolkit's own copies come earlier on the link line, so point the linker at
# the wheels' copies, or it resolves libtorch_cuda's symbols against an older NCCL and fails.
get_filename_component(LOCKSTEP_NVIDIA_WHEELS "${LOCKSTEP_TORCH_PREFIX}/../nvidia" ABSOLUTE)
file(GLOB LOCKSTEP_NVIDIA_LIBDIRS LIST_DIRECTORIES true "${LOCKSTEP_NVIDIA_WHEELS}/*/lib")
set(LOCKSTEP_TORCH_LINK_OPTIONS)
# Some PyPI wheels (torch 2.11's libtorch.so) export a static copy of libstdc++'s std::filesystem,
# iostream initialisation and chrono symbols (pytorch/pytorch#133437). Symbols resolve in NEEDED
# order, so libstdc++.so is named first: otherwise remove_all jumps to null and iostreams crash.
# The shared library by its path: a toolchain that links libstdc++.a by default gains nothing from -lstdc++.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6 OUTPUT_VARIABLE LOCKSTEP_LIBSTDCXX
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${LOCKSTEP_LIBSTDCXX}" AND EXISTS "${LOCKSTEP_LIBSTDCXX}")
    # This build's own targets only: the path is this machine's, so the installed package leaves it out.
    list(APPEND LOCKSTEP_TORCH_LINK_OPTIONS
         "$<BUILD_INTERFACE:LINKER:--push-state,--no-as-needed,${LOCKSTEP_LIBSTDCXX},--pop-state>")
  else()
    unset(LOCKSTEP_LIBSTDCXX)
  endif()
endif()
foreach(dir IN LISTS LOCKSTEP_NVIDIA_LIBDIRS)
  list(APPEND LOCKSTEP_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${dir}")
endforeach()
find_package(Threads REQUIRED)
# ATen's at::parallel_for splits work only in code compiled with OpenMP (_OPENMP defined).
find_package(OpenMP REQUIRED)
if(NOT LOCKSTEP_PYTHON_ONLY)  # the Python package alone needs none of these
  find_package(ZLIB REQUIRED)
  find_package(PNG REQUIRED)
  find_package(nlohmann_json 3.10 REQUIRED)
  find_path(LOCKSTEP_TOMLPP_INCLUDE_DIR toml++/toml.h REQUIRED)
  include(${CMAKE_CURRENT_LIST_DIR}/PatchedTomlpp.cmake)
  lockstep_patch_tomlpp(${LOCKSTEP_TOMLPP_INCLUDE_DIR} ${PROJECT_BINARY_DIR})
  find_package(CLI11 CONFIG QUIET)
  if(NOT CLI11_FOUND)
    find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
    add_library(CLI11::CLI11 INTERFACE IMPORTED)
    target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
  endif()
endif()

# Debian's LibTorch ships ProcessGroupGloo.hpp, which needs the gloo headers and this define.
if(NOT LOCKSTEP_PYTHON_ONLY)  # the Python package makes its Gloo groups through torch's Python API
  find_path(LOCKSTEP_GLOO_INCLUDE_DIR gloo/config.h)
endif()
if(LOCKSTEP_GLOO_INCLUDE_DIR)
  set(LOCKSTEP_HAVE_GLOO ON)
else()
  set(LOCKSTEP_HAVE_GLOO OFF)
  if(NOT LOCKSTEP_PYTHON_ONLY)
    message(WARNING "gloo headers not found: multi-process groups will be unavailable (install libgloo-dev)")
  endif()
endif()

# CUDA paths (devices, NCCL) are compiled only when the linked LibTorch was built with CUDA; NCCL's
# header is the one of the NCCL that LibTorch links (PyPI: the nvidia-nccl wheel).
set(LOCKSTEP_HAVE_CUDA OFF)
set(LOCKSTEP_HAVE_NCCL OFF)
if(LOCKSTEP_WITH_CUDA AND TORCH_CUDA_LIBRARIES)
  set(LOCKSTEP_HAVE_CUDA ON)
  find_path(LOCKSTEP_NCCL_INCLUDE_DIR nccl.h HINTS "${LOCKSTEP_NVIDIA_WHEELS}/nccl/include" ${CUDAToolkit_INCLUDE_DIRS})
  # lockstep calls NCCL itself (its version for doctor), so it links the library LibTorch loads.
  find_library(LOCKSTEP_NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR HINTS "${LOCKSTEP_NVIDIA_WHEELS}/nccl/lib"
               ${CUDAToolkit_LIBRARY_DIR})
  if(LOCKSTEP_NCCL_INCLUDE_DIR AND LOCKSTEP_NCCL_LIBRARY)
    set(LOCKSTEP_HAVE_NCCL ON)
  endif()
endif()
# The quantizers' CUDA kernels need nvcc beside a LibTorch with CUDA; without them CUDA tensors take
# the torch-op paths (docs/devices.md).
set(LOCKSTEP_HAVE_CUDA_KERNELS OFF)
if(LOCKSTEP_HAVE_CUDA AND LOCKSTEP_WITH_CUDA_KERNELS)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(LOCKSTEP_HAVE_CUDA_KERNELS ON)
  endif()
endif()
# Image folders decode and resize with OpenCV's core, imgcodecs and imgproc (Debian
# ships no CMake config without the full libopencv-dev, so they are found by hand).
find_path(LOCKSTEP_OPENCV_INCLUDE_DIR opencv2/imgcodecs.hpp PATH_SUFFIXES opencv4)
find_library(LOCKSTEP_OPENCV_CORE opencv_core)
find_library(LOCKSTEP_OPENCV_IMGCODECS opencv_imgcodecs)
find_library(LOCKSTEP_OPENCV_IMGPROC opencv_imgproc)
# JPEGs are decoded with libjpeg directly, so that its warnings are kept rather than printed.
find_package(JPEG)
if(LOCKSTEP_PYTHON_ONLY)  # the Python package decodes no images
  set(LOCKSTEP_HAVE_OPENCV OFF)
elseif(LOCKSTEP_OPENCV_INCLUDE_DIR AND LOCKSTEP_OPENCV_CORE AND LOCKSTEP_OPENCV_IMGCODECS AND LOCKSTEP_OPENCV_IMGPROC
   AND JPEG_FOUND)
  set(LOCKSTEP_HAVE_OPENCV ON)
else()
  set(LOCKSTEP_HAVE_OPENCV OFF)
  if(LOCKSTEP_REQUIRE_OPENCV)
    message(FATAL_ERROR "OpenCV or libjpeg not found and LOCKSTEP_REQUIRE_OPENCV is ON (scripts/install-deps installs them)")
  endif()
  message(WARNING "OpenCV not found: image folders will be unavailable (scripts/install-deps installs it)")
endif()
message(STATUS "lockstep: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}), gloo=${LOCKSTEP_HAVE_GLOO}, "
               "cuda=${LOCKSTEP_HAVE_CUDA} (kernels ${LOCKSTEP_HAVE_CUDA_KERNELS}), nccl=${LOCKSTEP_HAVE_NCCL}, opencv=${LOCKSTEP_HAVE_OPENCV}")
