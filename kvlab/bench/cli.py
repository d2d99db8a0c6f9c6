"""The command line: `python -m kvlab bench <name> [options] [--json PATH]`.

Every benchmark's options are declared here, in a module that imports nothing heavy, so that
`python -m kvlab bench <name> --help` lists them, and a bad value ends in one line on stderr and
exit status 2 before torch loads or any GPU work starts. A benchmark module
(`kvlab.bench.<name>`) is imported only to run; it provides `check(args)` (raises ValueError for
what the options alone cannot tell: a GPU to run on, a file to resume), `run(args)` and
`report(result)`.

Every path option is checked before any work: an output (--json, --checkpoint) must name a file
that can be written (not "", not a folder or a name ending in a separator, in a folder that
exists), an input (--resume, --vllm-cubin) a file that can be read. Counts are integers in
[1, MAX_COUNT]; numbers finite.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

from kvlab.bench.env import write_json
from kvlab.checks import MAX_BLOCK_SIZE, check_block_size
from kvlab.config import MAX_AHEAD_BYTES, MODELS
from kvlab.kernels import FAMILIES
from kvlab.kernels.prefetch import MAX_DISTANCE, MODES, PrefetchConfig
from kvlab.offload.scheduler import MODELS_OF_TIME, SCHEDULES, WEIGHTS
from kvlab.profile import paper
from kvlab.profile.ncu import DEFAULT_TIMEOUT_S
from kvlab.workload import mixed_spec

PROG = "python -m kvlab"
PAPER_PREFETCH = "bulk K+V d=1"  # the paper's Algorithm 1: the next tile, one warp stride ahead
# What `bench kvpr` times at each point: KVPR's split under each model of time, and the two ends.
KVPR_SETTINGS = (*(f"kvpr-{m}" for m in MODELS_OF_TIME), "full-transfer", "full-recompute")
FLASHINFER = ("flashinfer", "flashinfer_tc")  # FlashInfer's decode: CUDA cores, tensor cores
MAX_COUNT = 2**31 - 1  # the kernels count tokens, blocks and sequences in int32
# seconds per profiled launch: an ncu run of N launches waits N times this in poll(), whose
# timeout in ms must fit an int32 (24.8 days): an hour each keeps up to 596 launches in range
MAX_TIMEOUT_S = 3600.0
NAME_MAX = 255  # bytes of a file name, on Linux's file systems
OUTPUT_PATHS = ("json", "checkpoint")
INPUT_PATHS = ("resume", "vllm_cubin")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: `<prog>: error: <message>`, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= 1")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer in [1, {MAX_COUNT}]")
    return value


def ahead_bytes(text: str) -> int:
    """--ahead-bytes: kvlab.LLM's ahead_bytes, an integer in [0, MAX_AHEAD_BYTES]."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= MAX_AHEAD_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer in "
                                         f"[0, {MAX_AHEAD_BYTES}]")
    return value


def nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number >= 0")
    return value


def positive_float(text: str) -> float:
    value = nonnegative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number > 0")
    return value


