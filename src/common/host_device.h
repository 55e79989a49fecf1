// Lets the small shared rules (masking, Philox) compile for both the CPU backend and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define TILEATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TILEATTN_HOST_DEVICE inline
#endif
