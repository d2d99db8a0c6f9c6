"""Nsight Compute on one decode step of kvlab.LLM: the L2 hits of each kernel's loads, with and
without the cross-kernel prefetch (`kvlab.LLM(ahead_bytes=..., ahead_kv_bytes=...)`).

`measure_step(spec)` runs one `ncu` on `python -m kvlab.bench.stepcounters '<StepSpec as
JSON>'` (`main`, the profiled process). That process makes kvlab.LLM (seeded random weights,
`gqa`, launched eagerly: under ncu a graph's kernels run one at a time anyway) and prefills
`batch` prompts of `prompt` seeded tokens (bench e2e's and steptrace's prompts). It runs one
decode step untimed (the kernels compile there), then a second between cudaProfilerStart and
cudaProfilerStop, and ncu (`--profile-from-start off`) profiles every kernel of that second
step. Two settings keep what one kernel leaves in L2 for the next, which the prefetch is about:

- `--cache-control none`: no flush before a kernel;
- `--replay-mode application`: each pass of the counters reruns the whole process, so no
  kernel is replayed on an L2 that it warmed itself.

The counters (STEP_METRICS) are ncu's loads' sectors asked of L2 and those that hit, in bytes,
DRAM's bytes read, and the duration. Each row also says whether the kernel is a GEMM of the
step (`is_gemm`: layer_ops' linear or cuBLAS's; cuBLAS's split-K reduction is not) and the
share of its loads' bytes that hit L2. ncu runs the kernels one after another, so every
prefetch has finished before the next kernel starts: the hits are what the prefetch brings
when it is in time, an upper bound of what it brings in the timed step. Whether ncu counts a
kernel's own bulk prefetches among its loads' sectors is not known here: a kernel's
l2_read_bytes with and without the prefetch tell (they would differ by its prefetched bytes).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass

from kvlab.checks import check_int, check_positive_int
from kvlab.config import MAX_AHEAD_BYTES, MODELS
from kvlab.profile.ncu import DEFAULT_TIMEOUT_S, METRICS, parse, run_ncu

STEP_METRICS = {column: METRICS[column] for column in (
    "l2_read_bytes", "l2_read_hit_bytes", "dram_read_bytes", "duration_us")}
# a step's GEMM kernels as ncu names them (the function's name, no namespace): layer_ops'
# `void linear<...>(...)`; cuBLAS's gemm and gemv kernels, and Hopper's nvjet ones
GEMM = re.compile(r"\blinear<|gemm|gemv|nvjet", re.IGNORECASE)
NOT_GEMM = re.compile(r"splitKreduce|reduce_kernel", re.IGNORECASE)  # cuBLAS's epilogues


@dataclass(frozen=True)
class StepSpec:
    """One decode step to profile: `batch` sequences of `prompt` prompt tokens of `model` (a
    kvlab.MODELS preset), with kvlab.LLM's ahead_bytes and ahead_kv_bytes. Raises ValueError
    for a field out of range."""

    model: str
    batch: int
    prompt: int
    ahead_bytes: int = 0
    ahead_kv_bytes: int = 0

    def __post_init__(self):
        if not isinstance(self.model, str) or self.model not in MODELS:
            raise ValueError(f"model={self.model!r}: must be one of {', '.join(MODELS)}")
        check_positive_int("batch", self.batch)
        check_int("prompt", self.prompt, 1, MODELS[self.model].max_position - 2)
        check_int("ahead_bytes", self.ahead_bytes, 0, MAX_AHEAD_BYTES)
        check_int("ahead_kv_bytes", self.ahead_kv_bytes, 0, MAX_AHEAD_BYTES)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StepSpec:
        fields = json.loads(text)
        if not isinstance(fields, dict) or set(fields) != {"model", "batch", "prompt",
                                                          "ahead_bytes", "ahead_kv_bytes"}:
            raise ValueError(f"{text!r}: must be a JSON object of model, batch, prompt, "
                             "ahead_bytes and ahead_kv_bytes")
        return cls(**fields)


def command(spec: StepSpec, ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles the kernels of one decode step of `spec`."""
    return [ncu, "--csv", "--page", "raw", "--print-units", "base",
            "--profile-from-start", "off", "--replay-mode", "application",
            "--cache-control", "none", "--clock-control", "none",
            "--metrics", ",".join(m for m, _ in STEP_METRICS.values()),
            sys.executable, "-m", "kvlab.bench.stepcounters", spec.to_json()]


