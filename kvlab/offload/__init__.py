"""KVPR (ACL 2025): the KV cache in host memory, each layer's K, V brought to the GPU partly by
recomputing them from transferred activations and partly by copying, the two overlapped.

- `scheduler`: the split point l under the paper's, a chunked and a pipelined model of time.
- `recompute`: K, V from a layer's attention inputs, as OPT, Llama and Qwen2 compute them.
- `model`: decoder layers with seeded random weights of the published shapes; one decode layer.
- `host`: pinned host memory at its exact size; the store of every layer's K, V and X; prefill.
- `weights`: the layers' weights packed in pinned host memory, W_K and W_V first (offloaded).
- `runtime`: `KVPRDecoder` (copy / compute / store streams ordered by events; row and column
  schedules) and the resident reference.
- `timeline`: CUDA events per operation and stream; Chrome-trace export.
- `profiler`: link, recompute and layer rates measured here; a drift monitor.
- `loop`: many decode steps, l chosen at each, re-profiled on drift.
- `hf`: HF transformers models sharing the layers' tensors (the offloaded-cache baseline).
"""
