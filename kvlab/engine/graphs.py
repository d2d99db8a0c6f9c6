"""Decode steps replayed as CUDA graphs, one per batch-size bucket.

An eager decode step of a real-size model launches some 20 kernels a layer from Python: the host,
not the GPU, sets its pace (Llama-3-8B on the H200: 24-34 ms a step against a roofline of 3.5-4.6
ms, observed in a session probe). A graph replays a whole step's launches at once.

For each bucket B (1, 2, 4, ... up to MAX_BUCKET) the first step of at most B sequences captures
`forward.decode_step` on static buffers: token ids, positions and cache slots [B], and a
`DecodePlan.for_capture` whose block tables and lengths are buffers too, planned for B sequences
of max_seq_len tokens. Each step fills the first rows of the buffers with its batch; the rows
past it decode a dummy token into a scratch block that no sequence owns (length 1, reading
whatever valid block their table's first entry still names), and their logits are dropped.
Copy-on-write block copies run before the replay, outside the graph.
All buckets share one memory pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.engine import forward

MAX_BUCKET = 256


def bucket(batch: int) -> int | None:
    """The smallest power of two >= batch, or None above MAX_BUCKET (run eagerly)."""
    size = 1
    while size < batch:
        size *= 2
    return size if size <= MAX_BUCKET else None


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    plan: object  # kvlab.kernels.decode.DecodePlan
    token_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logits: torch.Tensor


class DecodeGraphs:
    """Captured decode steps of one LLM's model and caches (see the module's docstring).

    scratch: (block id, slot) of a block reserved for the padding rows."""

    def __init__(self, model, weights, caches, rope, kernel: str, prefetch, max_seq_len: int,
                 scratch: tuple[int, int]):
        self.model, self.weights, self.caches, self.rope = model, weights, caches, rope
        self.kernel, self.prefetch, self.max_seq_len = kernel, prefetch, max_seq_len
        self.scratch_block, self.scratch_slot = scratch
        self.device = caches[0].device
        self.pool = torch.cuda.graph_pool_handle()
        self.captured: dict[int, _Captured] = {}

    @torch.no_grad()
    def step(self, copies, slots: list[int], token_ids: list[int], positions: list[int],
             tables: list[list[int]]) -> torch.Tensor:
        """fp32 logits [batch, vocab] of one decode step of len(token_ids) sequences (at most
        MAX_BUCKET): their new tokens' slots, ids and positions, and their block tables (after
        the manager placed the new tokens)."""
        batch = len(token_ids)
        size = bucket(batch)
        entry = self.captured.get(size) or self._capture(size)
        pad = size - batch
        for buffer, values, filler in ((entry.token_ids, token_ids, 0),
                                       (entry.positions, positions, 0),
                                       (entry.slots, slots, self.scratch_slot)):
            buffer.copy_(torch.tensor([*values, *[filler] * pad], dtype=torch.long))
        # only the columns this batch uses: the kernels read a row up to its length, and a
        # padding row (length 1) its first entry, which always holds some valid block id
        used = max(len(t) for t in tables)
        rows = [t + [self.scratch_block] * (used - len(t)) for t in tables]
        entry.plan.block_tables[:batch, :used].copy_(torch.tensor(rows, dtype=torch.int32))
        lens = [p + 1 for p in positions] + [1] * pad
        entry.plan.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        for cache in self.caches:
            cache.copy_blocks(copies)
        entry.graph.replay()
        return entry.logits[:batch]

    def _capture(self, size: int) -> _Captured:
        from kvlab.kernels.decode import DecodePlan

        plan = DecodePlan.for_capture(self.caches[0], size, self.max_seq_len,
                                      self.model.num_qo_heads, kernel=self.kernel,
                                      prefetch=self.prefetch)
        plan.block_tables.fill_(self.scratch_block)

        def zeros():
            return torch.zeros(size, dtype=torch.long, device=self.device)

        token_ids, positions, slots = zeros(), zeros(), zeros() + self.scratch_slot

        def run():
            return forward.decode_step(
                self.model, self.weights, self.caches, [], slots, token_ids, positions,
                lambda i, q: plan.run(q, self.caches[i].k_cache, self.caches[i].v_cache),
                self.rope)

        side = torch.cuda.Stream(self.device)  # warm up off the default stream, as torch asks
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = run()
        entry = _Captured(graph, plan, token_ids, positions, slots, logits)
        self.captured[size] = entry
        return entry
