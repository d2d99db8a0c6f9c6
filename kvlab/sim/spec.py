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
"""

import math
from dataclasses import dataclass, field
from numbers import Real

import numba
import numpy as np

from kvlab.checks import check_head_dim, check_int, check_num_heads
from kvlab.kernels import FAMILIES
from kvlab.kernels.geometry import (
    FAMILY_BLOCK_SIZES,
    GQA_MAX_GROUP,
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
    Raises ValueError for a bad field, naming it.
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
        for name in ("num_seqs", "context", "block_size", "ctas_per_sm", "num_sms"):
            check_int(name, getattr(self, name), 1)
        check_int("partition_size", self.partition_size, 0)
        check_int("seed", self.seed, 0)
        check_num_heads(self.num_qo_heads, self.num_kv_heads)
        check_head_dim(self.head_dim)
        _check_choice("block_size", self.block_size, FAMILY_BLOCK_SIZES[self.family],
                      self.family)
        _check_choice("dtype_bytes", self.dtype_bytes, DTYPE_BYTES)
        _check_choice("placement", self.placement, PLACEMENTS)
        if (isinstance(self.jitter_rounds, bool) or not isinstance(self.jitter_rounds, Real)
                or not 0 <= self.jitter_rounds <= 1 or math.isnan(self.jitter_rounds)):
            raise ValueError(f"jitter_rounds={self.jitter_rounds!r}: must be a number in [0, 1] "
                             f"(a CTA's phase stays within one round)")
        if self.family == "gqa" and self.num_qo_heads > GQA_MAX_GROUP * self.num_kv_heads:
            raise ValueError(f"num_qo_heads={self.num_qo_heads}: must be at most "
                             f"{GQA_MAX_GROUP} x num_kv_heads={self.num_kv_heads} for gqa")
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
                     "ctas_per_sm", "head_dim", "block_size", "num_sms", "seed", "warps"):
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy ints become ints
        object.__setattr__(self, "jitter_rounds", float(self.jitter_rounds))

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.context // self.block_size)

    @property
    def num_partitions(self) -> int:
        return -(-self.context // self.partition_size) if self.partition_size else 1

    @property
    def cta_tokens(self) -> int:
        """Tokens one CTA covers (the last partition may have fewer)."""
        return self.partition_size if self.num_partitions > 1 else self.context

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


def _check_choice(name: str, value, allowed: tuple, family: str = "") -> None:
    if value not in allowed:
        where = f" for {family}" if family else ""
        raise ValueError(f"{name}={value!r}: must be one of {allowed}{where}")


def block_tables(spec: TraceSpec) -> np.ndarray:
    """[num_seqs, blocks_per_seq] int64 physical block ids, as `spec.placement` says."""
    ids = np.arange(spec.num_seqs * spec.blocks_per_seq, dtype=np.int64)
    if spec.placement == "random":
        ids = np.random.default_rng(spec.seed).permutation(ids)
    return ids.reshape(spec.num_seqs, spec.blocks_per_seq)


def iterations_per_cta(spec: TraceSpec) -> np.ndarray:
    """[num_ctas] int64 loop iterations of each CTA, in launch order (0: returns at once)."""
    start = np.arange(spec.num_partitions) * spec.cta_tokens
    tokens = np.minimum(start + spec.cta_tokens, spec.context) - start
    if spec.family == "vllm_v1":  # partitions: grid z, slowest; a K loop and a V loop
        iterations = 2 * -(-tokens // (VLLM_NUM_WARPS * spec.block_size))
        return np.repeat(iterations, spec.num_seqs * spec.num_qo_heads)
    return np.tile(-(-tokens // spec.tile_tokens), spec.num_seqs * spec.num_kv_heads)


def cta_phases(spec: TraceSpec) -> np.ndarray:
    """[num_ctas] float64 phase (rounds) of each CTA, launch order: uniform in
    [0, spec.jitter_rounds), drawn with spec.seed (all 0.0 for jitter_rounds = 0)."""
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


@numba.njit(cache=True)
def schedule(steps, num_slots):
    """(cta_ids, iterations, round_starts): the CTA iterations in the order the slots take turns
    (see the module docstring), cta_ids and iterations each [steps.sum()] int64, and where each
    round begins in them, [num_rounds + 1] int64 (the last: steps.sum()).
    steps: [num_ctas] iterations per CTA, launch order."""
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
