"""What the L2 model replays: one decode step's shape, launch plan and block placement
(TraceSpec), and the order in which the GPU's CTA slots run the CTAs' loop iterations.

Scheduling (an assumption): num_sms * ctas_per_sm slots take CTAs in launch order; resident CTAs
take turns in slot order, one loop iteration (vllm_v1: 4 blocks of K or of V; gqa: one tile of
64 tokens, or of 128 with 8 warps) per turn, and a finished CTA's slot takes the next CTA at
once. All slots take their turns in lockstep rounds (each CTA shifted by its phase, below).
Time (an assumption): a round is one turn of every active slot, about one loop iteration's time;
rounds count from 0. Phase (an assumption, JITTER_ROUNDS): CTAs on different SMs are not in
lockstep, so CTA c's iteration of round r happens at r + phase[c], phase[c] drawn once per CTA,
uniform in [0, jitter_rounds), with `seed`; jitter_rounds = 0 puts every request of a round at its
number (lockstep). jitter_rounds <= 1 keeps a CTA's round r before its round r + 1 and a slot's
CTA before the next one it takes.
Memory: a trace holds the block table, the schedule and the CTA slots at once; TraceSpec refuses
a shape whose arrays would pass MAX_TRACE_BYTES at their peak (`TraceSpec.trace_bytes`).
The functions of a spec raise ValueError for anything but a TraceSpec.
"""

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

import numba
import numpy as np

from kvlab.arith import ceil_div
from kvlab.checks import check_head_dim, check_int, check_num_heads
from kvlab.kernels import FAMILIES, KERNEL_FAMILIES
from kvlab.kernels.geometry import (
    GQA_NUM_WARPS,
    GQA_WARP_TOKENS,
    VLLM_NUM_WARPS,
)
from kvlab.kernels.prefetch import PrefetchConfig

PLACEMENTS = ("random", "contiguous")
DTYPE_BYTES = (1, 2, 4)  # the kernels are 16-bit; other sizes are a what-if of the same loops
# ASSUMPTION, to calibrate against ncu: nothing keeps CTAs on different SMs in step (launch
# stagger, DRAM queueing), so a CTA's phase within a loop iteration is taken as unknown: uniform
# over a whole round. 0 is the lockstep model.
JITTER_ROUNDS = 1.0
_PHASE_STREAM = 1  # the phases' random stream, apart from the placement's (stream 0)
_PHASE_BITS = 20  # phases are multiples of 2^-20 rounds (see cta_phases)
# The trace's arrays at their peak (measured with tracemalloc): the block table, an int64 a block,
# twice while the placement is drawn; the schedule, two int64 and a float64 a CTA iteration,
# sorted by time through copies (64 bytes); two int64 a CTA slot.
MAX_TRACE_BYTES = 512 * 2**20
_BLOCK_BYTES = 16
_ITERATION_BYTES = 64
_SLOT_BYTES = 16