def timeout_s(text: str) -> float:
    value = positive_float(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number in (0, {MAX_TIMEOUT_S:g}]")
    return value


def block_size(text: str) -> int:
    value = positive_int(text)
    try:
        check_block_size(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a power of two in "
                                         f"[1, {MAX_BLOCK_SIZE}]") from err
    return value


def distance(text: str) -> int:
    value = positive_int(text)
    if value > MAX_DISTANCE:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer in [1, {MAX_DISTANCE}]")
    return value


def batch_x_context(text: str) -> tuple[int, int]:
    """A BATCHxCONTEXT point, e.g. 16x1024."""
    parts = text.lower().split("x")
    try:
        batch, context = (positive_int(p) for p in parts)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{text!r}: must be BATCHxCONTEXT, e.g. 16x1024") from None
    return batch, context


def lengths_spec(text: str) -> str:
    """A batch of mixed lengths, `lognormal:MEAN,MAX` (kvlab.workload.lognormal_lengths, sigma 1,
    seed 0) or `production:MAX` (FlashInfer's production mix scaled to MAX,
    kvlab.workload.production_lengths), returned as given after checking it."""
    try:
        mixed_spec(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _add_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")


# `bench attention`'s options and their defaults: the CLI's, and those of the keyword entry
# point kvlab.bench.attention.measure.
ATTENTION_DEFAULTS = {
    "models": ("llama2-7b", "llama3-8b", "qwen2.5-7b", "qwen2.5-14b"),
    "batches": (1, 16, 64, 128), "contexts": (1024, 4096, 8192, 32768), "lengths": None,
    "points": None, "block_sizes": (16,), "prefetch": MODES, "distances": (1, 2, 4),
    "evict_last": False, "kernels": (*FAMILIES, "sdpa"), "runs": 25, "vllm_cubin": None,
    "fp8": False, "in_order": False, "dtype": "float16", "sms": None, "checkpoint": None}


def command_line(name: str, options: dict) -> str:
    """The command line `python -m kvlab bench <name> ...` that `parse` turns into `options`
    (keyword options, as the benchmarks' entry points take them; None and False leave a flag
    out, True gives a store_true flag, a (batch, context) pair is BATCHxCONTEXT)."""
    argv = ["bench", name]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *(f"{v[0]}x{v[1]}" if isinstance(v, (list, tuple)) else str(v)
                             for v in value)]
        else:
            argv += [flag, str(value)]
    return f"{PROG} " + shlex.join(argv)


def _add_attention(parser: argparse.ArgumentParser) -> None:
    default = {k: list(v) if isinstance(v, tuple) else v for k, v in ATTENTION_DEFAULTS.items()}
    parser.add_argument("--models", nargs="+", default=default["models"], choices=list(MODELS),
                        metavar="MODEL", help=f"one or more of {', '.join(MODELS)}")
    parser.add_argument("--batches", nargs="+", type=positive_int, default=default["batches"])
    parser.add_argument("--contexts", nargs="+", type=positive_int,
                        default=default["contexts"])
    parser.add_argument("--lengths", nargs="+", type=lengths_spec, metavar="SPEC",
                        help="batches of mixed lengths instead of --contexts: lognormal:MEAN,MAX "
                             "(sigma 1, seed 0) or production:MAX (FlashInfer's production mix "
                             "scaled to MAX) per --batches size; kernels only, no SDPA")
    parser.add_argument("--points", nargs="+", type=batch_x_context, metavar="BATCHxCONTEXT",
                        help="time these points instead of every --batches x --contexts")
    parser.add_argument("--block-sizes", nargs="+", type=block_size,
                        default=default["block_sizes"],
                        help="one loop of timings per block size at each point")
    parser.add_argument("--prefetch", nargs="+", default=default["prefetch"], choices=MODES)
    parser.add_argument("--distances", nargs="+", type=distance, default=default["distances"])
    parser.add_argument("--evict-last", action="store_true",
                        help="also time each prefetch setting with the evict-last L2 policy")
    parser.add_argument("--kernels", nargs="+", default=default["kernels"],
                        choices=[*FAMILIES, "sdpa", "auto", "read", *FLASHINFER],
                        help="'flashinfer', 'flashinfer_tc': FlashInfer's paged decode (CUDA "
                             "cores; tensor cores) on gqa's cache (pip install flashinfer-python); "
                             "'auto' also times kernel='auto' on each family's cache: tuned at "
                             "the point, tuned at another shape of its bucket, and with "
                             "KVLAB_AUTOTUNE=0; 'read', a plain read of the point's K/V bytes "
                             "from one buffer (the bound at that size)")
    parser.add_argument("--runs", type=positive_int, default=default["runs"],
                        help="timed runs per variant (median)")
    parser.add_argument("--vllm-cubin", metavar="PATH",
                        help="also time vLLM's own kernels from this cubin (built by "
                             "benchmarks/vllm_cubin.sh from a vLLM source tree) on vllm_v1's "
                             "cache, in the same loop (kernel 'vllm_own'; fp16, head_dim 128)")
    parser.add_argument("--fp8", action="store_true",
                        help="also time gqa on an fp8 (e4m3) cache of the same shape, in the same "
                             "loop (kernel 'gqa_fp8')")
    parser.add_argument("--in-order", action="store_true",
                        help="also time each family without prefetch on a cache whose blocks lie "
                             "in order, as from a fresh pool, in the same loop (kernels "
                             "'vllm_v1_in_order', 'gqa_in_order'); the others read blocks "
                             "scattered over the pool")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"],
                        help="of q, out, the caches (but an fp8 one) and SDPA's K/V")
    parser.add_argument("--sms", nargs="+", type=positive_int, metavar="N",
                        help="one loop per SM count at each point, on a CUDA green context of N "
                             "SMs (default: the whole GPU)")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rewrite the result so far as JSON after every point")


