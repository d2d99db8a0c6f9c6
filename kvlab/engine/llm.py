"""`LLM`: generate tokens with a whole model on kvlab's paged KV cache and decode kernels.

    llm = kvlab.LLM("llama3-8b", attention="gqa")          # seeded random weights, on the GPU
    out = llm.generate([[1, 2, 3], [4, 5]], max_new_tokens=32)
    out.tokens, out.step_ms                                  # new tokens; ms per decode step
    v1 = llm.with_attention("vllm_v1")                     # the same weight tensors, own cache

`LLM` wires three parts, as nano-vllm does: its arguments checked and resolved
(`kvlab.engine.config.EngineConfig`), the `Scheduler` (kvlab.engine.scheduler: which requests
wait and which run, admission, preemption by recompute, their blocks) and the `Runner`
(kvlab.engine.runner: the weights, the cache, the prefill and decode passes, CUDA graphs,
sampling). `generate` runs the loop between them: admit and prefill, preempt, launch a decode
step, take its tokens. However generate ends (an exception, an interrupt too), its requests give
their blocks back, and the GPU's queued work is done before it returns.

Asynchronous decode (async_decode, on by default on a GPU): a decode step is queued before the
previous step's tokens reach the host. It reads them on the GPU (its token ids are the previous
step's sampled ids, a device tensor), so the host places it, fills its inputs and launches it
while the GPU still runs the previous step, and the GPU does not wait for the host between
steps (on the CUDA-graph path; an eager step's own copies from the host wait for the GPU).
The host runs one step ahead only while the batch cannot change: no request reaches its
max_new_tokens at the step in flight, no waiting request could be admitted, and the next step's
blocks fit without preempting; otherwise it waits for the step's tokens first (the synchronous
step). EOS cannot be foreseen: a request that ends with it at the step in flight has a row in
the step queued after it, whose token is dropped (a step whose rows are all dropped counts in
step_ms with no tokens). Its blocks are freed when the EOS reaches the host; the queued step
still writes that row's K, V into them, but on the same stream, before any later work, and
nothing is admitted or queued ahead until that step's tokens are in, so a waiting request
joins a step later than without async decode. Greedy tokens are the same either way; sampled
tokens are too, but for the draws after an EOS (the dropped row draws as well).

With offload=True there is no paged cache and no scheduler: the K, V live in host memory and
each decode step runs the KVPR runtime (kvlab.engine.offloaded: a batch of one prompt length,
started and ended together).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from kvlab.checks import check_bool, check_int, check_real, is_int, is_real
from kvlab.config import ModelConfig
from kvlab.engine import offloaded
from kvlab.engine.config import ATTENTIONS, DEFAULT_PREFILL_TOKENS, EngineConfig, as_flag
from kvlab.engine.generation import Generation, SampledTokens, TokenLog, clock_ms
from kvlab.engine.runner import Runner, cache_layout, sampler
from kvlab.engine.scheduler import Request, Scheduler, arrival_times, make_requests
from kvlab.engine.weights import ModelWeights
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.offload.scheduler import LinkAndCompute

SAMPLING_SEEDS = (-2**63, 2**64 - 1)  # what torch.Generator.manual_seed takes


@dataclass
class Step:
    """A decode step launched: its requests, in row order, and its sampled tokens. started_ms:
    when its time began (time.perf_counter() ms): when the tokens of the decode step before it
    reached the host, or its launch where no decode step came before it since the last
    prefill."""

    rows: list[Request]
    tokens: SampledTokens
    started_ms: float


class LLM:
    """A decoder-only model on a paged KV cache.

    The arguments are EngineConfig's (kvlab.engine.config, which documents each). Raises
    ValueError, before allocating anything, for anything it cannot run.

    Attributes: config (the EngineConfig, its defaults resolved), and from it model, local (the
    shape this rank computes with tensor_parallel, else `model`), device, attention, prefetch,
    ahead_bytes, ahead_kv_bytes, seed, block_size, max_prefill_tokens, async_decode, offload,
    offload_rates, offload_graphs; the runner's weights, manager and caches (one PagedKVCache per
    layer; None and [] with offload), rope and graphs (kvlab.engine.graphs.DecodeGraphs, or None);
    scheduler (None with offload) and runner.
    """

    def __init__(self, model: str | ModelConfig = "tiny-llama", *, attention: str = "auto",
                 prefetch: PrefetchConfig | None = None, ahead_bytes: int = 0,
                 ahead_kv_bytes: int = 0, dtype: torch.dtype | None = None, device=None,
                 seed: int = 0, block_size: int = 16,
                 num_blocks: int | None = None, cuda_graphs: bool | None = None,
                 graph_max_len: int | None = None, weights: ModelWeights | None = None,
                 tensor_parallel: bool = False,
                 max_prefill_tokens: int = DEFAULT_PREFILL_TOKENS, offload: bool = False,
                 offload_rates: LinkAndCompute | None = None, async_decode: bool | None = None):
        self._wire(EngineConfig(
            model, attention=attention, prefetch=prefetch, ahead_bytes=ahead_bytes,
            ahead_kv_bytes=ahead_kv_bytes, dtype=dtype, device=device, seed=seed,
            block_size=block_size, num_blocks=num_blocks, cuda_graphs=cuda_graphs,
            graph_max_len=graph_max_len, max_prefill_tokens=max_prefill_tokens, offload=offload,
            offload_rates=offload_rates, tensor_parallel=tensor_parallel,
            async_decode=async_decode, weights=weights))

    def _wire(self, config: EngineConfig, cache_of: LLM | None = None) -> None:
        """Build the runner (with cache_of: on that LLM's cache) and the scheduler of `config`."""
        self.config = config
        self.model, self.local, self.device = config.model, config.local, config.device
        self.attention, self.prefetch = config.attention, config.prefetch
        self.ahead_bytes, self.ahead_kv_bytes = config.ahead_bytes, config.ahead_kv_bytes
        self.seed, self.block_size = config.seed, config.block_size
        self.max_prefill_tokens, self.async_decode = config.max_prefill_tokens, config.async_decode
        self.offload, self.offload_rates = config.offload, config.offload_rates
        self.offload_graphs = config.offload_graphs
        runner = self.runner = Runner(config, cache_of.runner if cache_of is not None else None)
        self.weights, self.manager, self.caches = runner.weights, runner.manager, runner.caches
        self.rope, self.graphs = runner.rope, runner.graphs
        self.scheduler = (None if config.offload else
                          Scheduler(runner.manager, config.max_prefill_tokens, runner.scratch_ids))

    def __repr__(self):
        cache = ("offload=True" if self.offload else
                 f"num_blocks={self.manager.num_blocks}, block_size={self.block_size}")
        return (f"LLM({self.model.name!r}, attention={self.attention!r}, dtype={self.dtype}, "
                f"device={self.device}, {cache})")

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.dtype

    @property
    def usable_blocks(self) -> int:
        """The cache's blocks that requests may take: all but the graphs' scratch blocks (0 with
        offload: no paged cache)."""
        return self.scheduler.usable_blocks if self.scheduler is not None else 0

    def with_attention(self, attention: str = "auto", *,
                       prefetch: PrefetchConfig | None = None, ahead_bytes: int = 0,
                       ahead_kv_bytes: int = 0, async_decode: bool | None = None,
                       share_cache: bool = False) -> LLM:
        """A new LLM that runs this one's weights (the same tensors, not a copy: one model's
        memory for several attention variants) with `attention`, `prefetch`, `ahead_bytes` and
        `ahead_kv_bytes` (the cross-kernel prefetch), and `async_decode` (None: this LLM's). It
        has graphs of its own, and this LLM's model, dtype, device, seed, block_size,
        num_blocks, cuda_graphs, graph_max_len and max_prefill_tokens. Its caches and their
        manager are its own, or with share_cache this LLM's (an attention of the same cache
        layout; the two must not generate at once: each generate starts from, and leaves, an
        empty cache). Raises ValueError as the constructor does."""
        share_cache = as_flag("share_cache", share_cache)
        if self.offload:
            raise ValueError("with_attention: this LLM decodes through KVPR (offload=True), with "
                             "no attention to swap; make kvlab.LLM(..., weights=llm.weights) "
                             "for a paged one")
        if share_cache:
            # (an unknown attention is the config's to refuse)
            if attention in ATTENTIONS and cache_layout(attention) != self.caches[0].layout:
                raise ValueError(f"share_cache=True: attention={attention!r} does not read "
                                 f"this LLM's {self.caches[0].layout!r} cache layout")
        config = replace(self.config, attention=attention, prefetch=prefetch,
                         ahead_bytes=ahead_bytes, ahead_kv_bytes=ahead_kv_bytes,
                         async_decode=self.async_decode if async_decode is None
                         else async_decode, weights=self.weights)
        twin = LLM.__new__(LLM)
        twin._wire(config, self if share_cache else None)
        return twin

    def generate(self, prompts, max_new_tokens: int | Sequence[int] = 16, *,
                 temperature: float = 0.0, top_p: float = 1.0, eos_token_id: int | None = None,
                 ignore_eos: bool = False, seed: int | None = None,
                 arrivals: Sequence[float] | None = None,
                 on_finish: Callable[[int, int], None] | None = None) -> Generation:
        """New tokens for each prompt (a list of token ids, or a list of them).

        max_new_tokens: one limit for all, or one per prompt. arrivals: when each request
        arrives, in seconds after the call (a serving run: a request waits, not admitted, until
        then); default all at once. on_finish(done, total) is called as each request finishes
        (a progress bar). With offload (kvlab.engine.offloaded): one prompt length and one
        max_new_tokens for the batch, and no arrivals.

        temperature 0 is greedy; above 0, tokens are sampled from softmax(logits / temperature)
        within the smallest set of top tokens whose probability reaches top_p (generator seeded
        with `seed`, an integer in SAMPLING_SEEDS, default the LLM's). A request stops at
        max_new_tokens, or at eos_token_id unless ignore_eos (a bool). Numbers may be numpy
        scalars, never bools.

        Raises ValueError, before anything runs, for a prompt that is empty, not token ids of
        the vocabulary, or longer than the context limit with its new tokens, for
        max_new_tokens < 1, a request that the free blocks cannot hold (the whole cache, or
        what sequences outside this generate leave free: an LLM sharing this cache), arrivals
        with tensor_parallel (each rank would admit by its own clock), or any other argument
        out of its range; RuntimeError if blocks taken outside while it runs leave a request
        that has arrived no way ever to be admitted. However it ends (its results, an
        exception, an interrupt), its requests' blocks are given back.
        """
        check_room = self.scheduler.check_room if self.scheduler is not None else None
        requests = make_requests(prompts, max_new_tokens, self.model, check_room)
        arrival_s = arrival_times(arrivals, len(requests))
        if arrivals is not None and self.runner.reduce is not None:
            raise ValueError("arrivals: with tensor_parallel=True every rank must admit the same "
                             "requests at the same step, and arrivals are timed by each rank's "
                             "own clock; serve without tensor parallelism")
        check_real("temperature", temperature, 0)
        if not (is_real(top_p) and 0 < top_p <= 1):
            raise ValueError(f"top_p={top_p!r}: must be a number in (0, 1]")
        if eos_token_id is not None and not (is_int(eos_token_id) and
                                             0 <= eos_token_id < self.model.vocab_size):
            raise ValueError(f"eos_token_id={eos_token_id!r}: must be None or a token id in "
                             f"[0, {self.model.vocab_size})")
        check_bool("ignore_eos", ignore_eos)
        if seed is not None:
            check_int("seed", seed, *SAMPLING_SEEDS)
        if on_finish is not None and not callable(on_finish):
            raise ValueError(f"on_finish={on_finish!r}: must be None or a callable")
        if self.offload:
            offloaded.check_batch(requests, arrivals)
        generator = torch.Generator(self.device).manual_seed(
            self.seed if seed is None else int(seed))
        stop = None if ignore_eos or eos_token_id is None else int(eos_token_id)
        sample = sampler(float(temperature), float(top_p), generator)
        try:
            if self.offload:
                return offloaded.generate(self, requests, sample, stop, self.offload_rates,
                                          on_finish)
            return self._serve(requests, arrival_s, sample,
                               TokenLog(len(requests), stop, time.perf_counter(), on_finish))
        finally:
            self._release(requests)

    def _serve(self, requests: list[Request], arrival_s: list[float],
               sample: Callable[[torch.Tensor], torch.Tensor], log: TokenLog) -> Generation:
        """Run the requests on the paged cache to their ends: admitted and prefilled, decoded
        together, preempted when the cache is full (kvlab.engine.scheduler), a step queued
        ahead where the batch cannot change (async decode, the module's docstring)."""
        scheduler = self.scheduler
        scheduler.start(requests, arrival_s)
        prefill_ms, step_ms, step_batch = [0.0] * len(requests), [], []
        preemptions = 0

        def now() -> float:
            return time.perf_counter() - log.began

        def take(request: Request, token: int) -> None:
            if log.take(request, token):  # its end: it leaves `running` and frees its blocks
                scheduler.finish(request)

        step: Step | None = None  # the decode step in flight: launched, its tokens not taken
        tokens_ms = None  # when the last decode step's tokens reached the host, until a prefill
        while not scheduler.is_finished() or step is not None:
            if step is None:  # the batch may change: admissions, preemptions, then a step
                admitted = scheduler.admit(now)
                if admitted:
                    elapsed = self._prefill(admitted, sample, take)
                    tokens_ms = None
                    for request in admitted:
                        prefill_ms[request.index] += elapsed
                preemptions += scheduler.make_room()
                running = scheduler.running
                if not running:
                    if scheduler.waiting:
                        scheduler.wait_for_head(now)
                    continue
                step = self._launch(list(running), [r.tokens[-1] for r in running], sample,
                                    clock_ms(self.device) if tokens_ms is None else tokens_ms)
            ahead = None
            if self.async_decode and scheduler.may_run_ahead(step.rows, now()):
                ahead = self._launch(step.rows, step.tokens.ids, sample)
            tokens = step.tokens.wait()
            tokens_ms = time.perf_counter() * 1e3
            step_ms.append(tokens_ms - step.started_ms)
            if ahead is not None:  # its tokens' ids, now known
                ahead.started_ms = tokens_ms
                scheduler.record_tokens(ahead.rows, tokens)
            # a row of a request that ended by EOS at the step before is dropped (its blocks,
            # freed then, were reused by nothing queued before this step: the module docstring)
            live = [(r, t) for r, t in zip(step.rows, tokens, strict=True) if not r.finish_reason]
            step_batch.append(len(live))
            for request, token in live:
                take(request, token)
            step = ahead
        return Generation([r.tokens for r in requests], [r.finish_reason for r in requests],
                          prefill_ms, step_ms, step_batch, preemptions, self.attention,
                          arrival_s, log.first_token_s, log.finish_s)

    def _prefill(self, admitted: list[Request], sample: Callable[[torch.Tensor], torch.Tensor],
                 take: Callable[[Request, int], None]) -> float:
        """Prefill the admitted requests in one pass; a new request's first token ends its
        prefill (a preempted one has it already). Returns the pass's wall-clock ms."""
        start = clock_ms(self.device)
        last_logits = self.runner.prefill(admitted)
        for request, row in zip(admitted, last_logits, strict=True):
            if not request.tokens:
                take(request, sample(row[None]).item())
        return clock_ms(self.device) - start

    def _launch(self, rows: list[Request], token_ids: list[int] | torch.Tensor,
                sample: Callable[[torch.Tensor], torch.Tensor],
                started_ms: float = 0.0) -> Step:
        """Queue a decode step of the requests `rows` and the sampling of its tokens, without
        waiting for either. token_ids: the step's input tokens, one per row, a list, or a tensor
        on the device (the previous step's sampled ids, not yet on the host: placed without
        ids, for the caller to record)."""
        placed = self.scheduler.append_one(rows, token_ids if isinstance(token_ids, list)
                                           else None)
        logits = self.runner.decode([r.seq_id for r in rows], token_ids, placed)
        return Step(rows, SampledTokens(sample(logits)), started_ms)

    def _release(self, requests: list[Request]) -> None:
        """Give back the blocks that `requests` hold, however generate ended, and wait for the
        GPU."""
        if self.scheduler is not None:
            self.scheduler.release(requests)
        # NOTE: left by an exception, generate may leave decode steps queued on the GPU,
        # writing K, V into the blocks freed above and reading the graphs' pinned inputs,
        # which the next steps rewrite: nothing reuses either until they are done.
        self.runner.synchronize()