@dataclass(frozen=True, kw_only=True)
class TraceSpec:
    """One decode step of one layer: the shape, the kernel's launch plan and the block placement.

    family: "vllm_v1" or "gqa". context: tokens of every sequence. dtype_bytes: 1, 2 or 4.
    partition_size: tokens per CTA, 0 for whole sequences; the kernels' planners pick it
        (vllm_v1: 0 or 512, see kvlab.kernels.vllm_v1.use_partitions; gqa: gqa.split_plan).
    num_sms, ctas_per_sm: the CTA slots (gqa: kvlab.kernels.gqa.ctas_per_sm(head_dim, 2, warps)).
    warps: gqa's warps per CTA, 4 or 8 (gqa.split_plan picks them); vllm_v1 runs 4.
    placement: "random" (physical blocks a permutation drawn with `seed`) or "contiguous"
        (sequence s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq)).
    jitter_rounds: a number in [0, 1], the spread of the CTAs' phases in rounds (see the module
        docstring); 0: all slots in lockstep.
    Raises ValueError for a bad field, naming it, and for a shape whose trace would take more
    than MAX_TRACE_BYTES (`trace_bytes`), naming the fields that make it, before any allocation.
    """

    family: str
    num_seqs: int
    context: int
    num_qo_heads: int
    num_kv_heads: int
    partition_size: int
    ctas_per_sm: int
    head_dim: int = 128
    block_size: int = 16
    dtype_bytes: int = 2
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    num_sms: int = 132  # the H200
    placement: str = "random"
    seed: int = 0
    jitter_rounds: float = JITTER_ROUNDS
    warps: int = GQA_NUM_WARPS

    def __post_init__(self):
        _check_choice("family", self.family, FAMILIES)
        for name in ("num_seqs", "context", "block_size", "dtype_bytes", "ctas_per_sm",
                     "num_sms", "warps"):
            check_int(name, getattr(self, name), 1)
        check_int("partition_size", self.partition_size, 0)
        check_int("seed", self.seed, 0)
        check_num_heads(self.num_qo_heads, self.num_kv_heads)
        check_head_dim(self.head_dim)
        family = KERNEL_FAMILIES[self.family]
        _check_choice("block_size", self.block_size, family.block_sizes, self.family)
        _check_choice("dtype_bytes", self.dtype_bytes, DTYPE_BYTES)
        _check_choice("placement", self.placement, PLACEMENTS)
        if (isinstance(self.jitter_rounds, bool) or not isinstance(self.jitter_rounds, Real)
                or not 0 <= self.jitter_rounds <= 1 or math.isnan(self.jitter_rounds)):
            raise ValueError(f"jitter_rounds={self.jitter_rounds!r}: must be a number in [0, 1] "
                             f"(a CTA's phase stays within one round)")
        if family.max_group is not None and (
                self.num_qo_heads > family.max_group * self.num_kv_heads):
            raise ValueError(f"num_qo_heads={self.num_qo_heads}: must be at most "
                             f"{family.max_group} x num_kv_heads={self.num_kv_heads} for "
                             f"{family.name}")
        _check_choice("warps", self.warps, (VLLM_NUM_WARPS,) if self.family == "vllm_v1"
                      else (GQA_NUM_WARPS, 8), self.family)
        quantum = self.block_size if self.family == "vllm_v1" else self.tile_tokens
        if self.partition_size % quantum:
            raise ValueError(f"partition_size={self.partition_size}: must be 0 or a multiple "
                             f"of {quantum} for {self.family}")
        if not isinstance(self.prefetch, PrefetchConfig) or self.prefetch.evict_last:
            raise ValueError(f"prefetch={self.prefetch!r}: must be a PrefetchConfig without "
                             f"evict_last (not modelled)")
        for name in ("num_seqs", "context", "num_qo_heads", "num_kv_heads", "partition_size",
                     "ctas_per_sm", "head_dim", "block_size", "dtype_bytes", "num_sms", "seed",
                     "warps"):
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy ints become ints
        object.__setattr__(self, "jitter_rounds", float(self.jitter_rounds))
        self._check_trace_bytes()

    def _check_trace_bytes(self) -> None:
        if self.trace_bytes <= MAX_TRACE_BYTES:
            return
        slots = self.num_sms * self.ctas_per_sm
        shape = (f"num_sms={self.num_sms} x ctas_per_sm={self.ctas_per_sm}"
                 if _SLOT_BYTES * slots > self.trace_bytes // 2
                 else f"num_seqs={self.num_seqs}, context={self.context}")
        raise ValueError(
            f"{shape}: the trace ({self.num_iterations:,} CTA iterations of "
            f"{self.num_seqs * self.blocks_per_seq:,} blocks on {slots:,} CTA slots) would take "
            f"{self.trace_bytes / 2**20:,.0f} MiB, more than MAX_TRACE_BYTES = "
            f"{MAX_TRACE_BYTES // 2**20} MiB: model fewer or shorter sequences")

    @property
    def blocks_per_seq(self) -> int:
        return ceil_div(self.context, self.block_size)

    @property
    def num_partitions(self) -> int:
        return ceil_div(self.context, self.partition_size) if self.partition_size else 1

    @property
    def cta_tokens(self) -> int:
        """Tokens one CTA covers (the last partition may have fewer)."""
        return self.partition_size if self.num_partitions > 1 else self.context

    @property
    def num_ctas(self) -> int:
        heads = self.num_qo_heads if self.family == "vllm_v1" else self.num_kv_heads
        return self.num_seqs * heads * self.num_partitions

    @property
    def num_iterations(self) -> int:
        """CTA iterations of the launch, `iterations_per_cta(self).sum()` (counted, not built)."""
        last = self.context - (self.num_partitions - 1) * self.cta_tokens
        per_row = ((self.num_partitions - 1) * _cta_iterations(self, self.cta_tokens)
                   + _cta_iterations(self, last))  # one (sequence, head)'s partitions
        return self.num_ctas // self.num_partitions * per_row

    @property
    def trace_bytes(self) -> int:
        """Bytes the trace's arrays take at their peak (see MAX_TRACE_BYTES)."""
        return (_BLOCK_BYTES * self.num_seqs * self.blocks_per_seq
                + _ITERATION_BYTES * self.num_iterations
                + _SLOT_BYTES * self.num_sms * self.ctas_per_sm)

    @property
    def load_bytes(self) -> int:
        """Bytes the launch's loads ask for, K and V: vllm_v1 reads whole blocks once a query
        head, gqa the context's rows once a KV head."""
        if self.family == "vllm_v1":
            return 2 * self.num_seqs * self.num_qo_heads * self.blocks_per_seq * self.tile_bytes
        return (2 * self.num_seqs * self.num_kv_heads * self.context * self.head_dim
                * self.dtype_bytes)

    @property
    def tile_tokens(self) -> int:
        """gqa: tokens of one loop iteration, 16 a warp."""
        return GQA_WARP_TOKENS * self.warps

    @property
    def tile_bytes(self) -> int:
        """Bytes of one (block, KV head) tile of K (or of V)."""
        return self.block_size * self.head_dim * self.dtype_bytes

    @property
    def v_base(self) -> int:
        """Byte address of v_cache; k_cache starts at 0 (a pool of exactly the blocks used)."""
        return self.num_seqs * self.blocks_per_seq * self.num_kv_heads * self.tile_bytes