def _add_kvpr(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=["opt-6.7b", "opt-13b", "opt-30b",
                                                        "llama2-7b", "llama3-8b"],
                        choices=list(MODELS), metavar="MODEL",
                        help=f"one or more of {', '.join(MODELS)}")
    parser.add_argument("--batches", nargs="+", type=positive_int, default=[8, 16, 32, 64])
    parser.add_argument("--contexts", nargs="+", type=positive_int,
                        default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--points", nargs="+", type=batch_x_context, metavar="BATCHxCONTEXT",
                        help="measure these points instead of every --batches x --contexts")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    parser.add_argument("--gpu-batches", nargs="+", type=positive_int, default=[1, 4],
                        help="GPU batches the batch is split into (column runs only with 2+: "
                             "with one it is the row schedule)")
    parser.add_argument("--weights", nargs="+", default=["resident"], choices=WEIGHTS)
    parser.add_argument("--steps", type=positive_int, default=10,
                        help="timed decode steps per setting, after the warm-up")
    parser.add_argument("--min-seconds", type=nonnegative_float, default=0.5,
                        help="time more steps where --steps would time a setting for less than "
                             "this")
    parser.add_argument("--chunks", type=positive_int, default=1,
                        help="X chunks per layer (each costs the host some 6 CUDA calls)")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="replay each layer's work around the attention as CUDA graphs "
                             "(--no-cuda-graphs: enqueue it eagerly)")
    parser.add_argument("--hf", action="store_true",
                        help="also time HF's offloaded cache (row schedule, resident weights), "
                             "in turn with the other settings")
    parser.add_argument("--hf-max-tokens", type=positive_int, default=16384,
                        help="time HF only where batch x context is at most this")
    parser.add_argument("--timeline-setting", default="kvpr-pipelined", choices=KVPR_SETTINGS)
    parser.add_argument("--timeline-points", nargs="*", type=batch_x_context,
                        default=[(16, 1024)], metavar="BATCHxCONTEXT",
                        help="points whose timelines are kept")
    parser.add_argument("--host-budget-gib", type=positive_float, default=100.0,
                        help="skip points whose pinned host memory would be larger")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rewrite the result so far as JSON after every point")
    parser.add_argument("--resume", metavar="PATH",
                        help="continue the result or checkpoint at PATH, made by the same "
                             "committed code on the same GPU: keep its rows, measure only the "
                             "points it lacks")


def prefetch_label(text: str) -> str:
    """A PrefetchConfig label of a prefetch setting (not "none"), e.g. 'bulk K+V d=1'."""
    try:
        enabled = PrefetchConfig.from_label(text).enabled
    except ValueError:
        enabled = None
    if not enabled:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a prefetch setting's label like "
                                         f"'{PAPER_PREFETCH}' ('none' is always profiled)")
    return text


def _add_counters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(paper.MODELS), choices=list(MODELS),
                        metavar="MODEL", help=f"one or more of {', '.join(MODELS)} (default: "
                                              "the paper's four)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--prefetch", nargs="+", type=prefetch_label, default=[PAPER_PREFETCH],
                        metavar="LABEL", help="prefetch settings profiled beside 'none' "
                                              f"(default: the paper's, '{PAPER_PREFETCH}')")
    parser.add_argument("--points", nargs="+", type=batch_x_context,
                        default=[(16, 4096), (64, 4096)], metavar="BATCHxCONTEXT",
                        help="the paper states none for its Table 5.2")
    parser.add_argument("--block-size", type=block_size, default=16,
                        help="tokens per cache block (the paper's: 16)")
    parser.add_argument("--sms", nargs="+", type=positive_int, metavar="N",
                        help="profile on a CUDA green context of N SMs, for each N (78: the "
                             "H20's count; default: the whole GPU)")
    parser.add_argument("--timeout", type=timeout_s, default=DEFAULT_TIMEOUT_S,
                        help="seconds per profiled launch, at most "
                             f"{MAX_TIMEOUT_S:g} (an ncu run of N launches gets N times this, its "
                             "profiled process included); killed past it")


def _add_timeline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=["llama2-7b", "llama3-8b", "qwen2.5-7b",
                                                        "qwen2.5-14b"], choices=list(MODELS),
                        metavar="MODEL", help=f"one or more of {', '.join(MODELS)}")
    parser.add_argument("--points", nargs="+", type=batch_x_context, metavar="BATCHxCONTEXT",
                        help="default: 1x32768 1x8192 16x1024 16x4096")
    parser.add_argument("--lengths", nargs="+", type=lengths_spec, metavar="SPEC",
                        help="batches of mixed lengths instead of --points: lognormal:MEAN,MAX "
                             "(sigma 1, seed 0) or production:MAX per --batches size")
    parser.add_argument("--batches", nargs="+", type=positive_int,
                        help="the sizes of the --lengths batches (default: 16 64)")
    parser.add_argument("--runs", type=positive_int, default=25,
                        help="timed runs of gqa and of the read per point (median)")
    parser.add_argument("--traces", type=positive_int, default=7,
                        help="traced steps of each per point (their phases' medians are kept)")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rewrite the result so far as JSON after every point")


