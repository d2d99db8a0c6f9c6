// Per-CTA timestamps for `python -m kvlab bench timeline` (kvlab/kernels/timeline.py): when each
// CTA of a launch starts, reaches the named points of its work, and ends, on which SM.
//
// Compiled in only where KVLAB_TIMELINE is defined (kvlab.kernels.loader.defined); otherwise
// every call below is an empty inline function: the same instructions, up to ptxas's scheduling.
//
// Where: one global array per module, kvlab_timeline[REGIONS][MAX_CTAS][SLOTS] (unsigned 64-bit),
// zeroed by the host before a traced launch. Thread 0 of CTA c (its linear index in the grid)
// writes record [region][c]: slot SM the %smid it ran on, every other slot a %globaltimer
// reading (ns; it advances in steps of 32 ns on the H200). CTAs past MAX_CTAS write nothing (the
// host refuses such launches). A kernel's slots are the enumerators of its own namespace below;
// kvlab/kernels/timeline.py names the same ones, and tests/kernels/test_nvcc.py checks they agree.
#pragma once

namespace kvlab {
namespace timeline {

constexpr int REGIONS = 2;          // a module's kernels: its decode (or read) and its merge
constexpr int MAX_CTAS = 1 << 15;   // CTAs a region holds
constexpr int SLOTS = 8;            // 64-bit values a CTA's record holds
constexpr int SM = 0;               // every record's slot 0: the SM

namespace decode {  // region 0 of paged_decode_gqa.cu's modules: gqa_decode
constexpr int REGION = 0;
enum : int { ENTRY = 1, READY, ISSUED, LANDED, LOOP_DONE, END };
// READY: thread 0's first block ids and seq_len in registers (the block table read); ISSUED: its
// first copies issued; LANDED: warp 0's first tile in shared memory; LOOP_DONE: every warp out of
// the main loop.
}  // namespace decode
namespace merge {  // region 1: gqa_merge
constexpr int REGION = 1;
enum : int { ENTRY = 1, RELEASED, LOADED, END };
// RELEASED: griddepcontrol.wait returned (the decode grid done); LOADED: thread 0's first
// partials in registers.
}  // namespace merge
namespace read {  // region 0 of read_bytes.cu's module: read_bytes
constexpr int REGION = 0;
enum : int { ENTRY = 1, END };
}  // namespace read

}  // namespace timeline
}  // namespace kvlab

#ifdef KVLAB_TIMELINE
// At global scope, with C linkage: the host finds it by this name (RawModule.get_global).
extern "C" {
__device__ unsigned long long kvlab_timeline[kvlab::timeline::REGIONS *
                                             kvlab::timeline::MAX_CTAS * kvlab::timeline::SLOTS];
}
#endif

namespace kvlab {
namespace timeline {

#ifdef KVLAB_TIMELINE

__device__ __forceinline__ unsigned long long* record(int region) {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return cta < MAX_CTAS ? kvlab_timeline + (region * MAX_CTAS + cta) * SLOTS : nullptr;
}

// Thread 0 writes the time now into `slot` of its CTA's record in `region`.
__device__ __forceinline__ void stamp(int region, int slot) {
  if (threadIdx.x != 0) return;
  unsigned long long* const r = record(region);
  if (r == nullptr) return;
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)::"memory");
  r[slot] = now;
}

// The same, once `value` is known: the branch on it makes the stamp wait for the loads that
// produce it (a stamp alone does not wait for loads in flight). No arithmetic result has this
// bit pattern (a NaN's is 0x7fffffff), so the stamp is always written.
__device__ __forceinline__ void stamp_after(int region, int slot, float value) {
  if (__float_as_uint(value) != 0xffffffffu) stamp(region, slot);
}

// The same for an int that is never INT_MIN (a block id, a length, their XOR).
__device__ __forceinline__ void stamp_after(int region, int slot, int value) {
  if (value != static_cast<int>(0x80000000u)) stamp(region, slot);
}

// Thread 0 writes its CTA's SM, and the time now into `entry`.
__device__ __forceinline__ void start(int region, int entry) {
  stamp(region, entry);
  if (threadIdx.x != 0) return;
  unsigned long long* const r = record(region);
  if (r == nullptr) return;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  r[SM] = sm;
}

#else
__device__ __forceinline__ void stamp(int, int) {}
__device__ __forceinline__ void stamp_after(int, int, float) {}
__device__ __forceinline__ void stamp_after(int, int, int) {}
__device__ __forceinline__ void start(int, int) {}
#endif

}  // namespace timeline
}  // namespace kvlab
