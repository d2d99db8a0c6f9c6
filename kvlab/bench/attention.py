"""Decode-attention kernels on the GPU: `python -m kvlab bench attention`.

At each point (model, batch, context) and block size, ONE loop times every variant in turn (run 1
of each, then run 2 of each, ...; `kvlab.timing.Timer`):
- each kernel family (vllm_v1, gqa) at every prefetch setting asked for;
- with `--kernels ... auto`, kernel="auto" on each family's cache three ways: tuned at this point
  ("tuned"), tuned at another shape of its bucket (3/4 of the context) and reused here
  ("reused"), and with KVLAB_AUTOTUNE=0, the recorded choice ("recorded");
- torch SDPA (`enable_gqa=True`) on the kernels' own K/V: gqa's cache (else vllm_v1's),
  gathered through its block tables into dense, contiguous [batch, num_kv_heads, context,
  head_dim] once per loop, outside the timed runs (`dense_kv`); its backend named from the
  kernels the profiler sees it launch. Before timing, SDPA's output is checked against
  kvlab.reference's and that family's kernel's (no prefetch) on that cache: the row records
  both errors (`sdpa_rel_l2`, the worst sequence's relative L2) and `outputs_agree`, within
  OUTPUT_TOLERANCE (the kernels' tests' tolerance);
- with `--fp8`, gqa on an fp8 (e4m3) cache of the same shape at every prefetch setting (kernel
  "gqa_fp8": q and out in --dtype; its GB/s count the fp8 bytes it reads, half of fp16's);
- with `--in-order`, each family without prefetch on a cache of the same shape whose blocks lie
  in order, as a fresh pool hands them out (kernels "vllm_v1_in_order", "gqa_in_order");
- with `--kernels ... flashinfer flashinfer_tc`, FlashInfer's paged decode (its CUDA-core kernel,
  its tensor-core path for grouped queries; `kvlab.kernels.flashinfer_peer`) on gqa's cache, the
  same K/V tensors (zero copy), and with `--fp8` on gqa's fp8 cache too ("flashinfer_fp8",
  "flashinfer_tc_fp8"); without gqa in --kernels, on a gqa cache of its own (SDPA then reads that
  one). Before timing, each one's output is checked against kvlab.reference's and gqa's kernel's
  (no prefetch) on that cache: `rel_l2` and `outputs_agree` as SDPA's; rows carry
  `flashinfer_version`;
- with `--kernels ... read`, a plain read of as many bytes as the point's K/V from one buffer
  (`kvlab.kernels.read.PlainRead`): what a read of that size reaches, the bound of a decode
  kernel there (small points cannot reach the copy roofline, which is measured on 4 GiB).
Every other cache's blocks are scattered over the pool (a shuffled free queue, as in a server that
has run for a while; vLLM's kernel benchmark draws random block ids too). The rows of kvlab's
kernels record which in `block_order`: "scattered" or "in_order".
`--dtype` (float16 or bfloat16) is that of q, out, the fp16/bf16 caches and SDPA's K/V.
With `--lengths lognormal:MEAN,MAX` or `production:MAX` (FlashInfer's production mix, 4k to 128k
weighted 35 to 8 %, scaled so that the mix's longest length is MAX), each point is a batch of mixed
lengths (kvlab.workload.mixed_lengths) instead of one context: its rows carry `lengths` (the spec),
`context` (the batch's mean length, rounded) and `max_context`, and no SDPA row (a dense batch of
mixed lengths would be padded to the longest); kernel "gqa_split_longest" is gqa without prefetch
with its split planned as if every sequence were the longest (kvlab before it planned by lengths).
With `--vllm-cubin PATH`, vLLM's own kernels (kvlab.kernels.vllm_own, built by
benchmarks/vllm_cubin.sh) on vllm_v1's cache, launched as vLLM does (kernel "vllm_own", its
`vllm_variant` v1 or v2): the baseline vllm_v1 follows, in the same loop. The result's
`vllm_cubin` names the file, its sha256 and its build.
Every row carries its `loop`: ratios between rows (prefetch over none, gqa over SDPA, auto over
the best setting) compare rows of one loop only.

`measure` and `measure_point` are the keyword entry points (the CLI parses its options, then
calls `measure`; the dashboard calls `measure_point`).

Each row: ms (median of --runs runs, L2 flushed before each), every run (`ms_runs`), GB/s of K+V
read (each byte once) and its % of the HBM roofline (a device-to-device copy measured in the same
run, `kvlab.timing.copy_roofline_gbps`). The rows of kvlab's kernels carry their plan's launch:
`partition_size` (tokens per CTA; 0: one CTA a sequence) and `warps` per CTA.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kvlab.arith import ceil_div
from kvlab.bench.cli import ATTENTION_DEFAULTS, command_line
from kvlab.bench.env import gpu_info, gpu_state, run_info, write_checkpoint
from kvlab.cache import filled_cache
from kvlab.cache.fp8 import FP8_DTYPE
from kvlab.config import MODELS
from kvlab.kernels import FAMILIES, KERNEL_FAMILIES, flashinfer_peer, gqa, green, tune, vllm_own
from kvlab.kernels.decode import DecodePlan
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.kernels.read import PlainRead
from kvlab.reference import decode_attention as reference
from kvlab.reference import unpack_blocks
from kvlab.timing import METHOD, Timer, copy_roofline_gbps
from kvlab.workload import batch_shape

AUTO_MODES = ("tuned", "reused", "recorded")
# What one loop's copies of the K/V (each family's caches, SDPA's dense one, the read's buffer)
# may hold together: at most this, and the GPU's memory less LOOP_HEADROOM_BYTES (queries,
# outputs, workspaces, the L2 flush buffer, SDPA's gather).
MAX_LOOP_KV_BYTES = 120 * 2**30
LOOP_HEADROOM_BYTES = 10 * 2**30
DENSE = ("sdpa", "read")  # the variants that read a dense buffer, not the paged cache
SDPA_BACKENDS = (("cudnn", "cudnn"), ("flash", "flash"), ("fmha", "efficient"),
                 ("efficient", "efficient"))
# The worst sequence's relative L2 error SDPA's output may have against the reference (and
# against the kernel's): the tolerance of the kernels' own tests (tests/kernels/test_decode.py).
OUTPUT_TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
SDPA_SOURCES = ("gqa", "vllm_v1")  # whose cache SDPA reads, the first built
# FlashInfer's kernels, as --kernels names them -> use_tensor_cores
FLASHINFER_TENSOR_CORES = {"flashinfer": False, "flashinfer_tc": True}


def prefetch_variants(modes, distances, evict_last: bool = False) -> list[PrefetchConfig]:
    """No prefetch, then each mode at each distance (and its evict-last twin when asked)."""
    policies = (False, True) if evict_last else (False,)
    return [PrefetchConfig()] + [
        PrefetchConfig(m, distance=d, evict_last=e)
        for m in modes if m != "none" for d in distances for e in policies
    ]


def check(args) -> None:
    """Raise ValueError unless this machine can run the benchmark (a CUDA GPU and CuPy, and no
    more SMs asked for than it has; FlashInfer installed when its kernels are asked for)."""
    from kvlab.device import backend

    if args.points and args.lengths:
        raise ValueError("--points and --lengths: give one (--points are batches of equal "
                         "lengths)")
    if args.fp8 and "gqa" not in args.kernels:
        raise ValueError(f"--fp8 times gqa on an fp8 cache: --kernels {' '.join(args.kernels)} "
                         "leaves gqa out")
    if args.vllm_cubin is not None:
        check_vllm_cubin(args)
    if backend() != "cuda":
        raise ValueError("python -m kvlab bench attention needs a CUDA GPU usable through torch "
                         "and CuPy (kvlab.backend() is 'sim' here)")
    peers = [k for k in FLASHINFER_TENSOR_CORES if k in args.kernels]
    if peers and (reason := flashinfer_peer.unavailable_reason()) is not None:
        raise ValueError(f"--kernels {' '.join(peers)}: {reason}")
    total = green.device_sms()
    for n in args.sms or ():
        if n > total:
            raise ValueError(f"--sms {n}: this GPU has {total} SMs")


def check_vllm_cubin(args) -> None:
    """Raise ValueError unless --vllm-cubin can run beside these options: vLLM's kernels run on
    vllm_v1's cache, in fp16, at head_dim 128 and blocks 8/16/32 (what vllm_cubin.sh builds)."""
    if "vllm_v1" not in args.kernels:
        raise ValueError(f"--vllm-cubin times vLLM's kernels on vllm_v1's cache: --kernels "
                         f"{' '.join(args.kernels)} leaves vllm_v1 out")
    if args.dtype != "float16":
        raise ValueError(f"--vllm-cubin with --dtype {args.dtype}: vllm_cubin.sh builds vLLM's "
                         "fp16 kernels only")
    for size in args.block_sizes:
        if size not in vllm_own.BLOCK_SIZES:
            raise ValueError(f"--vllm-cubin with --block-sizes {size}: vLLM's kernels are built "
                             f"for {', '.join(map(str, vllm_own.BLOCK_SIZES))}")
    for name in args.models:
        if MODELS[name].head_dim not in vllm_own.HEAD_DIMS:
            raise ValueError(f"--vllm-cubin with --models {name} (head_dim "
                             f"{MODELS[name].head_dim}): vLLM's kernels are built for head_dim "
                             f"{', '.join(map(str, vllm_own.HEAD_DIMS))}")
    vllm_own.describe(args.vllm_cubin)


