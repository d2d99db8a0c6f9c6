"""`Runner`: one LLM's model on its paged cache: the weights, the cache, the passes and sampling.

It holds the weights (seeded random, a checkpoint's, or given; with tensor parallelism this
rank's shard), the cache (a BlockManager and one PagedKVCache per layer, or another LLM's), the
RoPE table, and the CUDA graphs of the decode steps (kvlab.engine.graphs). `prefill` runs the
admitted requests' contexts in one pass (causal SDPA on each, the layers' GEMMs on all their
tokens at once); `decode` runs a decode step already placed by the scheduler, replayed as a CUDA
graph where one serves it, else eagerly; `sample` draws its tokens.

Attention of a decode step: "reference" (kvlab.reference, fp32, any device), or on a GPU the
CUDA kernels "vllm_v1", "gqa" or "auto" (kvlab.DecodePlan; "auto" takes the fastest for the
cache's layout, kvlab.kernels.families.kernel_layout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvlab.cache import BlockManager
from kvlab.cache.block_manager import StepAllocation
from kvlab.cache.paged_cache import PagedKVCache, cache_nbytes, check_fits
from kvlab.engine import checkpoint, forward, tp
from kvlab.engine.config import EngineConfig
from kvlab.engine.graphs import DecodeGraphs, bucket
from kvlab.engine.scheduler import Request, context
from kvlab.engine.weights import ModelWeights
from kvlab.kernels import layer_ops
from kvlab.kernels.families import kernel_layout
from kvlab.model.layer import KvAhead
from kvlab.model.rope import RopeTable


def cache_layout(attention: str) -> str:
    """The cache layout that `attention` (one of kvlab.engine.config.ATTENTIONS) reads."""
    return "hnd" if attention == "reference" else kernel_layout(attention)


class Runner:
    """Runs one LLM's model (the module's docstring).

    config: the LLM's EngineConfig. shared: a Runner whose cache (its manager, caches and
    scratch sequences) this one uses too (LLM.with_attention(share_cache=True), which checked
    the layout); None: a cache of its own, or none with offload. Raises ValueError, before
    allocating anything, for weights and a cache that do not fit the device's free memory
    together.

    model: the shape this rank computes (config.local); reduce: forward.Reduce with tensor
    parallelism, else None; scratch_ids: the manager's sequences that hold the graphs' padding
    rows (one per LLM with graphs on this cache; shared with `shared`).
    """

    def __init__(self, config: EngineConfig, shared: Runner | None = None):
        self.config, self.device, self.model = config, config.device, config.local
        self.reduce = tp.all_reduce if config.world_size > 1 else None
        _check_memory(config, own_cache=not config.offload and shared is None)
        self.weights = config.weights if config.weights is not None else _load_weights(config)
        m = self.model
        if config.offload:
            self.manager, self.caches, self.scratch_ids = None, [], []
        elif shared is not None:
            self.manager, self.caches = shared.manager, shared.caches
            self.scratch_ids = shared.scratch_ids
        else:
            self.manager = BlockManager(config.num_blocks, config.block_size)
            self.caches = [PagedKVCache(config.num_blocks, config.block_size, m.num_kv_heads,
                                        m.head_dim, config.dtype, self.device,
                                        cache_layout(config.attention), manager=self.manager)
                           for _ in range(m.num_layers)]
            self.scratch_ids: list[int] = []
        # NOTE: no sequence outgrows the cache: the tables need not reach the context limit (with
        # offload, each generate makes the table of its prompts)
        longest = min(m.max_position, config.num_blocks * config.block_size)
        self.rope = (RopeTable.build(m, longest, config.dtype, self.device)
                     if m.position == "rope" and not config.offload else None)
        self.graphs = self._decode_graphs(longest) if config.decode_graphs else None

    def _decode_graphs(self, longest: int) -> DecodeGraphs:
        """The decode steps' graphs, with a block of their own for the padding rows."""
        scratch = self.manager.add_sequence(1).seq_id
        self.scratch_ids.append(scratch)
        config = self.config
        return DecodeGraphs(
            self.model, self.weights, self.caches, self.rope, config.attention, config.prefetch,
            min(config.graph_max_len, longest),
            (self.manager.block_table(scratch)[0], self.manager.slot_mapping(scratch, 0, 1)[0]),
            self.reduce, config.ahead_bytes, config.ahead_kv_bytes)

    def prefill(self, requests: list[Request]) -> torch.Tensor:
        """Run the placed requests' contexts in one pass; the logits [len(requests),
        vocab_size] of each one's last context token."""
        prompts = [torch.tensor(context(r), dtype=torch.long, device=self.device)
                   for r in requests]
        allocs = [r.alloc for r in requests]
        for r in requests:
            r.alloc = None
        return forward.prefill(self.model, self.weights, self.caches, allocs, prompts, self.rope,
                               self.reduce)

    def decode(self, seq_ids: list[int], token_ids: list[int] | torch.Tensor,
               placed: StepAllocation) -> torch.Tensor:
        """Queue a decode step of the sequences `seq_ids`, their new tokens already placed
        (`placed`: BlockManager.append_one's answer); its logits [batch, vocab_size], not waited
        for. token_ids: the step's input tokens, one per sequence, a list, or an int64 tensor on
        the device (the previous step's sampled ids, not yet on the host)."""
        if (self.graphs is not None and bucket(len(seq_ids)) is not None
                and max(placed.positions) < self.graphs.max_seq_len):
            return self.graphs.step(seq_ids, token_ids, placed, self.manager.block_table)
        ids = (torch.tensor(token_ids, dtype=torch.long, device=self.device)
               if isinstance(token_ids, list) else token_ids)
        slots, positions = (torch.tensor(xs, dtype=torch.long, device=self.device)
                            for xs in (placed.slots, placed.positions))
        attend, kv_ahead = self.step_attention(seq_ids)
        return forward.decode_step(self.model, self.weights, self.caches, placed.copies, slots,
                                   ids, positions, attend, self.rope, self.reduce,
                                   self.config.ahead_bytes, kv_ahead)

    def attend(self, seq_ids: Sequence[int]) -> forward.Attend:
        """The attention of a decode step of the sequences `seq_ids` (config.attention)."""
        return self.step_attention(seq_ids)[0]

    def step_attention(self, seq_ids: Sequence[int]) -> tuple[forward.Attend, KvAhead | None]:
        """`attend`'s attention, and the prefetch of the K/V blocks it reads
        (config.ahead_kv_bytes over its plan's tables; None where that is off)."""
        attention = self.config.attention
        if attention == "reference":
            from kvlab.reference import decode_attention

            return lambda i, q: decode_attention(q, self.caches[i], seq_ids), None
        from kvlab.kernels.decode import DecodePlan

        plan = DecodePlan(self.caches[0], seq_ids, self.model.num_qo_heads, kernel=attention,
                          prefetch=self.config.prefetch)
        nbytes = self.config.ahead_kv_bytes
        return (lambda i, q: plan.run(q, self.caches[i].k_cache, self.caches[i].v_cache),
                KvAhead(nbytes, plan.block_tables, plan.seq_lens) if nbytes else None)

    def synchronize(self) -> None:
        """Wait for the work queued on the GPU (nothing to wait for elsewhere)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _check_memory(config: EngineConfig, own_cache: bool) -> None:
    """DoesNotFit (a ValueError) unless what a Runner keeps fits the device's free memory
    together: the weights it makes or loads (none where config.weights are given; with tensor
    parallelism this rank's shard, which it keeps once the whole model is loaded and cut) and,
    with `own_cache`, the cache's K, V tensors."""
    m, parts = config.local, []
    if config.weights is None:
        shapes = ModelWeights.random(m, dtype=config.dtype, device="meta")
        nbytes = shapes.nbytes
        if (config.checkpoint_path is not None and shapes.lm_head is not shapes.embed
                and checkpoint.ties_lm_head(config.checkpoint_path, config.model)):
            nbytes -= shapes.lm_head.nbytes  # the embedding serves as the LM head
        parts.append((f"model={config.model.name!r}: its weights", nbytes))
    if own_cache:
        parts.append((f"num_blocks={config.num_blocks}: the K/V tensors of {m.num_layers} layers",
                      m.num_layers * cache_nbytes(config.num_blocks, config.block_size,
                                                  m.num_kv_heads, m.head_dim, config.dtype,
                                                  cache_layout(config.attention))))
    if parts:
        what = " and ".join(f"{what} ({nbytes:,} bytes)" for what, nbytes in parts)
        check_fits(what, sum(nbytes for _, nbytes in parts), config.device)


def _load_weights(config: EngineConfig) -> ModelWeights:
    """Seeded random weights of config.model, or its checkpoint's; with tensor parallelism,
    this rank's shard."""
    if config.checkpoint_path is None:
        weights = ModelWeights.random(config.model, config.seed, config.dtype, config.device)
    else:
        weights = checkpoint.load_weights(config.checkpoint_path, config.model, config.dtype,
                                          config.device)
    if config.world_size > 1:
        weights = tp.shard_weights(config.model, weights, config.rank, config.world_size)
    return weights


FP32 = torch.finfo(torch.float32)


def sampler(temperature: float, top_p: float,
            generator: torch.Generator) -> Callable[[torch.Tensor], torch.Tensor]:
    """`sample` with these settings: logits [batch, vocab] -> token ids int64 [batch]."""
    def sample_logits(logits: torch.Tensor) -> torch.Tensor:
        return sample(logits, temperature, top_p, generator)
    return sample_logits


def sample(logits: torch.Tensor, temperature: float, top_p: float,
           generator: torch.Generator) -> torch.Tensor:
    """One token id per row of logits [batch, vocab], int64 [batch] on their device (no wait
    for the GPU): greedy at temperature 0, else from the top-p nucleus of
    softmax(logits / temperature) in fp32. Any temperature > 0 and top_p in (0, 1] sample
    right: the logits are divided after their max is taken off (all <= 0, so nothing
    overflows), by the temperature clamped to [FP32.tiny, 1 / FP32.tiny], where it and its
    reciprocal are normal fp32 numbers (beyond, the draw is the limit's: greedy, ties split
    evenly, or uniform); the nucleus always keeps the top token."""
    if temperature == 0:
        return layer_ops.argmax(logits) if layer_ops.usable(logits) else logits.argmax(dim=-1)
    logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted / min(max(temperature, FP32.tiny), 1 / FP32.tiny), dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # keep the top tokens up to and including the one that brings the total to top_p
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
    outside[:, 0] = False  # the top token, whatever top_p rounds to in fp32
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    picks = torch.multinomial(sorted_probs, 1, generator=generator)
    return order.gather(-1, picks)[:, 0]
