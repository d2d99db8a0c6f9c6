"""`python -m kvlab bench e2e`: decode throughput of whole models on `kvlab.LLM`, beside HF
transformers' `generate` with its static cache on the same weights.

For each model, batch and attention variant: `batch` prompts of `--prompt` seeded random tokens
decode `--new-tokens` tokens each (ignore EOS; CUDA graphs as `kvlab.LLM` uses them). The
variants share one copy of the weights, and those of one cache layout one cache sized for the
batch (`LLM.with_attention`); they run in turn, `--rounds` times each (variant 1, 2, ..., then
again), so that drifts of clock and temperature fall on all alike. Every decode step's wall time
is recorded, from the previous step's tokens reaching the host to its own: with async decode
(the default; `LLM`'s async_decode) each step is queued before the one before it ends, with
`--no-async-decode` (and in the "+sync" variant, beside the others) launched once the tokens
before it are in, as HF's generate runs. The reported step time is
the median of every round's steps from the first at steady state (two successive steps within
5%, `kvlab.bench.steps.is_warm`, the later also within 5% of the median from it on) on. A row
keeps the last round's steps (`step_ms_runs`), each round's median (`round_step_ms`) and each
round's whole generate call, timed from outside (`round_wall_ms`: its steps must fit in it).
The roofline step time is what one step must read, the
weights (the LM head whole, the embedding's rows aside) and the batch's K, V at the run's mean
context, over the copy roofline measured in the same run. HF's peer runs
`generate(cache_implementation="static")` on the same tensors after them (`--rounds` times; its
static cache and the variants' caches of a 7B MHA model at batch 128 would not fit together),
its steps timed the same way (each stamped once its token is on the host, the GPU synchronised):
the "+sync" variant is kvlab on HF's basis, a step launched only after the last one's tokens.
HF compiles that decode step with torch.compile by default: `--hf-compile on` (the default) runs
it so (variant "hf-static"), `off` with compilation disabled ("hf-static-eager"), `both` the two
in turn; each row records `compiled` (for HF, whether generate took its compiled path every
run; kvlab's rows false: CUDA graphs, no torch.compile) and the result `hf_compile`. Every
variant, kvlab's and HF's, first runs WARMUP_ROUNDS untimed generate runs (graph capture and
compilation, some 24 s for a compiled first step, fall there), and its timed steps count from
steady state on.
With `--tp N`, under `torchrun --nproc-per-node N`: tensor parallelism over N GPUs
(kvlab.engine.tp), one process each; rank 0 reports its steps and its own roofline (its shard of
the weights and of the K, V at its copy roofline); no HF peer.
With `--serve-rates`, a serving run per rate: `--serve-requests` requests of lognormal prompt
and output lengths (`kvlab.workload.lognormal`: medians 256 and 128 tokens, sigma 1, clipped to
2,048 in all) arriving as a Poisson process (seeded), on one attention variant; it reports
output tokens/s over the run, time to first token and time per output token (p50, p99) and
preemptions, in `serving`.
A batch whose caches do not fit the GPU's free memory is left out, with the reason, in
`skipped` (a grid of batches and long prompts runs whole). A "+ahead" variant runs with the
cross-kernel prefetch (`kvlab.LLM(ahead_bytes=...)`: --ahead-bytes, else the step model's size
for the batch); a "+ahead_kv" variant the prefetch of each layer's K/V blocks by its QKV linear
(`kvlab.LLM(ahead_kv_bytes=...)`, `ahead_kv_bytes`), which runs only in layer_ops' linears: at
batches above layer_ops.LINEAR_ROWS it is left out, in `skipped`. A row of a variant that adds a
lever to another that ran records `same_tokens`, whether its greedy tokens were that variant's in
every round.
A row's prefill_ms is, for kvlab, the median over the prompts of the prefill pass that ran each
(the prompts admitted together share a pass of up to `LLM.max_prefill_tokens` tokens, and each
gets the whole pass's time); for HF, the whole batch's prefill with its first token and the
static cache's set-up.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

from kvlab.arith import ceil_div
from kvlab.bench.env import gpu_info, gpu_state, run_info, write_checkpoint
from kvlab.config import MODELS, ModelConfig
from kvlab.kernels.prefetch import PrefetchConfig

# NOTE: torch loads inside the functions: the CLI builds its options from VARIANTS without it.

PAPER_PREFETCH = PrefetchConfig("bulk")  # the paper's Algorithm 1: the next tile, d=1
# {variant: (attention kernel, its PrefetchConfig, the kvlab.LLM argument it sets beside the
# run's, or None)}: the cross-kernel prefetch's size, or async_decode off (+sync: each step
# waited for before the next is launched, as HF's generate runs)
VARIANTS = {"vllm_v1": ("vllm_v1", None, None),
            "vllm_v1+prefetch": ("vllm_v1", PAPER_PREFETCH, None),
            "gqa": ("gqa", None, None), "gqa+prefetch": ("gqa", PAPER_PREFETCH, None),
            "gqa+ahead": ("gqa", None, "ahead_bytes"),
            "gqa+ahead_kv": ("gqa", None, "ahead_kv_bytes"),
            "gqa+sync": ("gqa", None, "async_decode")}
# a variant's suffix: the lever it adds to its base variant
LEVERS = ("+prefetch", "+ahead", "+ahead_kv", "+sync")
AHEAD_VARIANTS = tuple(v for v, (_, _, lever) in VARIANTS.items() if lever == "ahead_bytes")
KV_VARIANTS = tuple(v for v, (_, _, lever) in VARIANTS.items() if lever == "ahead_kv_bytes")
KV_L2_SHARE = 0.5  # of the GPU's L2, the most K/V a layer's QKV linear prefetches
HF_VARIANT = "hf-static"  # HF's generate as it runs by default: its decode step torch.compiled
HF_EAGER_VARIANT = "hf-static-eager"  # the same with compilation off (`disable_compile`)
HF_COMPILE = {"on": (True,), "off": (False,), "both": (True, False)}  # --hf-compile
WARMUP_ROUNDS = 1  # untimed generate runs of every variant, in turn, before the timed rounds
SERVING_MAX_LEN = 2048  # a serving request's prompt and output together
SERVING_SEED = 0  # the serving workload's lengths, tokens and arrivals


def prefetch_pairs(variants, lever: str = "+prefetch") -> list[tuple[str, str]]:
    """(variant with `lever`, the same kernel without it) for each such pair among `variants`:
    with "+prefetch" the paper's prefetch (what the paper's end-to-end claim compares), with
    "+ahead" the cross-kernel prefetch."""
    variants = list(variants)
    return [(v, v.removesuffix(lever)) for v in variants
            if v.endswith(lever) and v.removesuffix(lever) in variants]


def base_variant(variant: str) -> str | None:
    """The variant that `variant` adds a lever (LEVERS) to; None for one that adds none."""
    return next((variant.removesuffix(lever) for lever in LEVERS if variant.endswith(lever)),
                None)


def steady_steps(step_ms: list[float]) -> list[float]:
    """The steps from the first at steady state on: the later of two successive steps within 5%
    (`kvlab.bench.steps.is_warm`) that is also within 5% of the median of the steps from it on,
    so that two slow steps alike (a compile, then a recompile) do not start it; all of them if
    none is."""
    from kvlab.bench.steps import WARMUP_TOLERANCE, is_warm

    for i in range(1, len(step_ms)):
        rest = statistics.median(step_ms[i:])
        if is_warm(step_ms[:i + 1]) and abs(step_ms[i] - rest) <= WARMUP_TOLERANCE * rest:
            return step_ms[i:]
    return step_ms


def step_bytes(model: ModelConfig, weights, batch: int, context: float) -> float:
    """Bytes one decode step must read: every weight but the embedding (of which it reads only
    `batch` rows), the LM head whole even where tied, and the K, V of `batch` sequences of
    `context` tokens."""
    from kvlab.model.weights import named_tensors

    def size(t):
        return 0 if t is None else t.numel() * t.element_size()

    layers = sum(size(t) for w in weights.layers for t in named_tensors(w).values())
    item = weights.embed.element_size()
    kv = 2 * model.num_layers * model.kv_size * item * batch * context
    rows = batch * model.hidden_size * item * (2 if weights.positions is not None else 1)
    return layers + size(weights.lm_head) + size(weights.norm_weight) + rows + kv


def serving_stats(gen) -> dict:
    """Output tokens/s over a serving run (first arrival to last token), time to first token and
    time per output token (after the first; requests of 2+ tokens) at p50 and p99, in ms."""
    import numpy as np

    tokens = sum(len(t) for t in gen.tokens)
    span = max(gen.finish_s) - min(gen.arrival_s)
    ttft = [1e3 * (f - a) for f, a in zip(gen.first_token_s, gen.arrival_s, strict=True)]
    tpot = [1e3 * (end - first) / (len(t) - 1) for t, first, end in
            zip(gen.tokens, gen.first_token_s, gen.finish_s, strict=True) if len(t) > 1]
    pct = {f"{name}_ms_p{q}": float(np.percentile(v, q)) if v else None
           for name, v in (("ttft", ttft), ("tpot", tpot)) for q in (50, 99)}
    return {"requests": len(gen.tokens), "output_tokens": tokens, "duration_s": span,
            "output_tokens_per_s": tokens / span if span > 0 else 0.0, **pct,
            "preemptions": gen.preemptions}


def poisson_arrivals(rng, num_requests: int, rate: float) -> list[float]:
    """Arrival times (s) of `num_requests` requests at `rate` requests/s: exponential gaps drawn
    from the numpy Generator `rng`."""
    import numpy as np

    return np.cumsum(rng.exponential(1.0 / rate, num_requests)).tolist()


def serving_workload(num_requests: int, rate: float, model: ModelConfig,
                     seed: int = SERVING_SEED):
    """(prompts, max_new_tokens, arrivals) of a serving run: lognormal lengths (clipped to
    SERVING_MAX_LEN tokens, or the model's context limit), Poisson arrivals at `rate`
    requests/s (exponential gaps), seeded."""
    import numpy as np

    from kvlab.workload import lognormal

    max_len = min(SERVING_MAX_LEN, model.max_position) - 1  # room for an output of 0 made 1
    work = lognormal(num_requests, 256, 128, sigma=1.0, max_seq_len=max_len, seed=seed)
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(rng, num_requests, rate)
    prompts = [rng.integers(0, model.vocab_size, int(n)).tolist() for n in work.prompt_lens]
    return prompts, [max(int(n), 1) for n in work.output_lens], arrivals


def check(args) -> None:
    """Raise ValueError unless this machine can run the benchmark."""
    import os

    import numpy as np

    from kvlab.device import backend
    from kvlab.engine.scheduler import MAX_ARRIVAL_S

    for name in args.models:
        if args.prompt + args.new_tokens > MODELS[name].max_position:
            raise ValueError(f"--prompt {args.prompt} + --new-tokens {args.new_tokens}: beyond "
                             f"{name}'s context limit of {MODELS[name].max_position}")
    if args.ahead_bytes is not None and not set(args.variants) & set(AHEAD_VARIANTS):
        raise ValueError(f"--ahead-bytes {args.ahead_bytes}: sizes the +ahead variants "
                         f"({', '.join(AHEAD_VARIANTS)}), and --variants has none")
    if args.serve_rates and VARIANTS[args.serve_variant][2] is not None:
        plain = [v for v, (_, _, lever) in VARIANTS.items() if lever is None]
        raise ValueError(f"--serve-variant {args.serve_variant}: the serving run takes the "
                         f"run's settings, not a lever's; one of {', '.join(plain)}")
    for rate in args.serve_rates:
        last = poisson_arrivals(np.random.default_rng(SERVING_SEED), args.serve_requests,
                                rate)[-1]  # serving_workload's arrivals
        if last > MAX_ARRIVAL_S:
            raise ValueError(f"--serve-rates {rate:g}: {args.serve_requests} requests would "
                             f"arrive over {last:,.0f} s; the engine admits arrivals up to "
                             f"{MAX_ARRIVAL_S:,.0f} s (a day), so give a higher rate or "
                             "fewer --serve-requests")
    if args.tp > 1:
        from kvlab.engine.tp import shard_config

        if args.serve_rates:
            raise ValueError(f"--serve-rates with --tp {args.tp}: a serving run admits requests "
                             "as they arrive, by each rank's own clock (kvlab.LLM.generate "
                             "refuses arrivals with tensor parallelism); serve with --tp 1")

        if os.environ.get("WORLD_SIZE") != str(args.tp):
            raise ValueError(f"--tp {args.tp}: one process per GPU, launched as torchrun "
                             f"--nproc-per-node {args.tp} -m kvlab bench e2e --tp {args.tp} "
                             f"(WORLD_SIZE is {os.environ.get('WORLD_SIZE', 'unset')})")
        for name in args.models:
            shard_config(MODELS[name], args.tp)
    if backend() != "cuda":
        raise ValueError("python -m kvlab bench e2e needs a CUDA GPU usable through torch and "
                         "CuPy (kvlab.backend() is 'sim' here)")
    if args.hf and args.tp == 1:
        try:
            import transformers  # noqa: F401
        except ImportError as err:
            raise ValueError("--hf needs transformers (pip install 'kvlab[dev]')") from err


def random_prompts(model: ModelConfig, batch: int, length: int) -> list[list[int]]:
    """`batch` prompts of `length` token ids drawn from the model's vocabulary, seeded by the
    batch (the same prompts for every variant of a point)."""
    import torch

    gen = torch.Generator().manual_seed(batch)
    return torch.randint(0, model.vocab_size, (batch, length), generator=gen).tolist()


def ahead_bytes(args, roofline_gbps: float, batch: int) -> int:
    """The "+ahead" variants' kvlab.LLM ahead_bytes: --ahead-bytes, else the step model's size
    for this batch at the run's copy roofline (kvlab.predict.step.ahead_size)."""
    if args.ahead_bytes is not None:
        return args.ahead_bytes
    from kvlab.predict.step import ahead_size, fit_step_model

    return ahead_size(fit_step_model(), roofline_gbps, batch)


def ahead_kv_bytes(model: ModelConfig, batch: int, tokens: int, l2_bytes: int) -> int:
    """The "+ahead_kv" variants' kvlab.LLM ahead_kv_bytes: a layer's K and V at `batch`
    sequences of `tokens` (fp16), at most KV_L2_SHARE of the L2 (the QKV linear's own weight
    streams through it while the blocks arrive, and the attention reads them after it)."""
    kv_bytes = 2 * batch * tokens * model.num_kv_heads * model.head_dim * 2
    return min(kv_bytes, int(KV_L2_SHARE * l2_bytes))


def _row(name, variant, batch, args, rounds, prefill_ms, roofline_ms) -> dict:
    """A result row from `rounds`, each round's every step (ms)."""
    steady = [steady_steps(steps) for steps in rounds]
    ms = statistics.median(t for steps in steady for t in steps)
    return {"model": name, "variant": variant, "batch": batch, "prompt": args.prompt,
            "new_tokens": args.new_tokens, "step_ms": ms, "tokens_per_s": batch / ms * 1e3,
            "round_step_ms": [statistics.median(steps) for steps in steady],
            "steady_from": len(rounds[-1]) - len(steady[-1]),
            "step_ms_runs": [round(t, 4) for t in rounds[-1]],
            "prefill_ms": prefill_ms, "roofline_ms": roofline_ms,
            "ratio_to_roofline": ms / roofline_ms}


def _in_turn(label: str, prompts, rounds: int, runners: dict,
             warmup_rounds: int = WARMUP_ROUNDS, clock=time.perf_counter, sync=None) -> dict:
    """{variant: (each round's steps, every prefill, each round's wall ms, each round's tokens
    where the runner gives them)}: each runner of prompts, in turn, first `warmup_rounds` times
    untimed (CUDA graphs captured, torch.compile run, caches allocated: none of it in a timed
    step), then `rounds` times over. A round's wall time is the runner's whole call, from
    `sync()` (default torch.cuda.synchronize) and `clock()` (s) before it to the same after:
    what its steps and prefill must fit in."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    runs = {variant: ([], [], [], []) for variant in runners}
    for turn in range(warmup_rounds + rounds):
        timed = turn >= warmup_rounds
        for variant, runner in runners.items():
            what = f"round {turn - warmup_rounds + 1}/{rounds}" if timed else "warm-up"
            print(f"{label} {what}: {variant}", file=sys.stderr)
            sync()
            start = clock()
            steps, prefills, *tokens = runner(prompts)
            sync()
            if timed:
                runs[variant][0].append(steps)
                runs[variant][1].extend(prefills)
                runs[variant][2].append(1e3 * (clock() - start))
                runs[variant][3].extend(tokens)
    return runs


def free_memory() -> None:
    """Collect what nothing references any more, then empty the CUDA allocator's cache: an
    LLM sits in reference cycles, so its caches and weights outlive their last name until
    collected, and CUDA's free memory (what a cache's fit is judged on) counts the allocator's
    cached blocks as used."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def does_not_fit(error: ValueError) -> bool:
    """Whether `error` says that a batch's caches do not fit: `check_fits`' DoesNotFit, refused
    before allocating, or a cache's refusal of an allocation that ran out of memory all the same
    (its cause a torch.OutOfMemoryError: the free memory it was judged on was in fragments)."""
    import torch

    from kvlab.cache.paged_cache import DoesNotFit

    return isinstance(error, DoesNotFit) or isinstance(error.__cause__, torch.OutOfMemoryError)