def sm_counts(requested, total: int, reason: str | None) -> tuple[list, str | None]:
    """The SM counts to time at (None: the whole GPU, no green context) and, where green contexts
    are unavailable (`reason`) but fewer SMs were asked for, the note that the run fell back to
    the whole GPU."""
    counts = list(dict.fromkeys(None if n == total else n for n in requested or [total]))
    if reason is not None and counts != [None]:
        return [None], (f"--sms {' '.join(map(str, requested))}: green contexts are not "
                        f"available ({reason}); timed on the whole GPU ({total} SMs) only")
    return counts, None


def sibling_context(context: int, block_size: int) -> int | None:
    """A shorter context in the same autotune bucket as `context` (about 3/4 of it, whole
    blocks), where kernel="auto" tunes before it is reused at `context`; None if there is none."""
    sibling = (3 * context // 4) // block_size * block_size
    if sibling < 1 or tune.pow2_ceil(sibling) != tune.pow2_ceil(context):
        return None
    return sibling


@contextlib.contextmanager
def autotune(value: str):
    """KVLAB_AUTOTUNE set to `value` inside the block."""
    old = os.environ.get("KVLAB_AUTOTUNE")
    os.environ["KVLAB_AUTOTUNE"] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ["KVLAB_AUTOTUNE"]
        else:
            os.environ["KVLAB_AUTOTUNE"] = old


def auto_plans(cache, seq_ids, sibling_ids, num_qo_heads: int, sibling: int | None) -> dict:
    """kernel="auto" on `cache`: {mode: (plan, row fields)} for each of AUTO_MODES ("reused"
    only with a sibling)."""
    plans = {}
    tune.clear()
    plans["tuned"] = DecodePlan(cache, seq_ids, num_qo_heads, kernel="auto"), {}
    if sibling:
        tune.clear()
        DecodePlan(cache, sibling_ids, num_qo_heads, kernel="auto")  # tunes the bucket there
        plans["reused"] = (DecodePlan(cache, seq_ids, num_qo_heads, kernel="auto"),
                           {"tuned_at_context": sibling})
    with autotune("0"):
        plans["recorded"] = DecodePlan(cache, seq_ids, num_qo_heads, kernel="auto"), {}
    tune.clear()
    return plans


def sdpa_backend(kernels: list[str]) -> str:
    """The SDPA backend a list of CUDA kernel names shows: cudnn, flash, efficient, math (other
    kernels), or unknown (no kernel seen)."""
    for name in kernels:
        for marker, backend in SDPA_BACKENDS:
            if marker in name.lower():
                return backend
    return "math" if kernels else "unknown"


def cuda_kernels(fn) -> list[str]:
    """The names of the CUDA kernels one call of `fn` launches, as torch's profiler sees them
    ([] where the profiler cannot see the GPU)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sorted({e.name for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA})
    except RuntimeError as err:  # no CUPTI: the row says "unknown" rather than guess
        print(f"SDPA's kernels not seen: {err}", file=sys.stderr)
        return []


def launch_fields(plan) -> dict:
    """A plan's launch, as its rows record it: tokens per partition (0 where each CTA takes a
    whole sequence) and warps per CTA."""
    launcher = plan.launcher
    return {"partition_size": launcher.partition_size if launcher.num_partitions > 1 else 0,
            "warps": launcher.warps}


def kv_copies(args, mixed: bool) -> float:
    """How many copies of a point's K/V one loop holds: a cache per family asked for (and one
    more each with --in-order), half a copy for an fp8 cache, a gqa cache for FlashInfer where
    gqa is not asked for, SDPA's dense copy, the plain read's buffer."""
    families = sum(family in args.kernels for family in FAMILIES)
    peer_cache = ("gqa" not in args.kernels
                  and any(k in args.kernels for k in FLASHINFER_TENSOR_CORES))
    sdpa = "sdpa" in args.kernels and not mixed
    return (families * (2 if args.in_order else 1) + (0.5 if args.fp8 else 0) + peer_cache
            + sdpa * (1 if families or peer_cache else 2)  # SDPA alone gathers from its own
            + ("read" in args.kernels))


def dense_kv(cache, seq_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V of sequences of one length, read from a paged cache through its block tables
    into the dense layout SDPA takes: each [len(seq_ids), num_kv_heads, context, head_dim],
    contiguous, in the cache's dtype and on its device. Raises ValueError for no seq_ids, for
    sequences of different lengths (a dense batch would be padded), or an fp8 cache."""
    seq_ids = list(seq_ids)
    if not seq_ids:
        raise ValueError("seq_ids=[]: must name at least one sequence")
    if cache.k_scale is not None:
        raise ValueError(f"cache.dtype={cache.dtype}: SDPA reads fp16/bf16 K/V, not fp8")
    lengths = {cache.manager.seq_len(s) for s in seq_ids}
    if len(lengths) != 1:
        raise ValueError(f"seq_ids: sequences of {len(lengths)} lengths ({min(lengths)}-"
                         f"{max(lengths)}): a dense batch needs one")
    (context,) = lengths
    num_blocks = ceil_div(context, cache.block_size)
    tables = cache.block_tables(seq_ids)[:, :num_blocks]  # [B, num_blocks]
    shape = (len(seq_ids), cache.num_kv_heads, context, cache.head_dim)
    k, v = (torch.empty(shape, dtype=cache.dtype, device=cache.device) for _ in "kv")
    for b in range(len(seq_ids)):  # NOTE: one sequence at a time: a temporary of one, not all
        seq_k, seq_v = unpack_blocks(cache, tables[b])  # [num_kv_heads, num_blocks * bs, D]
        k[b], v[b] = seq_k[:, :context], seq_v[:, :context]
    return k, v


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst relative L2 error of any one sequence (row of the batch) of `out` against
    `ref` (both [B, ...]): an error in one short sequence must not hide in the batch's norm."""
    diff = (out.float() - ref.float()).flatten(1).norm(dim=1)
    return (diff / ref.float().flatten(1).norm(dim=1)).max().item()


