// The row kernels of model/row_kernels.h for AVX2 + FMA: CMakeLists.txt compiles this unit with those
// instructions; row_kernels() calls into it only on a CPU that has them.
#define VIT_ROW_KERNELS_ISA avx2
#define VIT_VECTOR_FLOATS 8
#include "model/row_kernels_impl.h"
