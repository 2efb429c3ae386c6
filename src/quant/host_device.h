// Markers for arithmetic shared by the CUDA kernels (src/quant/cuda) and the CPU tests that hold them to
// the CPU paths: functions both compilers build, and loops nvcc unrolls. Internal to src/quant.
#pragma once

#if defined(__CUDACC__)
#define LOCKSTEP_HOST_DEVICE __host__ __device__
#define LOCKSTEP_UNROLL _Pragma("unroll")
#else
#define LOCKSTEP_HOST_DEVICE
#define LOCKSTEP_UNROLL
#endif