def output_check(sdpa_out, kernel_out, ref, tolerance: float, field: str = "sdpa_rel_l2") -> dict:
    """A row's record of SDPA's (or a peer's) output against the reference's and a kernel's on
    the same K/V (each [B, num_qo_heads, head_dim]): {field: {"reference": e, "kernel": e},
    "outputs_agree": both within `tolerance`}."""
    errors = {"reference": rel_l2(sdpa_out, ref), "kernel": rel_l2(sdpa_out, kernel_out)}
    return {field: {k: float(f"{e:.3g}") for k, e in errors.items()},
            "outputs_agree": all(e <= tolerance for e in errors.values())}


def sdpa_variant(q, source: dict, dtype) -> tuple[dict, object]:
    """SDPA on the K/V of `source` ({"family", "cache", "seq_ids", "plan"}: a cache of one length
    and its plan without prefetch), gathered into dense K/V here, its output checked against
    the reference and the plan's kernel before it is timed: (row fields, the timed call)."""
    k, v = dense_kv(source["cache"], source["seq_ids"])
    q4 = q[:, :, None]  # [B, num_qo_heads, 1, head_dim]

    def sdpa():
        return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)

    check = output_check(sdpa()[:, :, 0], source["plan"].run(q),
                         reference(q, source["cache"], source["seq_ids"]),
                         OUTPUT_TOLERANCE[dtype])
    if not check["outputs_agree"]:
        print(f"WARNING: SDPA's output on {source['family']}'s K/V is off by "
              f"{check['sdpa_rel_l2']} (tolerance {OUTPUT_TOLERANCE[dtype]})", file=sys.stderr)
    kernels = cuda_kernels(sdpa)
    return ({"kernel": "sdpa", "prefetch": "none", "sdpa_backend": sdpa_backend(kernels),
             "sdpa_kernels": kernels, "kv_from": source["family"], **check}, sdpa)


