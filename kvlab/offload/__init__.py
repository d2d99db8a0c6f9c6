"""KVPR (ACL 2025): the KV cache in host memory, each layer's K, V brought to the GPU partly by
recomputing them from transferred activations and partly by copying, the two overlapped. The
decoder layers it runs are `kvlab.model`'s.

- `scheduler`: the split point l under the paper's, a chunked and a pipelined model of time.
- `recompute`: K, V of a range of tokens from their stored attention inputs, in place.
- `host`: pinned host memory at its exact size; the store of every layer's K, V and X; prefill.
- `weights`: the layers' weights packed in pinned host memory, W_K and W_V first (offloaded).
- `graphs`: the layers on fixed buffers, replayed as CUDA graphs on a GPU.
- `runtime`: `KVPRDecoder` (copy / compute / store streams ordered by events; row and column
  schedules) and the resident reference.
- `overlap`: CUDA events per operation and stream, the overlap of link and GPU; Chrome-trace
  export.
- `profiler`: link, recompute and layer rates measured here; a drift monitor.
- `loop`: many decode steps, l chosen at each, re-profiled on drift.
- `paper`: KVPR's Table 1 as plain data, and what kvlab's models predict beside it.
"""
