/* launch.cuh — the launch geometry shared by the CUDA module's kernels: blocks of block_size
 * threads over grid-stride loops, so any grid cap is correct and the grid is capped at
 * max_blocks. */
#ifndef CLPAR_CUDA_LAUNCH_CUH
#define CLPAR_CUDA_LAUNCH_CUH

#include <stddef.h>

namespace clpar_launch {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535;

/* Blocks for n work items, one per thread, capped at max_blocks. */
inline unsigned blocks_for(size_t n) {
  size_t b = (n + block_size - 1) / block_size;
  return (unsigned)(b < max_blocks ? b : max_blocks);
}

}  // namespace clpar_launch

#endif