def flashinfer_peers(args, model) -> dict[str, str | None]:
    """FlashInfer's kernels asked for in args.kernels -> why the model's head layout rules it
    out (flashinfer_peer.unsupported), or None where it runs."""
    return {k: flashinfer_peer.unsupported(model.num_qo_heads, model.num_kv_heads, tensor_cores)
            for k, tensor_cores in FLASHINFER_TENSOR_CORES.items() if k in args.kernels}


def flashinfer_variants(q, out, kernels, sources, dtype) -> dict:
    """FlashInfer's `kernels` (names of FLASHINFER_TENSOR_CORES) on each source's cache
    ({"family", "cache", "seq_ids", "plan"}: gqa's, and gqa's fp8 one), each output checked
    against the reference and the source's plan before it is timed: {key: (row fields, the timed
    call)}."""
    found = {}
    for source in sources:
        cache, seq_ids = source["cache"], source["seq_ids"]
        fp8 = cache.k_scale is not None
        ref = reference(q, cache, seq_ids)
        for name in kernels:
            decode = flashinfer_peer.FlashInferDecode(
                cache, seq_ids, q.shape[1], use_tensor_cores=FLASHINFER_TENSOR_CORES[name],
                q_dtype=dtype)
            kernel = f"{name}_fp8" if fp8 else name
            check = output_check(decode.run(q), source["plan"].run(q), ref,
                                 OUTPUT_TOLERANCE[dtype], field="rel_l2")
            if not check["outputs_agree"]:
                print(f"WARNING: {kernel}'s output on {source['family']}'s K/V is off by "
                      f"{check['rel_l2']} (tolerance {OUTPUT_TOLERANCE[dtype]})", file=sys.stderr)
            found[kernel, "none"] = (
                {"kernel": kernel, "prefetch": "none", "block_order": "scattered",
                 "kv_from": source["family"], **({"kv_dtype": "fp8"} if fp8 else {}),
                 "flashinfer_version": flashinfer_peer.installed_version(),
                 "flashinfer_backend": flashinfer_peer.BACKEND, **check},
                lambda decode=decode: decode.run(q, out=out))
    return found