def measure_batch(label: str, prompts, rounds: int, make_runners: Callable[[], dict],
                  make_hf_runners: Callable[[], dict] | None = None, **timing) -> tuple:
    """(runs, same_tokens(runs), {variant: compiled}) of one batch: `make_runners()`'s kvlab
    variants timed in turn (`_in_turn`, given `timing`'s clock and sync), then, where given,
    `make_hf_runners()`'s. Memory is freed (`free_memory`) before each set is built and before
    returning, so that a set's fit is judged on the memory truly free: neither an earlier
    batch's caches (or a part-built set that did not fit) nor this batch's kvlab caches meet
    the next set in memory. A maker's refusal (see `does_not_fit`) propagates."""
    free_memory()
    runners = make_runners()
    runs = _in_turn(label, prompts, rounds, runners, **timing)
    del runners
    free_memory()
    equal = same_tokens(runs)
    compiled = {variant: False for variant in runs}  # kvlab: CUDA graphs, no compile
    if make_hf_runners is not None:
        hf_runners = make_hf_runners()
        runs |= _in_turn(label, prompts, rounds, hf_runners, **timing)
        compiled |= {variant: runner.compiled for variant, runner in hf_runners.items()}
        del hf_runners
        free_memory()
    return runs, equal, compiled


def graph_max_len(prompt: int, new_tokens: int) -> int | None:
    """kvlab.LLM's graph_max_len for prompts of `prompt` tokens and `new_tokens` more: None (the
    engine's default) where that serves every step from a CUDA graph, else the longest
    sequence, so that no step of a long run falls back to an eager one."""
    from kvlab.engine.config import DEFAULT_GRAPH_MAX_LEN

    longest = prompt + new_tokens
    return None if longest <= DEFAULT_GRAPH_MAX_LEN else longest