def is_gemm(kernel_name: str) -> bool:
    """Whether ncu's kernel name is one of a step's GEMMs (layer_ops' linear, cuBLAS's GEMM or
    GEMV), not cuBLAS's split-K reduction (GEMM)."""
    return bool(GEMM.search(kernel_name)) and not NOT_GEMM.search(kernel_name)


def step_rows(text: str) -> list[dict]:
    """ncu's CSV of a step's kernels as rows: {"kernel_name", STEP_METRICS's columns,
    "is_gemm", "load_hit_share" (l2_read_hit_bytes over l2_read_bytes; None where it read
    nothing)}, in launch order. Raises CountersError as kvlab.profile.ncu.parse."""
    rows = parse(text, "a decode step's kernels", expected=None, metrics=STEP_METRICS)
    for row in rows:
        row["is_gemm"] = is_gemm(row["kernel_name"])
        read = row["l2_read_bytes"]
        row["load_hit_share"] = row["l2_read_hit_bytes"] / read if read else None
    return rows


def measure_step(spec: StepSpec, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 ncu: str = "ncu") -> list[dict]:
    """The counters of every kernel of one decode step of `spec` (`step_rows`). Raises
    ValueError for bad arguments, before anything runs, and CountersError (its `reason`) where
    ncu is missing, refuses the counters, runs past timeout_s or gives no rows."""
    if not isinstance(spec, StepSpec):
        raise ValueError(f"spec={spec!r}: must be a StepSpec")
    out, _ = run_ncu(lambda path: command(spec, path), timeout_s, ncu)
    return step_rows(out)


def main(argv: list[str] | None = None) -> int:
    """Profile-ready run of one decode step of argv[0] (a StepSpec as JSON); exit status 2 for
    a bad argument."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) != 1:
            raise ValueError(f"{len(argv)} arguments: expected one, a StepSpec as JSON")
        spec = StepSpec.from_json(argv[0])
    except (ValueError, TypeError) as err:
        print(f"python -m kvlab.bench.stepcounters: error: {err}", file=sys.stderr)
        return 2
    import torch

    import kvlab
    from kvlab.arith import ceil_div
    from kvlab.bench.e2e import random_prompts
    from kvlab.engine import forward

    llm = kvlab.LLM(spec.model, attention="gqa", cuda_graphs=False, ahead_bytes=spec.ahead_bytes,
                    ahead_kv_bytes=spec.ahead_kv_bytes,
                    num_blocks=spec.batch * ceil_div(spec.prompt + 2, 16) + 16)
    seqs = []
    for prompt in random_prompts(MODELS[spec.model], spec.batch, spec.prompt):
        alloc = llm.manager.add_sequence(len(prompt), prompt)
        seqs.append(alloc.seq_id)
        forward.prefill(llm.model, llm.weights, llm.caches, [alloc],
                        [torch.tensor(prompt, device=llm.device)], llm.rope)
    for profiled in (False, True):  # the first step compiles the kernels
        positions = [llm.manager.seq_len(s) for s in seqs]
        for seq in seqs:
            llm.manager.append(seq, 1, [0])
        slots = [llm.manager.slot_mapping(s, p, p + 1)[0]
                 for s, p in zip(seqs, positions, strict=True)]
        inputs = [torch.tensor(xs, device=llm.device) for xs in (slots, [0] * len(seqs),
                                                                 positions)]
        torch.cuda.synchronize()
        if profiled:
            torch.cuda.cudart().cudaProfilerStart()
        attend, kv_ahead = llm.runner.step_attention(seqs)
        forward.decode_step(llm.model, llm.weights, llm.caches, [], *inputs, attend, llm.rope,
                            ahead_bytes=llm.ahead_bytes, kv_ahead=kv_ahead)
        torch.cuda.synchronize()
        if profiled:
            torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