def loop_variants(model, batch: int, context, block_size: int, args, dtype,
                  kv_bytes: int) -> dict:
    """Every variant of one loop: {key: (row fields, callable)}. context: an int, or the batch's
    lengths (mixed: no SDPA, and kernel="auto" not reused from a sibling shape); kv_bytes: the
    batch's K and V in 16-bit elements, what the plain read reads."""
    mixed = not isinstance(context, int)
    variants = prefetch_variants(args.prefetch, args.distances, args.evict_last)
    q = torch.randn(batch, model.num_qo_heads, model.head_dim, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    found, sources = {}, {}
    for family in FAMILIES:
        if family not in args.kernels or block_size not in KERNEL_FAMILIES[family].block_sizes:
            continue
        sibling = (sibling_context(context, block_size) if "auto" in args.kernels and not mixed
                   else None)
        cache, seq_ids, sibling_ids = filled_cache(
            batch, context, block_size, model.num_kv_heads, model.head_dim,
            layout=KERNEL_FAMILIES[family].layout, dtype=dtype, sibling=sibling)
        plans = {(family, p.label()): ({"kernel": family, "prefetch": p.label()},
                                       DecodePlan(cache, seq_ids, model.num_qo_heads, family,
                                                  prefetch=p)) for p in variants}
        sources[family] = {"family": family, "cache": cache, "seq_ids": seq_ids,
                           "plan": plans[family, "none"][1]}
        if "auto" in args.kernels:
            for mode, (plan, extra) in auto_plans(cache, seq_ids, sibling_ids,
                                                  model.num_qo_heads, sibling).items():
                plans["auto", family, mode] = ({"kernel": "auto", "family": family,
                                                "auto_mode": mode,
                                                "prefetch": plan.prefetch.label(), **extra}, plan)
        if family == "vllm_v1" and args.vllm_cubin is not None:
            plan = next(iter(plans.values()))[1]
            own = vllm_own.VllmOwn(args.vllm_cubin, cache, model.num_qo_heads,
                                   plan.host_seq_lens)
            found["vllm_own", "none"] = (
                {"kernel": "vllm_own", "prefetch": "none", "vllm_variant": own.variant,
                 "block_order": "scattered"},
                lambda own=own, plan=plan, cache=cache: own(
                    out, q, cache.k_cache, cache.v_cache, plan.block_tables, plan.seq_lens))
        if family == "gqa" and mixed:  # the split planned as if every sequence were the longest
            plan = DecodePlan(cache, seq_ids, model.num_qo_heads, family)
            plan.launcher = gqa.Gqa(cache, model.num_qo_heads, [plan.max_seq_len] * batch,
                                    plan.prefetch, plan.num_sms, plan.q_dtype)
            plans["gqa_split_longest", "none"] = ({"kernel": "gqa_split_longest",
                                                   "prefetch": "none"}, plan)
        if family == "gqa" and args.fp8:
            fp8_cache, fp8_ids, _ = filled_cache(
                batch, context, block_size, model.num_kv_heads, model.head_dim,
                layout=KERNEL_FAMILIES[family].layout, dtype=FP8_DTYPE)
            plans.update({("gqa_fp8", p.label()): (
                {"kernel": "gqa_fp8", "prefetch": p.label(), "kv_dtype": "fp8"},
                DecodePlan(fp8_cache, fp8_ids, model.num_qo_heads, family, prefetch=p,
                           q_dtype=dtype))
                for p in variants})
            sources["gqa_fp8"] = {"family": "gqa_fp8", "cache": fp8_cache, "seq_ids": fp8_ids,
                                  "plan": plans["gqa_fp8", "none"][1]}
        if args.in_order:
            ordered, ordered_ids, _ = filled_cache(
                batch, context, block_size, model.num_kv_heads, model.head_dim,
                layout=KERNEL_FAMILIES[family].layout, dtype=dtype, in_order=True)
            plans[f"{family}_in_order", "none"] = (
                {"kernel": f"{family}_in_order", "prefetch": "none", "block_order": "in_order"},
                DecodePlan(ordered, ordered_ids, model.num_qo_heads, family))
        for key, (fields, plan) in plans.items():
            found[key] = ({"block_order": "scattered", **fields, **launch_fields(plan)},
                          lambda plan=plan: plan.run(q, out=out))
    peers = [k for k, why in flashinfer_peers(args, model).items() if why is None]
    if peers:
        if "gqa" not in sources:  # no gqa in this loop: a gqa cache for FlashInfer (and SDPA)
            cache, seq_ids, _ = filled_cache(batch, context, block_size, model.num_kv_heads,
                                             model.head_dim, layout=gqa.FAMILY.layout, dtype=dtype)
            sources["gqa"] = {"family": "gqa", "cache": cache, "seq_ids": seq_ids,
                              "plan": DecodePlan(cache, seq_ids, model.num_qo_heads, "gqa")}
        found.update(flashinfer_variants(q, out, peers, [sources[f] for f in ("gqa", "gqa_fp8")
                                                         if f in sources], dtype))
    if "sdpa" in args.kernels and not mixed:
        source = next((sources[f] for f in SDPA_SOURCES if f in sources), None)
        if source is None:  # no family's cache in this loop: a gqa cache for SDPA alone
            cache, seq_ids, _ = filled_cache(batch, context, block_size, model.num_kv_heads,
                                             model.head_dim, layout=gqa.FAMILY.layout, dtype=dtype)
            source = {"family": "gqa", "cache": cache, "seq_ids": seq_ids,
                      "plan": DecodePlan(cache, seq_ids, model.num_qo_heads, "gqa")}
        found["sdpa"] = sdpa_variant(q, source, dtype)
    if "read" in args.kernels:
        found["read"] = ({"kernel": "read", "prefetch": "none"}, PlainRead(kv_bytes).read)
    return found


def measure(**options) -> dict:
    """Time the benchmark with keyword options, as `python -m kvlab bench attention` does with
    the same options parsed: models, batches, contexts (or lengths: lognormal specs; or points:
    (batch, context) pairs), block_sizes, prefetch (modes), distances, evict_last, kernels,
    runs, vllm_cubin, fp8, in_order, dtype ("float16" or "bfloat16"), sms, checkpoint (a path),
    command (the result's command line; default the equivalent `python -m kvlab bench
    attention ...`). Lists may be any sequence; an option left out takes the CLI's default
    (kvlab.bench.cli.ATTENTION_DEFAULTS). Returns the result: {"rows": [...], "skipped":
    [...], the GPU, the roofline, ...}. Raises ValueError for an unknown option, or what
    `check` refuses (no CUDA GPU, ...), before any GPU work."""
    args = options_namespace(**options)
    check(args)
    return run(args)


def options_namespace(command: str | None = None, **options) -> SimpleNamespace:
    """`measure`'s keyword options as the namespace `check` and `run` take (what the CLI's
    parser gives): every option of ATTENTION_DEFAULTS (the CLI's defaults) as a list where it
    is one, and `command`, default the equivalent command line. ValueError for an unknown
    option."""
    unknown = set(options) - set(ATTENTION_DEFAULTS)
    if unknown:
        raise ValueError(f"{', '.join(sorted(unknown))}: not options of bench attention (its "
                         f"options: {', '.join(ATTENTION_DEFAULTS)})")

    def plain(value):
        return list(value) if isinstance(value, (list, tuple)) else value

    given = {k: plain(v) for k, v in options.items() if plain(v) != plain(ATTENTION_DEFAULTS[k])}
    args = SimpleNamespace(**{k: plain(v) for k, v in ATTENTION_DEFAULTS.items()})
    vars(args).update(given)
    args.command = command if command is not None else command_line("attention", given)
    return args


def measure_point(model: str, batch: int, context: int | str, **options) -> dict:
    """`measure` at one point: `batch` sequences of `context` tokens, or of a mixed-lengths spec
    ("lognormal:MEAN,MAX" or "production:MAX"); other options as `measure` takes them (kernels,
    prefetch, distances, block_sizes, runs, fp8, in_order, ...). Returns the result dict."""
    shape = ({"lengths": [context]} if isinstance(context, str)
             else {"contexts": [context]})
    return measure(models=[model], batches=[batch], **shape, **options)


def run(args) -> dict:
    """The result of the options in `args` (what `measure` and the CLI have checked)."""
    dtype = getattr(torch, args.dtype)
    timer = Timer("cuda", num_runs=args.runs)
    result = {"benchmark": "attention", **run_info(), **gpu_info(), "dtype": args.dtype,
              "num_runs": args.runs, "l2_flushed": True, "timing": METHOD,
              "command": args.command}
    if args.vllm_cubin is not None:
        result["vllm_cubin"] = vllm_own.describe(args.vllm_cubin)
    result["roofline_copy_gbps"] = round(copy_roofline_gbps(timer), 1)
    result["clocks_after_roofline"] = gpu_state()
    counts, note = sm_counts(args.sms, green.device_sms(), green.unavailable_reason())
    if note is not None:
        print(f"NOTE: {note}", file=sys.stderr)
        result["sms_note"] = note
    # the copy roofline on each SM count that is not the whole GPU's: what those SMs can read
    result["roofline_copy_gbps_by_sms"] = {}
    result.update(rows=[], skipped=[])
    rows, skipped = result["rows"], result["skipped"]
    loop_budget = min(MAX_LOOP_KV_BYTES,
                      torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
                      - LOOP_HEADROOM_BYTES)
    if args.points:
        points = [(name, batch, context) for name in args.models for batch, context in args.points]
    else:
        points = list(itertools.product(args.models, args.batches,
                                        args.lengths or args.contexts))
    loop = 0
    for i, (name, batch, shape) in enumerate(points):
        model = MODELS[name]
        shape, context, tokens, mixed = batch_shape(batch, shape)
        kv_bytes = 2 * tokens * model.kv_size * 2
        copies = kv_copies(args, mixed=bool(mixed))
        if kv_bytes * copies > loop_budget:
            skipped.append({"model": name, "batch": batch, "context": context, **mixed,
                            "reason": f"{kv_bytes / 2**30:.0f} GiB of K/V for one layer, "
                                      f"{copies:g} copies in one loop (at most "
                                      f"{loop_budget / 2**30:.0f} GiB in all on this GPU)"})
            continue
        print(f"[{i + 1}/{len(points)}] {name} batch={batch} context={context}", file=sys.stderr)
        skipped.extend({"model": name, "batch": batch, "context": context, **mixed,
                        "kernel": kernel, "reason": why}
                       for kernel, why in flashinfer_peers(args, model).items() if why)
        for block_size, sms in itertools.product(args.block_sizes, counts):
            with green.sm_limit(sms) as held:
                if sms is not None and str(held) not in result["roofline_copy_gbps_by_sms"]:
                    result["roofline_copy_gbps_by_sms"][str(held)] = round(
                        copy_roofline_gbps(timer), 1)
                found = loop_variants(model, batch, shape, block_size, args, dtype, kv_bytes)
                times = timer.times_ms({key: fn for key, (_, fn) in found.items()})
            for key, (fields, _) in found.items():
                ms = statistics.median(times[key])
                read = kv_bytes // 2 if fields.get("kv_dtype") == "fp8" else kv_bytes
                gbps = read / (ms * 1e-3) / 1e9
                rows.append({"model": name, "num_qo_heads": model.num_qo_heads,
                             "num_kv_heads": model.num_kv_heads, "batch": batch,
                             "context": context, **mixed,
                             "block_size": None if key in DENSE else block_size,
                             "sms": held, "loop": loop, **fields,
                             "kv_bytes": read, "ms": ms,
                             "ms_runs": [round(t, 5) for t in times[key]],
                             "gbps": round(gbps, 1),
                             "pct_roofline": round(100 * gbps / result["roofline_copy_gbps"], 1)})
            del found
            torch.cuda.empty_cache()
            loop += 1
        write_checkpoint(args.checkpoint, result)
    result["clocks_end"] = gpu_state()
    return result


def loop_ratios(rows) -> dict[int, dict]:
    """Per loop: the fastest setting of each family, gqa over SDPA, gqa over each FlashInfer
    kernel on the same cache (`gqa_over_flashinfer`), gqa and SDPA over the plain read
    (`over_read`), and each auto row's time over the fastest setting of its family
    ({loop: {...}}), from rows of one loop only."""
    by_loop = {}
    for row in rows:
        by_loop.setdefault(row["loop"], []).append(row)
    ratios = {}
    for loop, mine in by_loop.items():
        best = {}
        for family in FAMILIES:
            timed = [r for r in mine if r["kernel"] == family]
            if timed:
                best[family] = min(timed, key=lambda r: r["ms"])
        entry = {"best": {f: (r["prefetch"], r["ms"]) for f, r in best.items()}}
        sdpa = next((r for r in mine if r["kernel"] == "sdpa"), None)
        gqa_none = next((r for r in mine if r["kernel"] == "gqa" and r["prefetch"] == "none"),
                        None)
        if sdpa and gqa_none:
            entry["gqa_over_sdpa"] = sdpa["ms"] / gqa_none["ms"]  # speed ratio
        read = next((r for r in mine if r["kernel"] == "read"), None)
        entry["over_read"] = {  # speed ratio to the plain read of the same bytes
            r["kernel"]: read["ms"] / r["ms"] for r in (gqa_none, sdpa) if read and r}
        in_order = {r["kernel"].removesuffix("_in_order"): r for r in mine
                    if r["kernel"].endswith("_in_order")}
        if sdpa and "gqa" in in_order:
            entry["gqa_in_order_over_sdpa"] = sdpa["ms"] / in_order["gqa"]["ms"]
        entry["in_order_over_scattered"] = {  # speed ratio, each family without prefetch
            family: scattered["ms"] / in_order[family]["ms"] for family in in_order
            for scattered in mine if scattered["kernel"] == family
            and scattered["prefetch"] == "none"}
        fp8_none = next((r for r in mine if r["kernel"] == "gqa_fp8" and r["prefetch"] == "none"),
                        None)
        if fp8_none and gqa_none:
            entry["fp8_over_fp16"] = gqa_none["ms"] / fp8_none["ms"]  # tokens/s ratio
        entry["gqa_over_flashinfer"] = {  # speed ratio, gqa (no prefetch) on the same cache
            r["kernel"]: r["ms"] / gqa["ms"] for r in mine if r["kernel"].startswith("flashinfer")
            for gqa in [fp8_none if r.get("kv_dtype") == "fp8" else gqa_none] if gqa}
        entry["auto"] = {(r["family"], r["auto_mode"]): r["ms"] / best[r["family"]]["ms"]
                         for r in mine if r["kernel"] == "auto" and r["family"] in best}
        ratios[loop] = entry
    return ratios


def report(result: dict) -> str:
    lines = [f"{result['gpu']}: copy roofline {result['roofline_copy_gbps']:.0f} GB/s "
             f"(median of {result['num_runs']}, L2 flushed; every variant of a point timed in "
             "turn, in one loop)",
             f"{'model':12} {'B':>4} {'ctx':>6} {'bs':>4} {'kernel':16} {'prefetch':24} "
             f"{'ms':>8} {'GB/s':>7} {'%roof':>6}"]
    for r in result["rows"]:
        kernel = f"auto:{r['auto_mode']}" if r["kernel"] == "auto" else r["kernel"]
        prefetch = f"{r['family']} {r['prefetch']}" if r["kernel"] == "auto" else r["prefetch"]
        lines.append(f"{r['model']:12} {r['batch']:>4} {r['context']:>6} "
                     f"{r['block_size'] or '-':>4} {kernel:16} {prefetch:24} "
                     f"{r['ms']:>8.4f} {r['gbps']:>7.0f} {r['pct_roofline']:>6.1f}")
    lines += [f"skipped {s['model']} B={s['batch']} ctx={s['context']}"
              f"{' ' + s['kernel'] if 'kernel' in s else ''}: {s['reason']}"
              for s in result["skipped"]]
    ratios = loop_ratios(result["rows"])
    sdpa = [e["gqa_over_sdpa"] for e in ratios.values() if "gqa_over_sdpa" in e]
    if sdpa:
        lines.append(f"gqa (no prefetch) / SDPA, same loop: {min(sdpa):.3f}-{max(sdpa):.3f}x")
    peers = sorted({k for e in ratios.values() for k in e["gqa_over_flashinfer"]})
    for kernel in peers:
        speed = [e["gqa_over_flashinfer"][kernel] for e in ratios.values()
                 if kernel in e["gqa_over_flashinfer"]]
        lines.append(f"gqa{'_fp8' if kernel.endswith('_fp8') else ''} (no prefetch) / {kernel}, "
                     f"same loop: {min(speed):.3f}-{max(speed):.3f}x")
    ordered = [e["gqa_in_order_over_sdpa"] for e in ratios.values()
               if "gqa_in_order_over_sdpa" in e]
    if ordered:
        lines.append(f"gqa (no prefetch) on blocks in order / SDPA, same loop: "
                     f"{min(ordered):.3f}-{max(ordered):.3f}x")
    for family in FAMILIES:
        gain = [e["in_order_over_scattered"][family] for e in ratios.values()
                if family in e["in_order_over_scattered"]]
        if gain:
            lines.append(f"{family} (no prefetch) on blocks in order / scattered, same loop: "
                         f"{min(gain):.3f}-{max(gain):.3f}x")
    for kernel in ("gqa", "sdpa"):
        bound = [e["over_read"][kernel] for e in ratios.values() if kernel in e["over_read"]]
        if bound:
            lines.append(f"{kernel}{' (no prefetch)' if kernel == 'gqa' else ''} / a plain "
                         f"read of the same bytes, same loop: {min(bound):.3f}-"
                         f"{max(bound):.3f}x")
    fp8 = [e["fp8_over_fp16"] for e in ratios.values() if "fp8_over_fp16" in e]
    if fp8:
        lines.append(f"gqa on fp8 / on fp16 (no prefetch), tokens/s, same loop: "
                     f"{min(fp8):.3f}-{max(fp8):.3f}x")
    for mode in AUTO_MODES:
        worst = [r for e in ratios.values() for (_, m), r in e["auto"].items() if m == mode]
        if worst:
            lines.append(f"kernel='auto' ({mode}) vs the fastest setting of its family, same "
                         f"loop: at worst {max(worst):.3f}x its time, median "
                         f"{statistics.median(worst):.3f}x, within 3% at "
                         f"{sum(w <= 1.03 for w in worst)} of {len(worst)}")
    return "\n".join(lines)