def _kvlab_runners(name: str, weights, num_blocks: int, args, variants: list[str],
                   levers: dict) -> dict:
    """A runner per variant of `variants`: LLMs on `weights`, with caches of `num_blocks`,
    one per layout (variants that differ in levers alone share it), and CUDA graphs for every
    step (`graph_max_len`); each lever's kvlab.LLM argument set to its value in `levers`
    ({argument: value}), the others the run's."""
    import kvlab
    from kvlab.engine.runner import cache_layout

    first_of_layout, runners = {}, {}
    for variant in variants:
        kernel, prefetch, lever = VARIANTS[variant]
        settings = {"prefetch": prefetch, "async_decode": args.async_decode,
                    **({lever: levers[lever]} if lever else {})}
        first = first_of_layout.get(cache_layout(kernel))
        llm = (first.with_attention(kernel, **settings, share_cache=True) if first
               else kvlab.LLM(name, attention=kernel, **settings, num_blocks=num_blocks,
                              weights=weights, tensor_parallel=args.tp > 1,
                              graph_max_len=graph_max_len(args.prompt, args.new_tokens)))
        first_of_layout.setdefault(cache_layout(kernel), llm)
        runners[variant] = _kvlab_runner(llm, args.new_tokens)
    return runners


def _kvlab_runner(llm, new_tokens: int):
    """prompts -> (each decode step's ms, each prompt's prefill pass's ms, the tokens) of
    llm.generate."""
    def run(prompts):
        out = llm.generate(prompts, new_tokens, ignore_eos=True)
        return out.step_ms, out.prefill_ms, out.tokens

    return run