def check_spec(spec) -> None:
    """ValueError unless `spec` is a TraceSpec."""
    if not isinstance(spec, TraceSpec):
        raise ValueError(f"spec={spec!r}: must be a kvlab.sim.TraceSpec")


def _check_choice(name: str, value, allowed: tuple, family: str = "") -> None:
    if not isinstance(value, (str, Integral)) or value not in allowed:
        where = f" for {family}" if family else ""
        raise ValueError(f"{name}={value!r}: must be one of {allowed}{where}")


def block_tables(spec: TraceSpec) -> np.ndarray:
    """[num_seqs, blocks_per_seq] int64 physical block ids, as `spec.placement` says."""
    check_spec(spec)
    ids = np.arange(spec.num_seqs * spec.blocks_per_seq, dtype=np.int64)
    if spec.placement == "random":
        ids = np.random.default_rng(spec.seed).permutation(ids)
    return ids.reshape(spec.num_seqs, spec.blocks_per_seq)


def _cta_iterations(spec: TraceSpec, tokens):
    """Loop iterations of a CTA over `tokens` tokens (an int, or an int64 array)."""
    if spec.family == "vllm_v1":  # a K loop and a V loop
        return 2 * ceil_div(tokens, VLLM_NUM_WARPS * spec.block_size)
    return ceil_div(tokens, spec.tile_tokens)


def iterations_per_cta(spec: TraceSpec) -> np.ndarray:
    """[num_ctas] int64 loop iterations of each CTA, in launch order (0: returns at once)."""
    check_spec(spec)
    start = np.arange(spec.num_partitions) * spec.cta_tokens
    iterations = _cta_iterations(spec, np.minimum(start + spec.cta_tokens, spec.context) - start)
    if spec.family == "vllm_v1":  # partitions: grid z, slowest
        return np.repeat(iterations, spec.num_seqs * spec.num_qo_heads)
    return np.tile(iterations, spec.num_seqs * spec.num_kv_heads)


def cta_phases(spec: TraceSpec) -> np.ndarray:
    """[num_ctas] float64 phase (rounds) of each CTA, launch order: uniform in
    [0, spec.jitter_rounds), drawn with spec.seed (all 0.0 for jitter_rounds = 0)."""
    check_spec(spec)
    num_ctas = iterations_per_cta(spec).size
    rng = np.random.default_rng([spec.seed, _PHASE_STREAM])
    # NOTE: multiples of 2^-_PHASE_BITS, so that round + phase (+ a dyadic fill latency) is exact:
    # a CTA's prefetch issued `latency` rounds before its load lands exactly at the load's time
    steps = np.floor(rng.random(num_ctas) * spec.jitter_rounds * 2.0**_PHASE_BITS)
    return np.ldexp(steps, -_PHASE_BITS)


