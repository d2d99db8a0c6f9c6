"""A decoder-only inference engine on kvlab's paged KV cache and decode kernels.

- `weights`: a whole model's weights (embeddings, the `kvlab.model` decoder layers, final norm,
  LM head), seeded random of any preset's shapes.
- `forward`: the prefill of a batch of prompts and a decode step of a batch over the paged
  cache; the layer math is `kvlab.model`'s, shared with the KVPR runtime.
- `config`: `EngineConfig`, `LLM`'s arguments checked and their defaults resolved.
- `scheduler`: `Scheduler`, continuous batching: admission, the decode batch, preemption by
  recompute, the blocks each request holds.
- `runner`: `Runner`, the weights, the paged cache, the prefill and decode passes (eager or
  CUDA graphs) and greedy and top-p sampling.
- `llm`: `LLM`, the facade that wires the three and runs generate's loop (async decode).
- `generation`: `Generation`, what `LLM.generate` returns, and `TokenLog`, how it records each
  new token (shared with `offloaded`).
- `offloaded`: `LLM(offload=True)`, the K, V in host memory and each decode step through the
  KVPR runtime (`kvlab.offload.runtime`).
- `graphs`: decode steps captured and replayed as CUDA graphs, one per batch bucket and
  span.
- `checkpoint`: a local Hugging Face checkpoint (config.json, safetensors) as weights.
- `hf`: the HF transformers model with the same weights (tests and the end-to-end peer).
- `tp`: tensor parallelism, each rank a shard of the heads and the MLP (`LLM(tensor_parallel=)`).
"""

from kvlab.engine.generation import Generation
from kvlab.engine.llm import LLM

__all__ = ["LLM", "Generation"]