# name -> (module, how to add its options, what it measures)
def _add_whole_models(parser: argparse.ArgumentParser, new_tokens: int, what: str) -> None:
    """The options of a benchmark of whole models decoding: models, batches, prompt tokens and
    new tokens (default `new_tokens`, "tokens decoded per request" `what`)."""
    parser.add_argument("--models", nargs="+", default=["llama2-7b", "llama3-8b", "qwen2.5-7b",
                                                        "qwen2.5-14b"], choices=list(MODELS),
                        metavar="MODEL", help=f"one or more of {', '.join(MODELS)}")
    parser.add_argument("--batches", nargs="+", type=positive_int, default=[1, 16, 64, 128])
    parser.add_argument("--prompt", type=positive_int, default=512, help="prompt tokens")
    parser.add_argument("--new-tokens", type=positive_int, default=new_tokens,
                        help=f"tokens decoded per request{what}")


def _add_e2e(parser: argparse.ArgumentParser) -> None:
    from kvlab.bench.e2e import AHEAD_VARIANTS, VARIANTS

    _add_whole_models(parser, 256, "")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        help="attention kernels (+prefetch: the paper's bulk L2 prefetch, d=1; "
                             "+ahead: the cross-kernel prefetch, kvlab.LLM's ahead_bytes)")
    parser.add_argument("--ahead-bytes", type=ahead_bytes, metavar="BYTES",
                        help="the +ahead variants' ahead_bytes (default: one kernel's overhead "
                             "at the run's copy roofline, kvlab.predict.step.ahead_size)")
    parser.add_argument("--rounds", type=positive_int, default=2,
                        help="generate runs of each variant per batch, the variants in turn")
    parser.add_argument("--tp", type=positive_int, default=1,
                        help="tensor parallel over this many GPUs (under torchrun "
                             "--nproc-per-node N); no HF peer")
    parser.add_argument("--no-hf", dest="hf", action="store_false",
                        help="leave out HF transformers' generate with the static cache")
    parser.add_argument("--hf-compile", default="on", choices=["on", "off", "both"],
                        help="HF's decode step torch.compiled (on: HF's default, variant "
                             "hf-static), not (off: hf-static-eager), or both in turn; "
                             "compilation falls in an untimed warm-up run")
    parser.add_argument("--async-decode", action=argparse.BooleanOptionalAction, default=True,
                        help="queue each decode step before the previous step's tokens reach "
                             "the host (kvlab.LLM's async_decode; --no-async-decode: wait for "
                             "them)")
    parser.add_argument("--serve-rates", nargs="*", type=positive_float, default=[],
                        metavar="RATE", help="a serving run per rate (requests/s, Poisson)")
    parser.add_argument("--serve-requests", type=positive_int, default=512)
    parser.add_argument("--serve-variant", default="gqa",
                        choices=[v for v in VARIANTS if v not in AHEAD_VARIANTS])
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rewrite the result so far as JSON after every (model, batch) point "
                             "and serving rate")


def _add_steptrace(parser: argparse.ArgumentParser) -> None:
    _add_whole_models(parser, 32, " in the traced generate call")
    parser.add_argument("--steps", type=positive_int, default=8,
                        help="the last decode steps of the trace that are kept")
    parser.add_argument("--ahead-bytes", nargs="+", type=ahead_bytes, default=[0],
                        metavar="BYTES", help="trace each point once per size (kvlab.LLM's "
                                              "ahead_bytes; 0: without), in turn")
    parser.add_argument("--ahead-kv-bytes", nargs="+", type=ahead_bytes, default=[0],
                        metavar="BYTES", help="trace each point once per size of the K/V "
                                              "blocks' prefetch too (kvlab.LLM's "
                                              "ahead_kv_bytes; 0: without), each "
                                              "with each --ahead-bytes; a size > 0 runs only "
                                              "at batches of at most layer_ops.LINEAR_ROWS")
    parser.add_argument("--counters", action="store_true",
                        help="also profile one step at each point and size with Nsight Compute "
                             "(every kernel's L2 load hits; kvlab.bench.stepcounters)")
    parser.add_argument("--timeout", type=timeout_s, default=DEFAULT_TIMEOUT_S,
                        help="seconds for each ncu run with --counters")