def same_tokens(runs: dict) -> dict[str, bool]:
    """{variant: whether every timed round gave its base variant's tokens} for each variant of
    `runs` (`_in_turn`'s) that adds a lever to one also run (`base_variant`)."""
    return {variant: runs[variant][3] == runs[base][3] for variant in runs
            if (base := base_variant(variant)) in runs and runs[variant][3]}


class HFRunner:
    """prompts -> (each decode step's ms, [the batch's prefill ms]) of HF's generate with the
    static cache, its decode step torch.compiled or not (`compile`); `compiled` records, over
    every call, whether generate took the compiled path each time (None before any call)."""

    def __init__(self, hf, new_tokens: int, compile: bool, clock=time.perf_counter, sync=None):
        self.hf, self.new_tokens, self.compile = hf, new_tokens, compile
        self.clock, self.sync = clock, sync
        self.compiled = None

    def __call__(self, prompts):
        steps, prefill, compiled = _hf_steps(self.hf, prompts, self.new_tokens, self.compile,
                                             self.clock, self.sync)
        self.compiled = compiled if self.compiled is None else self.compiled and compiled
        return steps, [prefill]


def _hf_steps(hf, prompts: list[list[int]], new_tokens: int, compile: bool = True,
              clock=time.perf_counter, sync=None) -> tuple[list[float], float, bool]:
    """HF's generate with the static cache: (each decode step's ms, prefill ms, whether its
    decode step ran torch.compiled). Each step is stamped when its token is on the host: the
    GPU synchronised (`sync`, default torch.cuda.synchronize), then `clock()` (seconds) read,
    as kvlab's steps are timed to their tokens on the host. compile=False passes
    disable_compile (HF compiles the static cache's decode step by default)."""
    import torch
    import transformers

    sync = torch.cuda.synchronize if sync is None else sync
    stamps, compiled = [], []

    class Stamp(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            sync()
            stamps.append(clock() * 1e3)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def spy(*args, **kwargs):  # HF asks for its compiled call where it compiles
        compiled.append(True)
        return type(hf).get_compiled_call(hf, *args, **kwargs)

    ids = torch.tensor(prompts, device=hf.device)
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
    hf.get_compiled_call = spy
    try:
        sync()
        start = clock() * 1e3
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        do_sample=False, cache_implementation="static",
                        disable_compile=not compile,
                        stopping_criteria=transformers.StoppingCriteriaList([Stamp()]))
    finally:
        del hf.get_compiled_call
    return [b - a for a, b in itertools.pairwise(stamps)], stamps[0] - start, bool(compiled)


