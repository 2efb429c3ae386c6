# Everything lockstep links against, found once for every target.
find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
# ATen's at::parallel_for splits work only in code compiled with OpenMP (_OPENMP defined).
find_package(OpenMP REQUIRED)
find_package(ZLIB REQUIRED)
find_package(PNG REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_path(LOCKSTEP_TOMLPP_INCLUDE_DIR toml++/toml.h REQUIRED)
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()

# Debian's LibTorch ships ProcessGroupGloo.hpp, which needs the gloo headers and this define.
find_path(LOCKSTEP_GLOO_INCLUDE_DIR gloo/config.h)
if(LOCKSTEP_GLOO_INCLUDE_DIR)
  set(LOCKSTEP_HAVE_GLOO ON)
else()
  set(LOCKSTEP_HAVE_GLOO OFF)
  message(WARNING "gloo headers not found: multi-process groups will be unavailable (install libgloo-dev)")
endif()

# CUDA paths are compiled only when the linked LibTorch was built with CUDA.
set(LOCKSTEP_HAVE_CUDA OFF)
if(LOCKSTEP_WITH_CUDA AND TORCH_CUDA_LIBRARIES)
  set(LOCKSTEP_HAVE_CUDA ON)
endif()
# Image folders (issue #5) decode and resize with OpenCV's core, imgcodecs and imgproc (Debian
# ships no CMake config without the full libopencv-dev, so they are found by hand).
find_path(LOCKSTEP_OPENCV_INCLUDE_DIR opencv2/imgcodecs.hpp PATH_SUFFIXES opencv4)
find_library(LOCKSTEP_OPENCV_CORE opencv_core)
find_library(LOCKSTEP_OPENCV_IMGCODECS opencv_imgcodecs)
find_library(LOCKSTEP_OPENCV_IMGPROC opencv_imgproc)
if(LOCKSTEP_OPENCV_INCLUDE_DIR AND LOCKSTEP_OPENCV_CORE AND LOCKSTEP_OPENCV_IMGCODECS AND LOCKSTEP_OPENCV_IMGPROC)
  set(LOCKSTEP_HAVE_OPENCV ON)
else()
  set(LOCKSTEP_HAVE_OPENCV OFF)
  message(WARNING "OpenCV not found: image folders will be unavailable (scripts/install-deps installs it)")
endif()
message(STATUS "lockstep: LibTorch ${Torch_VERSION}, gloo=${LOCKSTEP_HAVE_GLOO}, cuda=${LOCKSTEP_HAVE_CUDA}, opencv=${LOCKSTEP_HAVE_OPENCV}")