BENCHMARKS = {
    "cache": ("kvlab.bench.cache", _add_cache, "the block pool on one CPU core"),
    "attention": ("kvlab.bench.attention", _add_attention,
                  "decode-attention kernels, prefetch settings and SDPA (GPU)"),
    "kvpr": ("kvlab.bench.kvpr", _add_kvpr,
             "KVPR decode steps against full transfer, full recompute and HF (GPU)"),
    "l2sim": ("kvlab.bench.l2sim", _add_cache, "the L2 model's speed on one CPU core"),
    "counters": ("kvlab.bench.counters", _add_counters,
                 "ncu counters beside the L2-prefetch paper's Table 5.2 (GPU, Nsight Compute)"),
    "timeline": ("kvlab.bench.timeline", _add_timeline,
                 "where a gqa decode step's time goes, CTA by CTA, beside a plain read (GPU)"),
    "e2e": ("kvlab.bench.e2e", _add_e2e,
            "decode throughput of whole models on kvlab.LLM beside HF's static cache (GPU)"),
    "steptrace": ("kvlab.bench.steptrace", _add_steptrace,
                  "one decode step of kvlab.LLM traced kernel by kernel, its gaps beside the "
                  "modelled idle budget (GPU)"),
}


def parser() -> Parser:
    """The whole command line."""
    top = Parser(prog=PROG)
    commands = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    bench = commands.add_parser("bench", help="run a benchmark headless and print its report")
    names = bench.add_subparsers(dest="name", required=True, parser_class=Parser)
    for name, (_, add_options, what) in BENCHMARKS.items():
        sub = names.add_parser(name, help=what, description=f"Benchmark: {what}.")
        sub.add_argument("--json", metavar="PATH", help="also write the full result as JSON")
        add_options(sub)
    return top


def refuse(name: str, message: str):
    """End `python -m kvlab bench <name>` with one line and exit status 2."""
    Parser(prog=f"{PROG} bench {name}").error(message)


def check_writable(option: str, path: str) -> None:
    """Raise ValueError unless a file can be written at `path` (before the benchmark runs): not
    "", not a folder nor a name ending in a separator, a name of at most NAME_MAX bytes, in a
    folder that exists (for a link, the folder of what it names), where a new file (or the file
    there) can be written."""
    where = f"{option} {shlex.quote(path)}"
    if not path or "\0" in path:
        raise ValueError(f"{where}: must be a file path")
    if os.path.isdir(path):
        raise ValueError(f"{where}: is a folder, must be a file path")
    if path.endswith((os.sep, os.altsep or os.sep)):
        raise ValueError(f"{where}: ends in a separator, must be a file path")
    folder = os.path.dirname(os.path.realpath(path))  # a link's: where the file is written
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise ValueError(f"{where}: the folder {folder} {what}")
    if len(os.fsencode(os.path.basename(path))) > NAME_MAX:
        raise ValueError(f"{where}: the file name is longer than {NAME_MAX} bytes")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise ValueError(f"{where}: not writable")


def check_readable(option: str, path: str) -> None:
    """Raise ValueError unless `path` is a file that can be read."""
    where = f"{option} {shlex.quote(path)}"
    if not path or "\0" in path or not os.path.isfile(path):
        raise ValueError(f"{where}: no such file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{where}: not readable")


def parse(argv: list[str]) -> argparse.Namespace:
    """The options of `python -m kvlab <argv>`, checked as `main` checks them (SystemExit 2 on a
    bad value, every path included), with `command` set to the whole command line."""
    args = parser().parse_args(argv)
    for options, check in ((OUTPUT_PATHS, check_writable), (INPUT_PATHS, check_readable)):
        for option in options:
            path = getattr(args, option, None)
            if path is not None:
                try:
                    check(f"--{option.replace('_', '-')}", path)
                except ValueError as err:
                    refuse(args.name, str(err))
    args.command = f"{PROG} " + shlex.join(argv)  # quoted: labels like 'bulk K+V d=1' have spaces
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    module = importlib.import_module(BENCHMARKS[args.name][0])
    try:
        module.check(args)
    except ValueError as err:
        refuse(args.name, str(err))
    result = module.run(args)
    if result is None:  # a tensor-parallel rank but the first: rank 0 reports
        return 0
    result["command"] = args.command
    print(module.report(result))
    if args.json is not None:
        write_json(args.json, result, indent=2)
    return 0
