// Which SMs a stream's work lands on: each CTA waits ~`spin_cycles` SM clock cycles (so that the
// CTAs of one launch spread over every SM they may use), then records the id of its SM.
//
//   record_sm_ids: grid (num_ctas), block 32 threads, no shared memory.
//     sm_ids  [num_ctas]  int32: sm_ids[blockIdx.x] = %smid of the SM that ran CTA blockIdx.x.
//
// kvlab/kernels/green.py counts the distinct ids of a launch on a green context's stream: the SMs
// that context really holds, whatever count was asked for (the driver hands out SMs in groups).

extern "C" __global__ void record_sm_ids(int* sm_ids, long long spin_cycles) {
  if (threadIdx.x != 0) return;
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  unsigned int sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  sm_ids[blockIdx.x] = static_cast<int>(sm);
}
