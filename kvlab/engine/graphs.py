"""Decode steps replayed as CUDA graphs, one per batch-size bucket and span of lengths.

An eager decode step of a real-size model launches 15 or more kernels a layer from Python: the
host, not the GPU, sets its pace. A graph replays a whole step's launches at once.

For each bucket B (1, 2, 4, ... up to MAX_BUCKET) and span S (MIN_SPAN, 2 MIN_SPAN, ... up to
max_seq_len) the first step of at most B sequences of at most S tokens captures
`forward.decode_step` on static buffers: token ids, positions, cache slots and lengths [B], and a
`DecodePlan.for_capture` whose block tables and lengths are buffers too, planned for B sequences
of S tokens. A plan made for longer sequences than a step's splits them into partitions that
mostly hold nothing, and a small batch pays for launching and merging those (Llama-3-8B at
batch 1 and 640 tokens, planned for 8,192, launches 32 partitions a KV head, 3 of them holding
tokens, and merges all 32; planned for 1,024, 4): spans keep the plan near the step's lengths.
Each step fills the first rows of the buffers with its batch; the rows past it (padding) decode
token 0 at position 0 into a scratch block that no sequence owns, with length 1 and a table of
that block, and their logits are dropped.

The host side of a step is `HostInputs`, shared by the buckets: it fills pinned buffers and
keeps the block tables from step to step, asking the manager for a whole table only for a
sequence it has not seen one token ago. Then two copies reach the GPU: the four int vectors in
one, and the block tables' used columns, packed, in the other (unpacked there). A step queued
before the previous step's tokens reach the host (the engine's async_decode) takes its token
ids from them on the GPU, in a third copy. Copy-on-write block copies run before the replay,
outside the graph, on the steps that have any.
All graphs share one memory pool. Each keeps its logits [B, vocab] there: a span whose graphs
every bucket has captured holds 511 rows of logits (155 MB in fp16 at a 152k vocabulary), and
each span's graphs are captured only when a step first needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvlab.arith import ceil_div
from kvlab.cache.block_manager import StepAllocation
from kvlab.engine import forward
from kvlab.model.layer import KvAhead

MAX_BUCKET = 256
MIN_SPAN = 512  # tokens the shortest span's plan is made for


def bucket(batch: int) -> int | None:
    """The smallest power of two >= batch, or None above MAX_BUCKET (run eagerly)."""
    size = 1
    while size < batch:
        size *= 2
    return size if size <= MAX_BUCKET else None


def span(longest: int, max_seq_len: int) -> int:
    """The tokens a step's plan is made for when its longest sequence has `longest` (<=
    max_seq_len): the smallest MIN_SPAN x a power of two that holds them, at most max_seq_len."""
    size = MIN_SPAN
    while size < longest:
        size *= 2
    return min(size, max_seq_len)


TOKEN_IDS, POSITIONS, SLOTS, SEQ_LENS = range(4)  # the rows of a step's int64 inputs


class HostInputs:
    """The host side of the graphs' inputs: what a decode step copies to the GPU.

    max_rows: the most rows of a step (the largest bucket); max_blocks: the graphs' block-table
    width; scratch_block, scratch_slot: the padding rows' block and slot. pin_memory: fill
    page-locked buffers, so that copies from them to a GPU need not block.

    block_tables: numpy int32 [max_rows, max_blocks], kept from step to step: the block table
        of the sequence each row last held, in its first entries; the entries past them are
        stale but, like every entry, a valid block id.
    Between steps it remembers which sequence each row held and at what length. A row that
    holds the same sequence one token later, or that takes a sequence another row held one
    token ago (the rows shift when a request in the middle finishes), gets the one entry of
    its new token; only a row whose sequence it has not seen at that length asks the manager
    for the whole table. All steps share it, whatever their bucket (the rows of one batch are
    the same in every bucket).

    The pinned buffers come in two sets, and successive fills alternate between them: a step's
    copies from its set may still be queued on the GPU while the host fills the next step's
    (async_decode). The set that fill n+1 rewrites was copied from for step n-1, so the caller
    must know that step n-1's copies are done (the engine has waited for its tokens).
    """

    def __init__(self, max_rows: int, max_blocks: int, block_size: int, scratch_block: int,
                 scratch_slot: int, pin_memory: bool = False):
        self.block_size, self.scratch_block = block_size, scratch_block
        self.block_tables = np.full((max_rows, max_blocks), scratch_block, dtype=np.int32)
        self._sets = [(torch.empty(4 * max_rows, dtype=torch.int64, pin_memory=pin_memory),
                       torch.empty(max_rows * max_blocks, dtype=torch.int32,
                                   pin_memory=pin_memory)) for _ in range(2)]
        self._turn = 0  # the set the next fill writes
        self._padding = np.array([[0], [0], [scratch_slot], [1]])  # a padding row's inputs
        # NOTE: a step's host work delays its launch, and small numpy and torch calls cost
        # microseconds each: the views of the buffers are made once (per set and step size),
        # and a step's rows are written in two assignments.
        self._input_views: dict[tuple[int, int], tuple[torch.Tensor, np.ndarray]] = {}
        # the sequence each row of block_tables holds (-1: none yet), and its length there
        self._row_seq_ids = np.full(max_rows, -1, dtype=np.int64)
        self._row_seq_lens = np.zeros(max_rows, dtype=np.int64)
        self._num_rows = 0  # the last step's batch: where a sequence that moved was

    def fill(self, size: int, seq_ids: Sequence[int], token_ids: Sequence[int] | None,
             positions: Sequence[int], slots: Sequence[int],
             block_table: Callable[[int], list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs of a step of `size` rows: rows [0, len(seq_ids)) a batch of sequences,
        each already placed (its new token `token_ids[i]` at `positions[i]`, in cache slot
        `slots[i]`), the rest padding (token 0, position 0, the scratch slot, length 1 and the
        scratch block). token_ids None: 0 in every row (the caller fills them on the GPU).
        block_table(seq_id): a sequence's block table after the placement.

        Returns (inputs, tables): inputs int64 [4, size], rows TOKEN_IDS, POSITIONS, SLOTS,
        SEQ_LENS (the lengths with the new tokens); tables int32 [size, used], the first `used`
        entries of each row's block table, enough for the longest sequence (the kernels read
        a row only up to its length). Both are views of one of the two sets of buffers, which
        the fill after next rewrites."""
        batch, bs = len(seq_ids), self.block_size
        turn, self._turn = self._turn, 1 - self._turn
        if (turn, size) not in self._input_views:
            view = self._sets[turn][0][:4 * size].view(4, size)
            self._input_views[turn, size] = view, view.numpy()
        inputs, values = self._input_views[turn, size]
        seq_ids_np = np.asarray(seq_ids, dtype=np.int64)
        values[TOKEN_IDS, :batch] = 0 if token_ids is None else token_ids
        values[POSITIONS:, :batch] = positions, slots, positions
        values[SEQ_LENS, :batch] += 1
        values[:, batch:] = self._padding
        positions_np, slots_np = values[POSITIONS, :batch], values[SLOTS, :batch]
        used = max(positions) // bs + 1
        self._update_tables(seq_ids, seq_ids_np, positions_np, used, block_table)
        # every row: the entry of its new token, the block of its slot
        self.block_tables[np.arange(batch), positions_np // bs] = slots_np // bs
        self._row_seq_ids[:batch] = seq_ids_np
        self._row_seq_lens[:batch] = values[SEQ_LENS, :batch]
        self._num_rows = batch
        tables = self._sets[turn][1][:size * used].view(size, used)
        packed = tables.numpy()
        packed[:batch] = self.block_tables[:batch, :used]
        packed[batch:] = self.scratch_block
        return inputs, tables

    def _update_tables(self, seq_ids, seq_ids_np, positions, used, block_table) -> None:
        """Bring each row's table up to date but for its new token's entry."""
        # NOTE: the manager never reuses a seq id, and one more token changes a sequence's table
        # only at the entry holding it (a new block, or the copy of a shared last block).
        batch = len(seq_ids)
        current = ((self._row_seq_ids[:batch] == seq_ids_np)
                   & (self._row_seq_lens[:batch] == positions))
        changed = np.flatnonzero(~current).tolist()
        if not changed:
            return
        num_rows = self._num_rows
        row_of = dict(zip(self._row_seq_ids[:num_rows].tolist(), range(num_rows), strict=True))
        sources, moved, rewritten = [], [], []
        for row in changed:
            source = row_of.get(seq_ids[row])
            if source is not None and self._row_seq_lens[source] == positions[row]:
                sources.append(source)
                moved.append(row)
            else:
                rewritten.append(row)
        tables = self.block_tables
        tables[moved, :used] = tables[sources, :used]  # the sources are read before any write
        for row in rewritten:
            table = block_table(seq_ids[row])
            tables[row, :len(table)] = table


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    plan: object  # kvlab.kernels.decode.DecodePlan; its block_tables and seq_lens are the graph's
    inputs: torch.Tensor  # int64 [4, size] on the GPU, rows TOKEN_IDS, POSITIONS, SLOTS, SEQ_LENS
    logits: torch.Tensor


class DecodeGraphs:
    """Captured decode steps of one LLM's model and caches (see the module's docstring).

    scratch: (block id, slot) of a block reserved for the padding rows. model: the shape this
    rank computes (LLM.local); reduce: forward.Reduce with tensor parallelism."""

    def __init__(self, model, weights, caches, rope, kernel: str, prefetch, max_seq_len: int,
                 scratch: tuple[int, int], reduce=None, ahead_bytes: int = 0,
                 ahead_kv_bytes: int = 0):
        self.model, self.weights, self.caches, self.rope = model, weights, caches, rope
        self.reduce = reduce  # forward.Reduce with tensor parallelism
        # forward.decode_step's cross-kernel prefetch: of the weights, of the K/V blocks
        self.ahead_bytes, self.ahead_kv_bytes = ahead_bytes, ahead_kv_bytes
        self.kernel, self.prefetch, self.max_seq_len = kernel, prefetch, max_seq_len
        self.scratch_block, self.scratch_slot = scratch
        self.device = caches[0].device
        self.pool = torch.cuda.graph_pool_handle()
        self.captured: dict[tuple[int, int], _Captured] = {}  # by (bucket, span)
        block_size = caches[0].block_size
        max_blocks = ceil_div(max_seq_len, block_size)  # as DecodePlan.for_capture's tables
        self.host = HostInputs(MAX_BUCKET, max_blocks, block_size, *scratch, pin_memory=True)
        # the used columns' way in: copied whole, then unpacked into the plan's block tables
        self.staged_tables = torch.empty(MAX_BUCKET * max_blocks, dtype=torch.int32,
                                         device=self.device)

    @torch.no_grad()
    def step(self, seq_ids: Sequence[int], token_ids: Sequence[int] | torch.Tensor,
             placed: StepAllocation, block_table: Callable[[int], list[int]]) -> torch.Tensor:
        """Logits [batch, vocab] of one decode step of len(seq_ids) sequences (at most
        MAX_BUCKET, each shorter than max_seq_len with its new token): their new tokens
        `token_ids` (a list, or an int64 tensor [batch] on the GPU), already placed (`placed`:
        BlockManager.append_one's answer), and block_table(seq_id), a sequence's block table
        after the placement. Queued, not waited for."""
        size = bucket(len(seq_ids))
        key = size, span(max(placed.positions) + 1, self.max_seq_len)
        entry = self.captured.get(key) or self._capture(*key)
        # NOTE: the copies from pinned memory below are only queued when step returns; the
        # fill after next rewrites their sources (HostInputs: the caller waits for this step's
        # tokens before then).
        on_gpu = isinstance(token_ids, torch.Tensor)
        inputs, tables = self.host.fill(size, seq_ids, None if on_gpu else token_ids,
                                        placed.positions, placed.slots, block_table)
        entry.inputs.copy_(inputs, non_blocking=True)
        if on_gpu:
            entry.inputs[TOKEN_IDS, :len(seq_ids)].copy_(token_ids)
        used = tables.shape[1]
        staged = self.staged_tables[:size * used].view(size, used)
        staged.copy_(tables, non_blocking=True)
        entry.plan.block_tables[:, :used].copy_(staged)
        if placed.copies:  # most steps copy no block: skip a call per layer
            for cache in self.caches:
                cache.copy_blocks(placed.copies)
        entry.graph.replay()
        return entry.logits[:len(seq_ids)]

    def _capture(self, size: int, tokens: int) -> _Captured:
        from kvlab.kernels.decode import DecodePlan

        plan = DecodePlan.for_capture(self.caches[0], size, tokens,
                                      self.model.num_qo_heads, kernel=self.kernel,
                                      prefetch=self.prefetch)
        plan.block_tables.fill_(self.scratch_block)
        inputs = torch.zeros(4, size, dtype=torch.int64, device=self.device)  # padding rows
        inputs[SLOTS], inputs[SEQ_LENS] = self.scratch_slot, 1
        token_ids, positions, slots = inputs[TOKEN_IDS], inputs[POSITIONS], inputs[SLOTS]
        kv_ahead = (KvAhead(self.ahead_kv_bytes, plan.block_tables, plan.seq_lens)
                    if self.ahead_kv_bytes else None)

        def run():
            # int64 -> int32 inside the graph, so that one copy from the host fills all four rows
            plan.seq_lens.copy_(inputs[SEQ_LENS])
            return forward.decode_step(
                self.model, self.weights, self.caches, [], slots, token_ids, positions,
                lambda i, q: plan.run(q, self.caches[i].k_cache, self.caches[i].v_cache),
                self.rope, self.reduce, self.ahead_bytes, kv_ahead)

        side = torch.cuda.Stream(self.device)  # warm up off the default stream, as torch asks
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = run()
        entry = _Captured(graph, plan, inputs, logits)
        self.captured[size, tokens] = entry
        return entry