def hf_variants(hf, new_tokens: int, hf_compile: str, clock=time.perf_counter,
                sync=None) -> dict:
    """{variant: HFRunner} of `--hf-compile` ("on": HF_VARIANT compiled, "off":
    HF_EAGER_VARIANT, "both": the two, timed in turn)."""
    if hf_compile not in HF_COMPILE:
        raise ValueError(f"hf_compile={hf_compile!r}: must be one of {', '.join(HF_COMPILE)}")
    return {HF_VARIANT if on else HF_EAGER_VARIANT: HFRunner(hf, new_tokens, on, clock, sync)
            for on in HF_COMPILE[hf_compile]}


def _start_tensor_parallel() -> tuple[int, int]:
    """(rank, world size) of a process that torchrun started: its NCCL group joined, its GPU
    (LOCAL_RANK) made current. NVLink multicast (NVLS) stays off."""
    import os

    import torch

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl")
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def run(args) -> dict | None:
    """The result (None on the ranks of a tensor-parallel run but rank 0, which reports)."""
    import torch

    import kvlab
    from kvlab.engine import tp
    from kvlab.engine.weights import ModelWeights
    from kvlab.kernels import layer_ops
    from kvlab.predict.step import FOLDED_KEY
    from kvlab.timing import Timer, copy_roofline_gbps

    rank, world = _start_tensor_parallel() if args.tp > 1 else (0, 1)
    timer = Timer("cuda")
    result = {"benchmark": "e2e", **run_info(), **gpu_info(), "command": args.command,
              "dtype": "float16", "timing": "wall clock per decode step, from the previous "
              "step's tokens on the host to its own (queued ahead of them with async_decode, "
              "launched after them without); an untimed "
              "warm-up run of each first; median of every round's steps from steady state (two "
              "within 5%) on; the variants in turn, then HF's",
              "async_decode": args.async_decode, "rounds": args.rounds,
              "warmup_rounds": WARMUP_ROUNDS,
              "hf_compile": args.hf_compile if args.hf and world == 1 else None,
              "roofline_copy_gbps": round(copy_roofline_gbps(timer), 1), "rows": [],
              "skipped": [], "serving": [], "tp": world,
              FOLDED_KEY: True}  # the step model's kernels of these steps
    if world > 1:
        result["tp_note"] = ("one process per GPU; rank 0's steps and roofline (its shard of "
                             "the weights and of the K, V); no HF peer")
    gbps = result["roofline_copy_gbps"]
    l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    context = args.prompt + args.new_tokens / 2
    for name in args.models:
        model = MODELS[name]
        local = tp.shard_config(model, world) if world > 1 else model
        weights = ModelWeights.random(model, 0, torch.float16, "cuda")
        if world > 1:
            weights = tp.shard_weights(model, weights, rank, world)
        hf = None
        if args.hf and world == 1:
            from kvlab.engine.hf import causal_lm

            hf = causal_lm(model, weights)
        for batch in args.batches:
            prompts = random_prompts(model, batch, args.prompt)
            roofline_ms = step_bytes(local, weights, batch, context) / gbps / 1e6
            blocks = ceil_div(batch * (args.prompt + args.new_tokens), 16) + 16
            levers = {"ahead_bytes": (ahead_bytes(args, gbps, batch)
                                      if set(args.variants) & set(AHEAD_VARIANTS) else 0),
                      "ahead_kv_bytes": ahead_kv_bytes(local, batch,
                                                       args.prompt + args.new_tokens, l2_bytes),
                      "async_decode": False}
            variants = [v for v in args.variants
                        if v not in KV_VARIANTS or batch <= layer_ops.LINEAR_ROWS]
            for variant in [v for v in args.variants if v not in variants]:
                result["skipped"].append({
                    "model": name, "batch": batch, "variant": variant,
                    "reason": f"the K/V prefetch runs in layer_ops' linears, of at most "
                              f"{layer_ops.LINEAR_ROWS} rows"})
            try:
                runs, equal, compiled = measure_batch(
                    f"{name} batch={batch}", prompts, args.rounds,
                    partial(_kvlab_runners, name, weights, blocks, args, variants, levers),
                    None if hf is None else partial(hf_variants, hf, args.new_tokens,
                                                    args.hf_compile))
            except ValueError as error:
                if not does_not_fit(error):
                    raise
                result["skipped"].append({"model": name, "batch": batch, "reason": str(error)})
                print(f"{name} batch={batch} skipped: {error}", file=sys.stderr)
                continue
            for variant, (rounds, prefills, walls, _) in runs.items():
                lever = VARIANTS[variant][2] if variant in VARIANTS else None
                set_here = {lever: levers[lever]} if lever else {}
                if variant in equal:
                    set_here["same_tokens"] = equal[variant]
                result["rows"].append({**_row(name, variant, batch, args, rounds,
                                              statistics.median(prefills), roofline_ms),
                                       "round_wall_ms": [round(t, 3) for t in walls],
                                       "compiled": compiled[variant], "tp": world, **set_here})
            if rank == 0:
                write_checkpoint(args.checkpoint, result)
        del weights, hf
        free_memory()  # and whatever a batch that did not fit had built
        if args.serve_rates:
            kernel, prefetch, _ = VARIANTS[args.serve_variant]
            llm = kvlab.LLM(name, attention=kernel, prefetch=prefetch,
                            tensor_parallel=world > 1, async_decode=args.async_decode)
            for rate in args.serve_rates:
                prompts, limits, arrivals = serving_workload(args.serve_requests, rate, model)

                def progress(done, total, rate=rate, name=name):
                    if done % 32 == 0 or done == total:
                        print(f"{name} serving at {rate:g} requests/s: {done}/{total}",
                              file=sys.stderr)

                gen = llm.generate(prompts, limits, arrivals=arrivals, ignore_eos=True,
                                   on_finish=progress)
                result["serving"].append({"model": name, "variant": args.serve_variant,
                                          "rate": rate, **serving_stats(gen)})
                write_checkpoint(args.checkpoint, result)
            del llm
            free_memory()
    result["clocks_end"] = gpu_state()
    if world > 1:
        torch.distributed.destroy_process_group()
    return result if rank == 0 else None


