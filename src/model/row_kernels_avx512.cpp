// The row kernels of model/row_kernels.h for AVX-512 (F, VL, BW, DQ): CMakeLists.txt compiles this unit with those
// instructions; row_kernels() calls into it only on a CPU that has them.
#define VIT_ROW_KERNELS_ISA avx512
#define VIT_VECTOR_FLOATS 16
#include "model/row_kernels_impl.h"
