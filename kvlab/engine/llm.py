"""`LLM`: generate tokens with a whole model on kvlab's paged KV cache and decode kernels.

    llm = kvlab.LLM("llama3-8b", attention="gqa")          # seeded random weights, on the GPU
    out = llm.generate([[1, 2, 3], [4, 5]], max_new_tokens=32)
    out.tokens, out.step_ms                                  # new tokens; ms per decode step
    v1 = llm.with_attention("vllm_v1")                     # the same weight tensors, own cache

Scheduling (continuous batching): requests wait in order; the head of the queue is admitted when
the free blocks hold its prompt and leave one for each running request. The requests admitted
between two decode steps are prefilled together (up to max_prefill_tokens tokens in one forward
pass; a longer prompt alone). Admitted requests decode together, one token each per step; a
finished one frees its blocks at once, and waiting ones join at the next step. When a step's new
blocks do not fit, the most recently admitted requests are preempted: they give their blocks back
and wait at the head of the queue with the tokens they have, to be recomputed (prefilled again)
later, so a full cache slows requests down instead of failing them. A request that the free blocks
cannot hold (the whole cache, or what an LLM sharing it leaves) is refused before anything runs.
However generate ends (an exception, an interrupt too), its requests give their blocks back.
Prompts that share whole blocks of tokens with a live request share those blocks (the manager's
prefix sharing), with their K, V written once.

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

Attention of a decode step: "reference" (kvlab.reference, fp32, any device), or on a GPU the CUDA
kernels "vllm_v1", "gqa" or "auto" (kvlab.DecodePlan; "auto" takes the fastest for the cache's
layout). attention="auto" means the kernels' auto on a GPU and the reference elsewhere. Prefill
runs causal SDPA on each prompt, and the layers' GEMMs on all the prompts of a prefill at once.

With offload=True there is no paged cache: the K, V live in host memory and each decode step runs
the KVPR runtime (kvlab.engine.offloaded: a batch of one prompt length, started and ended
together).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvlab.arith import ceil_div
from kvlab.cache import BlockManager
from kvlab.cache.paged_cache import PagedKVCache, cache_nbytes, check_fits
from kvlab.checks import (
    check_block_size,
    check_bool,
    check_int,
    check_positive_int,
    check_real,
    is_int,
    is_real,
)
from kvlab.config import MODELS, ModelConfig
from kvlab.engine import checkpoint, forward, offloaded, tp
from kvlab.engine.generation import Generation, SampledTokens, TokenLog, clock_ms
from kvlab.engine.graphs import bucket as graphs_bucket
from kvlab.engine.weights import SEED_RANGE, ModelWeights
from kvlab.kernels import layer_ops
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.model.rope import RopeTable
from kvlab.model.weights import resolve_device
from kvlab.offload.scheduler import LinkAndCompute

ATTENTIONS = ("auto", "reference", "vllm_v1", "gqa")
KERNEL_LAYOUTS = {"vllm_v1": "vllm", "gqa": "hnd", "auto": "hnd"}


def cache_layout(attention: str) -> str:
    """The cache layout that `attention` (one of ATTENTIONS) reads."""
    return "hnd" if attention == "reference" else KERNEL_LAYOUTS[attention]


DEFAULT_CACHED_TOKENS = 65536
DEFAULT_PREFILL_TOKENS = 8192
SAMPLING_SEEDS = (-2**63, 2**64 - 1)  # what torch.Generator.manual_seed takes


@dataclass
class _Request:
    index: int
    prompt: list[int]
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    seq_id: int | None = None  # its sequence in the manager while it holds blocks
    alloc: object = None  # the manager's placement of its context, until it is prefilled
    finish_reason: str | None = None


@dataclass
class _Step:
    """A decode step launched: its requests, in row order, and its sampled tokens. started_ms:
    when its time began (time.perf_counter() ms): its launch, or when the tokens of the step
    before it reached the host if it was queued before they did."""

    rows: list[_Request]
    tokens: SampledTokens
    started_ms: float


def _context(request: _Request) -> list[int]:
    """What a request's prefill runs: its prompt, and after a preemption also the tokens it had
    decoded but the last (which the next decode step feeds)."""
    return request.prompt + request.tokens[:-1]


def _context_len(request: _Request) -> int:
    return len(request.prompt) + max(len(request.tokens) - 1, 0)


class LLM:
    """A decoder-only model on a paged KV cache.

    Args:
        model: a kvlab.MODELS preset name or a ModelConfig (seeded random weights), or the path
            of a local Hugging Face checkpoint folder (config.json and safetensors; Llama,
            Qwen2 or OPT: kvlab.engine.checkpoint).
        attention: one of ATTENTIONS (see the module's docstring).
        prefetch: a PrefetchConfig for the CUDA kernels (None: none, or the fastest with "auto").
        dtype: of the weights and the cache; default fp16 on a GPU, fp32 on the CPU.
        device: default "cuda" when kvlab.backend() is "cuda", else "cpu".
        seed: of the random weights (and the default of generate's sampling seed), an
            integer in SEED_RANGE.
        block_size: tokens per cache block (8, 16 or 32 for vllm_v1; 8-256 otherwise).
        num_blocks: blocks in the cache, shared by all layers; default enough for 65,536 tokens.
            Their K, V tensors must fit in the device's free memory.
        cuda_graphs: replay decode steps as CUDA graphs (kvlab.engine.graphs) for batches of
            up to 256 sequences of up to graph_max_len tokens, eagerly beyond; default True
            with the CUDA kernels (they alone can be captured).
        graph_max_len: the longest sequence a graph serves (the longest span a graph's kernels
            are planned for; like vLLM's max_seq_len_to_capture), default the model's context
            limit or 8192, whichever is less; no more than the cache holds is used.
        max_prefill_tokens: the most prompt tokens one prefill pass takes (the requests admitted
            together, in order; a longer prompt is prefilled alone), default 8192.
        offload: keep the K, V in host memory and decode through the KVPR runtime
            (kvlab.engine.offloaded) instead of on a paged cache: attention "auto", no
            num_blocks, prefetch or tensor_parallel; cuda_graphs then means the runtime's graphs
            around the attention (default True on a GPU).
        offload_rates: with offload, the link and GPU rates (a LinkAndCompute) that choose each
            step's split; default None measures them on the GPU at each generate; a CPU run
            needs them given.
        weights: a ModelWeights of `model` in `dtype` on `device` to run as they are (the same
            tensors, not a copy; see `with_attention`) instead of seeded random ones; `model`
            is then a preset name or a ModelConfig. With tensor_parallel, this rank's shard.
        tensor_parallel: run this rank's shard of the model (kvlab.engine.tp) in a
            torch.distributed group that the caller has initialised, one process per device
            (`torchrun --nproc-per-node N ...`); every rank then calls generate alike and
            gets the same tokens. `local` is the shape this rank computes (`model` itself
            without tensor parallelism).
        async_decode: queue each decode step before the previous step's tokens reach the host
            (see the module's docstring); default True on a GPU. Not with offload.
    Flags are bools (numpy's too), counts integers (numpy's too, never bools). Raises
    ValueError, before allocating anything, for anything it cannot run.
    """

    def __init__(self, model: str | ModelConfig = "tiny-llama", *, attention: str = "auto",
                 prefetch: PrefetchConfig | None = None, dtype: torch.dtype | None = None,
                 device=None, seed: int = 0, block_size: int = 16,
                 num_blocks: int | None = None, cuda_graphs: bool | None = None,
                 graph_max_len: int | None = None, weights: ModelWeights | None = None,
                 tensor_parallel: bool = False,
                 max_prefill_tokens: int = DEFAULT_PREFILL_TOKENS, offload: bool = False,
                 offload_rates: LinkAndCompute | None = None, async_decode: bool | None = None,
                 _cache_of: LLM | None = None):
        cuda_graphs = _flag("cuda_graphs", cuda_graphs, optional=True)
        async_decode = _flag("async_decode", async_decode, optional=True)
        offload = _flag("offload", offload)
        tensor_parallel = _flag("tensor_parallel", tensor_parallel)
        self._graph_args = {"cuda_graphs": cuda_graphs, "graph_max_len": graph_max_len,
                            "tensor_parallel": tensor_parallel, "async_decode": async_decode}
        check_positive_int("max_prefill_tokens", max_prefill_tokens)
        self.max_prefill_tokens = int(max_prefill_tokens)
        checkpoint_path = model if checkpoint.is_checkpoint(model) else None
        self.model = (checkpoint.model_config(model) if checkpoint_path is not None
                      else _resolve_model(model))
        if device is None:
            from kvlab.device import backend

            device = "cuda" if backend() == "cuda" else "cpu"
        self.device = resolve_device(device)
        cuda = self.device.type == "cuda"
        if attention not in ATTENTIONS:
            raise ValueError(f"attention={attention!r}: must be one of {ATTENTIONS}")
        _check_offload(offload, offload_rates, attention, prefetch, num_blocks, tensor_parallel,
                       async_decode, cuda)
        self.async_decode = cuda and not offload if async_decode is None else async_decode
        self.offload, self.offload_rates, self.offload_graphs = offload, offload_rates, False
        if offload:  # the runtime's attention and graphs; the paged cache's do not apply
            self.offload_graphs = cuda and cuda_graphs is not False
            attention, cuda_graphs = offloaded.ATTENTION, False
        if attention == "auto" and not cuda:
            attention = "reference"
        if attention in ("vllm_v1", "gqa") and not cuda:
            raise ValueError(f"attention={attention!r}: the CUDA kernels need device='cuda' (here "
                             f"{self.device}); attention='reference' runs anywhere")
        if prefetch is not None and (attention == "reference" or
                                     not isinstance(prefetch, PrefetchConfig)):
            raise ValueError(f"prefetch={prefetch!r}: must be None, or a PrefetchConfig with a "
                             "CUDA kernel")
        self.attention, self.prefetch = attention, prefetch
        dtype = dtype or (torch.float16 if cuda else torch.float32)
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"dtype={dtype!r}: must be torch.float16, bfloat16 or float32")
        if attention not in ("reference", offloaded.ATTENTION) and dtype == torch.float32:
            raise ValueError("dtype=torch.float32: the CUDA kernels read fp16 or bf16 caches")
        rank, world = _tensor_parallel_rank(tensor_parallel)
        self.local = tp.shard_config(self.model, world) if world > 1 else self.model
        self._reduce = tp.all_reduce if world > 1 else None
        if weights is not None:
            if not isinstance(weights, ModelWeights) or checkpoint_path is not None:
                raise ValueError(f"weights={type(weights).__name__}: must be None, or a "
                                 "ModelWeights with a preset name or a ModelConfig as model")
            weights.check(self.local)
            if (weights.dtype, weights.device) != (dtype, self.device):
                raise ValueError(f"weights: {weights.dtype} on {weights.device}, must be "
                                 f"dtype={dtype} on device={self.device}")
        check_block_size(block_size)
        if attention == "vllm_v1" and block_size not in (8, 16, 32):
            raise ValueError(f"block_size={block_size}: vllm_v1 runs blocks of 8, 16 or 32")
        if num_blocks is None:
            num_blocks = ceil_div(DEFAULT_CACHED_TOKENS, block_size)
        check_positive_int("num_blocks", num_blocks)
        check_int("seed", seed, *SEED_RANGE)
        if cuda_graphs is None:
            cuda_graphs = attention != "reference"
        if cuda_graphs and attention == "reference":
            raise ValueError("cuda_graphs=True: must be a bool, and False with "
                             "attention='reference' (only the CUDA kernels can be captured)")
        if graph_max_len is None:
            graph_max_len = min(self.model.max_position, 8192)
        check_positive_int("graph_max_len", graph_max_len)
        self.seed, self.block_size, num_blocks = int(seed), int(block_size), int(num_blocks)
        m = self.local
        if not offload and _cache_of is None:
            check_fits(f"num_blocks={num_blocks}: the K/V tensors of {m.num_layers} layers",
                       m.num_layers * cache_nbytes(num_blocks, self.block_size, m.num_kv_heads,
                                                   m.head_dim, dtype, cache_layout(attention)),
                       self.device)
        if weights is None:
            weights = (ModelWeights.random(self.model, self.seed, dtype, self.device)
                       if checkpoint_path is None else
                       checkpoint.load_weights(checkpoint_path, self.model, dtype, self.device))
            if world > 1:
                weights = tp.shard_weights(self.model, weights, rank, world)
        self.weights = weights
        if offload:
            self.manager, self.caches, self._scratch_ids = None, [], []
        elif _cache_of is not None:  # with_attention(share_cache=True), which checked the layout
            self.manager, self.caches = _cache_of.manager, _cache_of.caches
            self._scratch_ids = _cache_of._scratch_ids
        else:
            self.manager = BlockManager(num_blocks, block_size)
            self.caches = [PagedKVCache(num_blocks, block_size, m.num_kv_heads, m.head_dim,
                                        dtype, self.device, cache_layout(attention),
                                        manager=self.manager)
                           for _ in range(m.num_layers)]
            self._scratch_ids: list[int] = []  # the graphs' scratch sequences in the manager
        # NOTE: no sequence outgrows the cache: the tables need not reach the context limit (with
        # offload, each generate makes the table of its prompts)
        longest = min(m.max_position, num_blocks * self.block_size)
        self.rope = (RopeTable.build(m, longest, dtype, self.device)
                     if m.position == "rope" and not offload else None)
        self.graphs = None
        if cuda_graphs:  # a block of its own for the graphs' padding rows
            from kvlab.engine.graphs import DecodeGraphs

            scratch = self.manager.add_sequence(1).seq_id
            self._scratch_ids.append(scratch)
            self.graphs = DecodeGraphs(
                m, self.weights, self.caches, self.rope, attention, prefetch,
                min(int(graph_max_len), longest),
                (self.manager.block_table(scratch)[0], self.manager.slot_mapping(scratch, 0, 1)[0]),
                self._reduce)

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
        return self.manager.num_blocks - len(self._scratch_ids) if self.manager else 0

    def with_attention(self, attention: str = "auto", *,
                       prefetch: PrefetchConfig | None = None, share_cache: bool = False) -> LLM:
        """A new LLM that runs this one's weights (the same tensors, not a copy: one model's
        memory for several attention variants) with `attention` and `prefetch`. It has graphs
        of its own, and this LLM's model, dtype, device, seed, block_size, num_blocks,
        cuda_graphs, graph_max_len and max_prefill_tokens. Its caches and their manager are its
        own, or with share_cache this LLM's (an attention of the same cache layout; the two must not
        generate at once: each generate starts from, and leaves, an empty cache). Raises
        ValueError as the constructor does."""
        share_cache = _flag("share_cache", share_cache)
        if self.offload:
            raise ValueError("with_attention: this LLM decodes through KVPR (offload=True), with "
                             "no attention to swap; make kvlab.LLM(..., weights=llm.weights) "
                             "for a paged one")
        if share_cache:
            # (an unknown attention is the constructor's to refuse)
            if attention in ATTENTIONS and cache_layout(attention) != self.caches[0].layout:
                raise ValueError(f"share_cache=True: attention={attention!r} does not read "
                                 f"this LLM's {self.caches[0].layout!r} cache layout")
        return LLM(self.model, attention=attention, prefetch=prefetch, dtype=self.dtype,
                   device=self.device, seed=self.seed, block_size=self.block_size,
                   num_blocks=self.manager.num_blocks, weights=self.weights,
                   max_prefill_tokens=self.max_prefill_tokens,
                   _cache_of=self if share_cache else None, **self._graph_args)

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
        requests = self._requests(prompts, max_new_tokens)
        arrival_s = _arrival_times(arrivals, len(requests))
        if arrivals is not None and self._reduce is not None:
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
        temperature, top_p = float(temperature), float(top_p)

        def sample(logits):
            return _sample(logits, temperature, top_p, generator)

        try:
            if self.offload:
                return offloaded.generate(self, requests, sample, stop, self.offload_rates,
                                          on_finish)
            return self._serve(requests, arrival_s, sample,
                               TokenLog(len(requests), stop, time.perf_counter(), on_finish))
        finally:
            self._release(requests)

    def _serve(self, requests: list[_Request], arrival_s: list[float],
               sample: Callable[[torch.Tensor], torch.Tensor], log: TokenLog) -> Generation:
        """Run the requests on the paged cache to their ends (the module's docstring): the
        requests admitted, prefilled, decoded together, preempted when the cache is full."""
        waiting = deque(sorted(requests, key=lambda r: arrival_s[r.index]))
        running: list[_Request] = []
        prefill_ms, step_ms, step_batch = [0.0] * len(requests), [], []
        preemptions = 0

        def now() -> float:
            return time.perf_counter() - log.began

        def take(request: _Request, token: int) -> None:
            if log.take(request, token):  # its end: it leaves `running` and frees its blocks
                self.manager.free(request.seq_id)
                request.seq_id = None
                running.remove(request)

        step: _Step | None = None  # the decode step in flight: launched, its tokens not taken
        while waiting or running or step is not None:
            if step is None:  # the batch may change: admissions, preemptions, then a step
                admitted = self._admit(waiting, running, arrival_s, now)
                if admitted:
                    start = clock_ms(self.device)
                    last_logits = self._prefill(admitted)
                    running += admitted
                    for request, row in zip(admitted, last_logits, strict=True):
                        if not request.tokens:  # a new request: its first token ends its prefill
                            take(request, sample(row[None]).item())
                    elapsed = clock_ms(self.device) - start
                    for request in admitted:
                        prefill_ms[request.index] += elapsed
                preemptions += self._make_room(running, waiting)
                if not running:
                    if waiting:
                        self._await(waiting[0], arrival_s, now)
                    continue
                step = self._launch(list(running), [r.tokens[-1] for r in running], sample,
                                    clock_ms(self.device))
            ahead = None
            if self.async_decode and self._may_run_ahead(step.rows, waiting, arrival_s, now()):
                ahead = self._launch(step.rows, step.tokens.ids, sample)
            tokens = step.tokens.wait()
            done_ms = time.perf_counter() * 1e3
            step_ms.append(done_ms - step.started_ms)
            if ahead is not None:  # its tokens' ids, now known
                ahead.started_ms = done_ms
                self.manager.record_tokens([r.seq_id for r in ahead.rows], tokens)
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

    def _await(self, head: _Request, arrival_s: list[float], now: Callable[[], float]) -> None:
        """With nothing running, wait for the head of the queue to arrive (at most a second at
        a time, so that any finite arrival can be waited for). RuntimeError if it has arrived
        and the free blocks cannot hold it: nothing running would free any."""
        wait_s = arrival_s[head.index] - now()
        if wait_s > 0:
            time.sleep(min(wait_s, 1.0))
        elif not self._admissible(head, []):
            free, needed = self.manager.num_free_blocks, self._blocks(_context_len(head))
            raise RuntimeError(
                f"request {head.index} ({_context_len(head)} tokens, {needed} blocks) can never "
                f"be admitted: nothing runs to free blocks, and {free} of the cache's "
                f"{self.usable_blocks} blocks for requests {'is' if free == 1 else 'are'} free "
                "(the others hold sequences outside this generate)")

    def _release(self, requests: list[_Request]) -> None:
        """Give back the blocks that `requests` hold, however generate ended: those of running
        requests and of requests placed but not prefilled yet (preempted and finished ones hold
        none)."""
        for request in requests:
            if request.seq_id is not None:
                self.manager.free(request.seq_id)
                request.seq_id = None
        if self.device.type == "cuda":
            # NOTE: left by an exception, generate may leave decode steps queued on the GPU,
            # writing K, V into the blocks freed above and reading the graphs' pinned inputs,
            # which the next steps rewrite: nothing reuses either until they are done.
            torch.cuda.synchronize(self.device)

    # ---- the steps ------------------------------------------------------------------------

    def _admit(self, waiting: deque, running: list[_Request], arrival_s: list[float],
               now: Callable[[], float]) -> list[_Request]:
        """Take from the head of `waiting` the requests that have arrived by now() and are
        admissible, as many as one prefill pass holds (max_prefill_tokens; a longer one alone),
        and place them. Returns them, in order."""
        admitted, prompt_tokens = [], 0
        while (waiting and arrival_s[waiting[0].index] <= now()
               and self._admissible(waiting[0], running + admitted)
               and (not admitted or prompt_tokens + _context_len(waiting[0])
                    <= self.max_prefill_tokens)):
            request = waiting.popleft()
            self._place(request)  # before the next check counts the free blocks
            admitted.append(request)
            prompt_tokens += _context_len(request)
        return admitted

    def _place(self, request: _Request) -> None:
        """Give the request's context blocks (the manager's add_sequence)."""
        context = _context(request)
        request.alloc = self.manager.add_sequence(len(context), context)
        request.seq_id = request.alloc.seq_id

    def _prefill(self, requests: list[_Request]) -> torch.Tensor:
        """Run the placed requests' contexts in one pass; the logits [len(requests),
        vocab_size] of each one's last context token."""
        prompts = [torch.tensor(_context(r), dtype=torch.long, device=self.device)
                   for r in requests]
        allocs = [r.alloc for r in requests]
        for r in requests:
            r.alloc = None
        return forward.prefill(self.local, self.weights, self.caches, allocs, prompts, self.rope,
                               self._reduce)

    def _launch(self, rows: list[_Request], token_ids: list[int] | torch.Tensor,
                sample: Callable[[torch.Tensor], torch.Tensor],
                started_ms: float = 0.0) -> _Step:
        """Queue a decode step of the requests `rows` and the sampling of its tokens, without
        waiting for either. token_ids: the step's input tokens, one per row, a list, or a tensor
        on the device (the previous step's sampled ids, not yet on the host: placed without
        ids, for the caller to record)."""
        seq_ids = [r.seq_id for r in rows]
        known = isinstance(token_ids, list)
        placed = self.manager.append_one(seq_ids, token_ids if known else None)
        if (self.graphs is not None and graphs_bucket(len(rows)) is not None
                and max(placed.positions) < self.graphs.max_seq_len):
            logits = self.graphs.step(seq_ids, token_ids, placed, self.manager.block_table)
        else:
            ids = (torch.tensor(token_ids, dtype=torch.long, device=self.device) if known
                   else token_ids)
            slots, positions = (torch.tensor(xs, dtype=torch.long, device=self.device)
                                for xs in (placed.slots, placed.positions))
            logits = forward.decode_step(self.local, self.weights, self.caches, placed.copies,
                                         slots, ids, positions, self._attend(seq_ids),
                                         self.rope, self._reduce)
        return _Step(rows, SampledTokens(sample(logits)), started_ms)

    def _may_run_ahead(self, rows: list[_Request], waiting: deque, arrival_s: list[float],
                       now_s: float) -> bool:
        """Whether the next decode step may be queued before this one's tokens (`rows`) are
        known: whether its batch is surely the same (async_decode in the module's docstring)."""
        if any(r.finish_reason or len(r.tokens) + 1 >= r.max_new_tokens for r in rows):
            return False  # a row ended at the step before (its row here is dropped), or ends now
        if (waiting and arrival_s[waiting[0].index] <= now_s
                and self._admissible(waiting[0], rows)):
            return False
        return self._starting_blocks(rows) <= self.manager.num_free_blocks  # else preempt first

    def _attend(self, seq_ids: list[int]) -> forward.Attend:
        if self.attention == "reference":
            from kvlab.reference import decode_attention

            return lambda i, q: decode_attention(q, self.caches[i], seq_ids)
        from kvlab.kernels.decode import DecodePlan

        plan = DecodePlan(self.caches[0], seq_ids, self.local.num_qo_heads,
                          kernel=self.attention, prefetch=self.prefetch)
        return lambda i, q: plan.run(q, self.caches[i].k_cache, self.caches[i].v_cache)

    # ---- admission and preemption -----------------------------------------------------------

    def _blocks(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    def _admissible(self, request: _Request, running: list[_Request]) -> bool:
        """Whether the free blocks hold the request's context and still leave one for each
        running request (the most the next step takes from each)."""
        return self._blocks(_context_len(request)) + len(running) <= self.manager.num_free_blocks

    def _starting_blocks(self, running: list[_Request]) -> int:
        """The new blocks the next decode step of `running` takes: one for each full last
        block."""
        return sum(self.manager.seq_len(r.seq_id) % self.block_size == 0 for r in running)

    def _make_room(self, running: list[_Request], waiting: deque) -> int:
        """Preempt the most recently admitted requests until the next decode step's new blocks
        fit: each gives its blocks back and waits at the head of the queue with the tokens it
        has, to be prefilled again (recomputed) when blocks free up. A request alone always
        fits (generate checked it). Returns how many were preempted."""
        preempted = 0
        while len(running) > 1:
            if self._starting_blocks(running) <= self.manager.num_free_blocks:
                break
            victim = running.pop()
            self.manager.free(victim.seq_id)
            victim.seq_id = None
            waiting.appendleft(victim)
            preempted += 1
        return preempted

    def _requests(self, prompts, max_new_tokens) -> list[_Request]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                        and isinstance(prompts[0], str)):
            raise ValueError("prompts: kvlab has no tokenizer; pass token ids (a list of ints, "
                             "or a list of such lists)")
        if isinstance(prompts, list) and prompts and all(is_int(t) for t in prompts):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts: must be a non-empty list of token-id lists")
        limits = ([max_new_tokens] * len(prompts) if not isinstance(max_new_tokens, (list, tuple))
                  else list(max_new_tokens))
        if len(limits) != len(prompts):
            raise ValueError(f"max_new_tokens: {len(limits)} limits for {len(prompts)} prompts")
        m, requests = self.model, []
        for i, (prompt, max_new_tokens) in enumerate(zip(prompts, limits, strict=True)):
            check_positive_int("max_new_tokens" if len(set(map(repr, limits))) == 1
                               else f"max_new_tokens[{i}]", max_new_tokens)
            if isinstance(prompt, torch.Tensor):
                prompt = prompt.tolist()
            if not isinstance(prompt, (list, tuple)) or not prompt:
                raise ValueError(f"prompts[{i}]: must be a non-empty list of token ids")
            bad = next((t for t in prompt if not (is_int(t) and 0 <= t < m.vocab_size)), None)
            if bad is not None:
                raise ValueError(f"prompts[{i}]: token {bad!r} is not an id in [0, "
                                 f"{m.vocab_size}) ({m.name}'s vocabulary)")
            total = len(prompt) + max_new_tokens
            if total > m.max_position:
                raise ValueError(f"prompts[{i}]: {len(prompt)} tokens + max_new_tokens="
                                 f"{max_new_tokens} exceed {m.name}'s context limit of "
                                 f"{m.max_position} tokens")
            if self.manager is not None:
                self._check_room(i, total)
            requests.append(_Request(i, [int(t) for t in prompt], int(max_new_tokens)))
        return requests

    def _check_room(self, i: int, total: int) -> None:
        """ValueError unless the free blocks hold prompts[i] with its new tokens, `total` tokens:
        those of the whole cache, less any that sequences outside this generate hold (an LLM
        sharing the cache), which nothing in it can free."""
        needed, usable, free = self._blocks(total), self.usable_blocks, self.manager.num_free_blocks
        if needed > usable:
            raise ValueError(f"prompts[{i}]: {total} tokens need {needed} blocks; the cache has "
                             f"{usable} for requests (num_blocks={self.manager.num_blocks})")
        if needed > free:
            raise ValueError(f"prompts[{i}]: {total} tokens need {needed} blocks; {free} of the "
                             f"cache's {usable} blocks for requests are free, the others hold "
                             "sequences outside this generate (an LLM sharing this cache)")


def _flag(name: str, value, *, optional: bool = False) -> bool | None:
    """`value` as a bool (a numpy bool too), or None where `optional`; ValueError for anything
    else."""
    if optional and value is None:
        return None
    try:
        check_bool(name, value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: must be {'None or ' if optional else ''}a "
                         "bool") from None
    return bool(value)


def _arrival_times(arrivals, num_requests: int) -> list[float]:
    """generate's arrivals as floats (all 0.0 for None); ValueError unless they are
    num_requests finite numbers >= 0."""
    if arrivals is None:
        return [0.0] * num_requests
    try:
        times = list(arrivals)
    except TypeError:
        times = None
    if times is None or len(times) != num_requests or not all(is_real(t) and t >= 0
                                                              for t in times):
        raise ValueError(f"arrivals: must be {num_requests} finite numbers >= 0 (seconds after "
                         "the call), one per prompt")
    return [float(t) for t in times]


def _check_offload(offload, rates, attention, prefetch, num_blocks, tensor_parallel,
                   async_decode, cuda: bool) -> None:
    """ValueError unless the offload arguments fit the others."""
    if not offload:
        if rates is not None:
            raise ValueError(f"offload_rates={rates!r}: only with offload=True")
        return
    if rates is not None and not isinstance(rates, LinkAndCompute):
        raise ValueError(f"offload_rates={rates!r}: must be None or a "
                         "kvlab.offload.scheduler.LinkAndCompute")
    if rates is None and not cuda:
        raise ValueError("offload_rates=None: a CPU run needs the link and GPU rates given (a "
                         "LinkAndCompute); on a GPU they are measured")
    for name, value, default in (("attention", attention, "auto"), ("prefetch", prefetch, None),
                                 ("num_blocks", num_blocks, None),
                                 ("tensor_parallel", tensor_parallel, False),
                                 ("async_decode", async_decode, None)):
        if value != default:
            raise ValueError(f"{name}={value!r}: offload=True decodes through the KVPR runtime "
                             f"(its own attention, no paged cache); leave {name}={default!r}")


def _tensor_parallel_rank(tensor_parallel) -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) without tensor parallelism."""
    if not tensor_parallel:
        return 0, 1
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        raise ValueError("tensor_parallel=True: needs an initialised torch.distributed process "
                         "group, one process per device (torchrun --nproc-per-node N ...)")
    return distributed.get_rank(), distributed.get_world_size()


def _resolve_model(model) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model={model!r}: must be a ModelConfig, a checkpoint folder with a "
                         f"config.json, or one of {', '.join(MODELS)}")
    return MODELS[model]


FP32 = torch.finfo(torch.float32)


def _sample(logits: torch.Tensor, temperature: float, top_p: float,
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
