// L2 prefetch for the Numba decode kernel (kvlab/kernels/numba_decode.py).
//
// Numba cannot emit inline PTX, so the kernel links this file (@cuda.jit(link=[...])) and calls
// the function through cuda.declare_device("kvlab_prefetch_l2", "int32(uint64, uint32, int32)").
// Numba's calling convention for a device function: the result goes through the first pointer
// argument and the int returned is a status (0 = no exception).
//
// One call asks for `bytes` bytes at the global address `addr` (one KV block of one KV head) to be
// brought into L2; every lane of a warp calls it with its own `lane`. It returns at once.
//   sm_90+   lane 0 issues one cp.async.bulk.prefetch.L2.global for the whole tile
//            (`addr` 16-byte aligned and `bytes` a multiple of 16: the wrapper checks both).
//   older    the lanes issue prefetch.global.L2, one per 128-byte line.
// The same two modes as PF_BULK / PF_LINE in prefetch.cuh, kept standalone here because Numba
// compiles a linked file on its own, with no include path into this folder.

#define KVLAB_L2_LINE_BYTES 128u
#define KVLAB_WARP_SIZE 32u

extern "C" __device__ int kvlab_prefetch_l2(int* return_value, unsigned long long addr,
                                            unsigned int bytes, int lane) {
#if __CUDA_ARCH__ >= 900
  if (lane == 0) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(addr), "r"(bytes) : "memory");
  }
#else
  for (unsigned int off = lane * KVLAB_L2_LINE_BYTES; off < bytes;
       off += KVLAB_WARP_SIZE * KVLAB_L2_LINE_BYTES) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(addr + off) : "memory");
  }
#endif
  *return_value = 0;
  return 0;
}
