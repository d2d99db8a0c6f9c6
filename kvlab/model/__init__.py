"""The decoder layer of OPT, Llama and Qwen2, shared by the engine (`kvlab.engine`) and the KVPR
runtime (`kvlab.offload`): plain functions over plain weight dataclasses, on the CPU or a GPU.

- `weights`: `AttentionWeights`, `LayerWeights` (seeded random ones of a model's published
  shapes), `fuse` (projections that share an input stacked), the tensors by name, the check.
- `norm`: LayerNorm and RMSNorm (with the residual add before it).
- `rope`: rotary frequencies (Llama 3 scaling), the cos/sin table, the rotation.
- `attention`: the attention input, Q, K, V at their positions, decode attention.
- `layer`: a layer's work before and after its attention; one decode layer whole.
- `hf`: HF transformers models sharing the layers' tensors (exactness tests, baselines).
"""