def report(result: dict) -> str:
    """A line per row: ms per step, tokens/s, its ratio to the roofline step, and its speed
    over HF's static cache at the same point (compiled where that ran, else eager)."""
    mode = {True: "; kvlab's steps queued ahead of the host (async decode)",
            False: "; each kvlab step waited for (no async decode)"}.get(
                result.get("async_decode"), "")  # (older results do not say)
    lines = [f"{result['gpu']}: decode steps of kvlab.LLM and HF generate (static cache), "
             f"median from steady state; copy roofline {result['roofline_copy_gbps']:.0f} GB/s"
             f"{mode}",
             f"{'model':12} {'variant':17} {'B':>4} {'ms/step':>9} {'tok/s':>8} "
             f"{'roofline ms':>11} {'x roofline':>10} {'vs HF':>7}"]
    hf = {}  # the compiled peer where it ran, else the eager one
    for variant in (HF_EAGER_VARIANT, HF_VARIANT):
        hf |= {(r["model"], r["batch"]): r["step_ms"] for r in result["rows"]
               if r["variant"] == variant}
    peers = (HF_VARIANT, HF_EAGER_VARIANT)
    for r in result["rows"]:
        base = hf.get((r["model"], r["batch"]))
        versus = f"{base / r['step_ms']:.2f}x" if base and r["variant"] not in peers else "-"
        lines.append(f"{r['model']:12} {r['variant']:17} {r['batch']:>4} {r['step_ms']:>9.2f} "
                     f"{r['tokens_per_s']:>8.0f} {r['roofline_ms']:>11.2f} "
                     f"{r['ratio_to_roofline']:>10.2f} {versus:>7}"
                     + ("  TOKENS DIFFER from " + base_variant(r["variant"])
                        if r.get("same_tokens") is False else ""))
    for skip in result.get("skipped", []):
        what = f" {skip['variant']}" if "variant" in skip else ""
        lines.append(f"{skip['model']} batch {skip['batch']}{what} skipped: {skip['reason']}")
    for s in result.get("serving", []):
        lines.append(f"{s['model']} serving {s['requests']} requests at {s['rate']:g}/s "
                     f"({s['variant']}): {s['output_tokens_per_s']:,.0f} output tokens/s, "
                     f"TTFT p50 {s['ttft_ms_p50']:.1f} ms, TPOT p50 {s['tpot_ms_p50']:.2f} ms, "
                     f"p99 {s['tpot_ms_p99']:.2f} ms, {s['preemptions']} preemptions")
    return "\n".join(lines)
