"""KVPR (ACL 2025): the KV cache in host memory, each layer's K, V brought to the GPU partly by
recomputing them from transferred activations and partly by copying, the two overlapped.

- `scheduler`: the split point l under the paper's model and a chunked-pipeline model.
- `recompute`: K, V from a layer's input activations, as each model family computes them.
"""
