#pragma once

#if defined(__CUDACC__)
#define FLASHCUTE_HD __host__ __device__ __forceinline__
#else
#define FLASHCUTE_HD inline
#endif
