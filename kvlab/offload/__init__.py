"""KVPR (ACL 2025): the KV cache in host memory, each layer's K, V brought to the GPU partly by
recomputing them from transferred activations and partly by copying, the two overlapped.

- `scheduler`: the split point l under the paper's, a chunked and a pipelined model of time.
- `recompute`: K, V from a layer's attention inputs, as OPT, Llama and Qwen2 compute them.
- `model`: decoder layers with seeded random weights of the published shapes; one decode layer.
- `host`: pinned host memory at its exact size; the store of every layer's K, V and X.
- `runtime`: `KVPRDecoder` (copy / compute / store streams ordered by events), the resident
  reference, the timeline of a step and its Chrome-trace export.
- `profiler`: PCIe and recompute rates measured here; a drift monitor for re-profiling.
"""
