"""A decoder's layers run on fixed buffers, replayed as CUDA graphs on a GPU.

Where a layer moves little data, the KVPR runtime is bound by the host: eager PyTorch enqueues a
Llama layer as some 30 kernels, each a host call whatever its size. On the H200's machine a unit
(one layer of one GPU batch) cost the host 0.57-1.42 ms enqueued eagerly (`unit_host_ms` in
benchmarks/results/h200/kvpr_eager.json) and 0.22-0.59 ms with these graphs (kvpr_opt.json,
kvpr_llama.json). This is the one place kvlab states that cost. A CUDA graph enqueues a captured
sequence of kernels in one call. A decode layer's
shapes are fixed except the attention's length, which grows by one every step, so a layer runs as
- head (a graph): the attention norm; Q, K, V of the new tokens, with RoPE at the step's position
  (read from a device tensor, so one capture serves every step); the new K, V written into the
  KV slot's buffers at that position; X into the slot's X buffer (what goes back to the host);
- the attention over [0:s' + 1] (eager);
- tail (a graph): W_O, the residual, the MLP norm and the MLP, into the GPU batch's hidden rows.
A graph reads and writes fixed addresses: there is one head per (weights, GPU batch, KV slot) and
one tail per (weights, GPU batch). Their temporaries share one memory pool, which is safe because
they run one after another on one stream and none outlives its graph.
Without capture (on a CPU) the same functions run eagerly on the same buffers, so the CPU tests
check exactly what the graphs replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvlab.config import ModelConfig
from kvlab.model.attention import attend
from kvlab.model.layer import layer_head, layer_tail
from kvlab.model.rope import RopeTable
from kvlab.model.weights import LayerWeights


class StaticLayers:
    """A decoder's layers on fixed buffers (see the module doc).

    weights: the distinct weight sets layers run with (every layer's when resident, the GPU
    weight slots when offloaded). hidden: [gpu_batches, batch, hidden_size], each GPU batch's
    rows, updated in place. k_slots, v_slots: each KV slot's [max_context, batch, num_kv_heads,
    head_dim] buffers. capture: record CUDA graphs (needs the buffers on a GPU); else run eagerly.
    """

    def __init__(self, model: ModelConfig, weights: Sequence[LayerWeights], hidden: torch.Tensor,
                 k_slots: Sequence[torch.Tensor], v_slots: Sequence[torch.Tensor],
                 rope: RopeTable | None, capture: bool):
        if capture and hidden.device.type != "cuda":
            raise ValueError(f"capture=True with buffers on {hidden.device}: CUDA graphs need "
                             "a GPU")
        self.model, self.weights, self.hidden, self.rope = model, list(weights), hidden, rope
        self.k_slots, self.v_slots = list(k_slots), list(v_slots)
        batch, like = hidden.shape[1], {"dtype": hidden.dtype, "device": hidden.device}
        self.position = 0  # the step's cached length, s'
        self.positions = torch.zeros(batch, dtype=torch.long, device=hidden.device)
        self.x_new = [torch.empty(batch, model.hidden_size, **like) for _ in self.k_slots]
        self.q = torch.empty(batch, model.num_qo_heads, model.head_dim, **like)
        self.attn = torch.empty(batch, model.q_size, **like)
        pool = torch.cuda.graph_pool_handle() if capture else None
        gpu_batches, slots = range(hidden.shape[0]), range(len(self.k_slots))
        self._head = {(w, g, slot): self._replayable(lambda w=w, g=g, slot=slot:
                                                      self._run_head(w, g, slot), pool)
                      for w in range(len(self.weights)) for g in gpu_batches for slot in slots}
        self._tail = {(w, g): self._replayable(lambda w=w, g=g: self._run_tail(w, g), pool)
                      for w in range(len(self.weights)) for g in gpu_batches}

    def _replayable(self, fn: Callable[[], None], pool) -> Callable[[], None]:
        """`fn`, or on a GPU the replay of its CUDA graph (captured after one eager warm-up run on
        a side stream, as CUDA graph capture asks)."""
        if pool is None:
            return fn
        side = torch.cuda.Stream(self.hidden.device)
        side.wait_stream(torch.cuda.current_stream(self.hidden.device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(self.hidden.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            fn()
        return graph.replay

    def _run_head(self, w: int, g: int, slot: int) -> None:
        x, q, k, v = layer_head(self.model, self.weights[w], self.hidden[g], self.positions,
                                self.rope)
        self.x_new[slot].copy_(x)
        self.q.copy_(q)
        at = self.positions[:1]
        self.k_slots[slot].index_copy_(0, at, k[None])
        self.v_slots[slot].index_copy_(0, at, v[None])

    def _run_tail(self, w: int, g: int) -> None:
        self.hidden[g].copy_(layer_tail(self.model, self.weights[w], self.hidden[g], self.attn))

    def set_position(self, s: int) -> None:
        """Start a step at which every sequence has `s` cached tokens (the position is written
        on the current stream, before the step's layers)."""
        self.position = s
        self.positions.fill_(s)

    def run(self, w: int, g: int, slot: int) -> torch.Tensor:
        """One layer with weights[w] for GPU batch g, whose K, V for tokens [0:s] are in KV slot
        `slot` (s: the step's position). Updates hidden[g]; returns the new tokens' X (the
        slot's buffer: it holds until the slot's next layer)."""
        self._head[w, g, slot]()
        s = self.position
        k, v = self.k_slots[slot][:s + 1], self.v_slots[slot][:s + 1]
        self.attn.copy_(attend(self.model, self.q, k, v).reshape(self.attn.shape))
        self._tail[w, g]()
        return self.x_new[slot]