def timed_schedule(spec: TraceSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cta_ids, iterations, times), each [num_iterations]: the CTA iterations of `schedule`,
    each at round + phase of its CTA (cta_phases), in time order (ties in schedule order);
    int64, int64, float64."""
    check_spec(spec)
    cta_ids, iterations, round_starts = schedule(iterations_per_cta(spec),
                                                 spec.num_sms * spec.ctas_per_sm)
    rounds = np.repeat(np.arange(round_starts.size - 1, dtype=np.float64), np.diff(round_starts))
    if spec.jitter_rounds == 0:
        return cta_ids, iterations, rounds
    times = rounds + cta_phases(spec)[cta_ids]
    # NOTE: phases < 1 round keep every round's iterations before the next round's, so this
    # only reorders iterations within their round
    order = np.argsort(times, kind="stable")
    return cta_ids[order], iterations[order], times[order]


def schedule(steps, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cta_ids, iterations, round_starts): the CTA iterations in the order the slots take turns
    (see the module docstring), cta_ids and iterations each [steps.sum()] int64, and where each
    round begins in them, [num_rounds + 1] int64 (the last: steps.sum()).
    steps: [num_ctas] integers >= 0, iterations per CTA, launch order; num_slots: >= 1.
    Raises ValueError for bad arguments and, before any allocation, for a schedule whose arrays
    would take more than MAX_TRACE_BYTES."""
    array = np.asarray(steps)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"steps: dtype={array.dtype}, shape={array.shape}: must be a 1-D "
                         "integer array")
    if array.size and array.min() < 0:
        i = int(np.argmin(array))
        raise ValueError(f"steps[{i}]={array[i]}: must be >= 0")
    check_int("num_slots", num_slots, 1)
    total = float(array.sum(dtype=np.float64))  # no int64 overflow; exact enough for a limit
    longest = float(array.max()) if array.size else 0.0
    nbytes = 16 * total + 8 * (total / num_slots + longest) + _SLOT_BYTES * num_slots
    if nbytes > MAX_TRACE_BYTES:
        raise ValueError(f"steps: {total:,.0f} CTA iterations on num_slots={num_slots}: the "
                         f"schedule would take {nbytes / 2**20:,.0f} MiB, more than "
                         f"MAX_TRACE_BYTES = {MAX_TRACE_BYTES // 2**20} MiB")
    return _schedule(array.astype(np.int64), int(num_slots))


@numba.njit(cache=True)
def _schedule(steps, num_slots):
    cta_ids = np.empty(steps.sum(), dtype=np.int64)
    iterations = np.empty(steps.sum(), dtype=np.int64)
    # NOTE: while CTAs wait, a round is a turn of every slot (at most steps.sum() // num_slots
    # such rounds); after that come at most max(steps) rounds
    longest = steps.max() if steps.size else 0
    round_starts = np.empty(steps.sum() // num_slots + longest + 2, dtype=np.int64)
    slot_cta = np.full(num_slots, -1, dtype=np.int64)
    slot_iteration = np.zeros(num_slots, dtype=np.int64)
    next_cta, n, num_rounds = 0, 0, 0
    while True:
        for s in range(num_slots):
            if slot_cta[s] >= 0 and slot_iteration[s] == steps[slot_cta[s]]:
                slot_cta[s] = -1  # finished
            if slot_cta[s] < 0:
                while next_cta < steps.size and steps[next_cta] == 0:
                    next_cta += 1
                if next_cta < steps.size:
                    slot_cta[s], slot_iteration[s] = next_cta, 0
                    next_cta += 1
        round_starts[num_rounds] = n
        if slot_cta.max() < 0:
            return cta_ids, iterations, round_starts[:num_rounds + 1].copy()
        num_rounds += 1
        for s in range(num_slots):
            if slot_cta[s] >= 0:
                cta_ids[n], iterations[n] = slot_cta[s], slot_iteration[s]
                slot_iteration[s] += 1
                n += 1
