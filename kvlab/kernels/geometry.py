"""The decode kernels' geometry and split policies, in Python and numpy (no torch, no CuPy):
what the launchers (`vllm_v1`, `gqa`) plan with, and what the L2 model (`kvlab.sim`) and the
profiler's specs need on machines without a GPU. The CUDA sources state the same numbers in
their headers.
"""

import heapq
import math
from typing import NamedTuple

import numpy as np

from kvlab.arith import ceil_div
from kvlab.checks import check_int, check_positive_int, is_int

MAX_GRID_YZ = 65535  # CUDA: the largest y or z dimension of a launch grid
MAX_SEQ_LEN = 2**31 - 1  # the kernels hold lengths and token indices in int32

# vllm_v1 (kernels/paged_decode_vllm.cu; its block sizes and groups: kvlab.kernels.families)
VLLM_NUM_WARPS = 4  # 128 threads per CTA
PARTITION_SIZE = 512  # tokens per CTA of v2
MAX_V1_SEQ_LEN = 8192  # like vLLM: v1 only up to this many tokens
V1_MIN_CTAS = 512  # like vLLM: a split v1 batch runs v1 only above this many (sequence, head) CTAs
# CTAs an H200 SM holds (registers, at head_dim 128, block 16): 5, v1 and v2, with or without
# prefetch (88-96 registers a thread; the launch bounds ask for 5), as vLLM's own build holds
# both (96 registers a thread: vLLM 0.9.2's source by nvcc 13 for sm_90, and its CUDA 12.8 wheel)
VLLM_CTAS_PER_SM = 5

# gqa (kernels/paged_decode_gqa.cu; its block sizes and groups: kvlab.kernels.families)
GQA_NUM_WARPS = 4  # warps of a CTA, unless split_plan picks 8
GQA_WARP_TOKENS = 16  # rows of a tile owned by one warp
PARTITION_QUANTUM = 256  # gqa partition sizes are multiples of this many tokens
PARTITION_OVERHEAD_TOKENS = 128  # a CTA's fixed cost (prologue, pipeline fill, epilogue), in tokens
MERGE_OVERHEAD_TOKENS = 256  # the merge launch's cost, in tokens of one CTA
# mixed lengths, in tokens of one slot (a CTA's share of its SM): a CTA's fixed cost, the merge's
MIXED_CTA_OVERHEAD_TOKENS = 256
MIXED_MERGE_OVERHEAD_TOKENS = 768
# Read rates of gqa_decode on the H200 (fp16, head_dim 128: 512 bytes of K and V a token), taken
# on a green context of 32 SMs, where HBM is not the limit: one CTA alone on an SM, and two CTAs
# an SM. In tokens, not bytes: a lone CTA is bound by the tokens it handles, so on an fp8 cache
# (256 bytes a token) it reads about as many tokens and half the bytes, and lone fp8 CTAs leave
# HBM idle where fp16's do not (`lone_cta_slowdown`). The two rates come from a probe that no
# result file keeps; these constants are their one copy.
HBM_GBPS = 4280.0  # the copy roofline of the whole GPU
LONE_CTA_TOKENS_PER_S = 86e6
SM_TOKENS_PER_S = 113e6
# What a lone CTA of 8 warps reaches of its share of HBM where HBM is the limit: mid-way in the
# range of shares that choose alike in two unrecorded probes of plans with and without 8 warps
LONE_CTA_HBM_SHARE = 0.9
# 8 warps only for partitions of at least 4 tiles a warp: below, a warp's stages hold its whole
# share (not timed lone)
EIGHT_WARP_MIN_TOKENS = 512
SM_SHARED_BYTES = 228 * 1024  # shared memory per SM on Hopper (H100, H200)
CTA_RESERVED_SHARED_BYTES = 1024  # what the driver reserves per resident CTA


def check_launch(kernel: str, num_seqs: int, max_seq_len: int) -> None:
    """ValueError unless one launch of `kernel` ("vllm_v1" or "gqa") decodes `num_seqs`
    sequences of up to `max_seq_len` tokens: both kernels lay the sequences along a grid
    dimension of at most MAX_GRID_YZ, and vllm_v1 its partitions of PARTITION_SIZE tokens too."""
    check_int("num_seqs", num_seqs, 1)
    if num_seqs > MAX_GRID_YZ:
        raise ValueError(f"num_seqs={num_seqs}: the kernels decode at most {MAX_GRID_YZ} "
                         "sequences a launch (a grid dimension)")
    longest = MAX_GRID_YZ * PARTITION_SIZE if kernel == "vllm_v1" else MAX_SEQ_LEN
    if not is_int(max_seq_len) or not 1 <= max_seq_len <= longest:
        raise ValueError(f"max_seq_len={max_seq_len!r}: kernel={kernel!r} runs sequences of 1 "
                         f"to {longest} tokens")


def use_partitions(num_seqs: int, num_qo_heads: int, max_seq_len: int) -> bool:
    """Whether vllm_v1 runs v2 (PARTITION_SIZE-token CTAs and a reduce), by vLLM's own rule: v1
    when max_seq_len <= MAX_V1_SEQ_LEN and either one partition covers the longest sequence or
    the batch has more than V1_MIN_CTAS (sequence, query head) pairs. The rule does not look at
    the SMs: under a green context vLLM's choice stays what it is on the whole GPU."""
    num_partitions = ceil_div(max_seq_len, PARTITION_SIZE)
    use_v1 = max_seq_len <= MAX_V1_SEQ_LEN and (
        num_partitions == 1 or num_seqs * num_qo_heads > V1_MIN_CTAS)
    return not use_v1


def vllm_smem_bytes(head_dim: int, block_size: int, partition_size: int,
                    max_seq_len: int) -> int:
    """Dynamic shared memory of vllm_decode, as vLLM's launchers size it: fp32 logits for the
    tokens one CTA covers (a partition, or the longest sequence rounded up to whole blocks), or
    the cross-warp output reduction, whichever is larger."""
    num_tokens = partition_size or ceil_div(max_seq_len, block_size) * block_size
    return max(num_tokens * 4, (VLLM_NUM_WARPS // 2) * head_dim * 4)


def gqa_stages(kv_bytes: int = 2) -> int:
    """cp.async stages of gqa_decode: 3 for fp16/bf16 caches; 5 for fp8 (whose tiles carry half
    the bytes: 4 in flight, as many bytes as fp16's 2)."""
    return 5 if kv_bytes == 1 else 3


def gqa_row_bytes(head_dim: int, kv_bytes: int = 2) -> int:
    """gqa_decode's shared-memory row stride for one K or V row of `kv_bytes` elements: a 16-bit
    row that fills whole 128-byte lines is stored as it is (its 16-byte chunks swizzled); any
    other row (fp8 at head_dim 80 and 112: with 16 bytes more, read by its last ldmatrix) takes
    the least odd multiple of 32 bytes that holds it. Either way each 32-byte cache sector lands
    in one shared-memory sector, so L2 serves it once (the kernel's header)."""
    row = head_dim * kv_bytes + (16 if kv_bytes == 1 and head_dim % 32 else 0)
    return row if kv_bytes == 2 and row % 128 == 0 else 32 * (ceil_div(row, 32) | 1)


def gqa_smem_bytes(head_dim: int, kv_bytes: int = 2, warps: int = GQA_NUM_WARPS) -> int:
    """Dynamic shared memory of gqa_decode with cache elements of `kv_bytes` (2: fp16/bf16, 1:
    fp8): stages x warps x (16 K + 16 V rows) of `gqa_row_bytes`."""
    return (gqa_stages(kv_bytes) * warps * 2 * GQA_WARP_TOKENS
            * gqa_row_bytes(head_dim, kv_bytes))


def ctas_per_sm(head_dim: int, kv_bytes: int = 2, warps: int = GQA_NUM_WARPS) -> int:
    """How many gqa_decode CTAs fit on one SM: shared memory is the limit."""
    return SM_SHARED_BYTES // (gqa_smem_bytes(head_dim, kv_bytes, warps)
                               + CTA_RESERVED_SHARED_BYTES)


def lone_cta_slowdown(num_sms: int, token_bytes: int) -> float:
    """How many times longer a launch of at most one CTA an SM reads than one of two an SM on
    `num_sms` SMs, for K and V of `token_bytes` a token: a lone CTA handles
    LONE_CTA_TOKENS_PER_S, two SM_TOKENS_PER_S, and together the SMs read at most HBM_GBPS.
    fp16 at head_dim 128 (512 bytes): 1.0 on the whole H200 (132 lone CTAs outrun HBM), 1.22 on
    80 SMs, 1.31 on 73 or fewer; fp8 (256 bytes): 1.31 on the whole GPU too. ValueError
    unless both are positive integers."""
    check_positive_int("num_sms", num_sms)
    check_positive_int("token_bytes", token_bytes)
    hbm = HBM_GBPS * 1e9 / token_bytes
    return min(hbm, num_sms * SM_TOKENS_PER_S) / min(hbm, num_sms * LONE_CTA_TOKENS_PER_S)


class Split(NamedTuple):
    """gqa's launch plan: tokens per partition and warps per CTA."""

    partition_size: int
    warps: int


def split_plan(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
               ctas_per_sm: int, token_bytes: int, seq_lens=None,
               eight_warps: bool = False) -> Split:
    """gqa's launch plan for one batch: Split(partition_size, warps), the tokens per partition (a
    multiple of PARTITION_QUANTUM; the longest sequence's length rounded up where it is not split)
    and the warps per CTA (GQA_NUM_WARPS, or 8).

    num_seqs, num_kv_heads, max_seq_len: the batch; num_sms SMs that hold `ctas_per_sm` CTAs of 4
    warps each; token_bytes: K and V of a token and KV head (2 x head_dim x the element's bytes);
    seq_lens: None for equal lengths, else num_seqs ints in [0, max_seq_len], the longest
    max_seq_len; eight_warps: whether a CTA of 8 warps fits an SM
    (`ctas_per_sm(head_dim, kv_bytes, 8) >= 1`). ValueError, naming the argument, for a count
    that is not a positive int, max_seq_len outside [1, MAX_SEQ_LEN], or such seq_lens.

    The plan minimises a makespan model in token-times over every size that changes the count of
    partitions. Equal lengths: CTAs that share an SM take turns at its bandwidth; up to one wave
    a launch costs `turns x size + PARTITION_OVERHEAD_TOKENS` with turns = ceil(CTAs / num_sms),
    times `lone_cta_slowdown` where each SM holds at most one; past a wave every wave costs
    ctas_per_sm turns, each with its overhead. 8 warps only with `eight_warps`, partitions of at
    least EIGHT_WARP_MIN_TOKENS, and lone CTAs of 4 that cannot keep HBM busy (CTAs x
    LONE_CTA_TOKENS_PER_S below HBM's tokens a second); such a CTA reads at SM_TOKENS_PER_S, or
    LONE_CTA_HBM_SHARE of its share of HBM if less. Ties go to two CTAs an SM, then to 4 warps,
    then to fewer partitions. Mixed lengths (4 warps): the makespan of `work_list`'s CTAs given
    longest first to the num_sms x ctas_per_sm slots, each holding its slot for its tokens plus
    MIXED_CTA_OVERHEAD_TOKENS. A split adds MERGE_OVERHEAD_TOKENS (mixed:
    MIXED_MERGE_OVERHEAD_TOKENS). Why this model: docs/kernels/gqa.md#design.
    """
    lens = _check_split_args(num_seqs, num_kv_heads, max_seq_len, num_sms, ctas_per_sm,
                             token_bytes, seq_lens)
    mixed = lens is not None and lens.min() != lens.max()
    num_slots = num_sms * ctas_per_sm

    hbm = HBM_GBPS * 1e9 / token_bytes  # tokens a second
    pair_rate = min(hbm, num_sms * SM_TOKENS_PER_S) / num_sms  # an SM's, with two CTAs

    def makespan(size: int, warps: int = GQA_NUM_WARPS) -> tuple[float, bool, bool, int]:
        if not mixed:
            merge = MERGE_OVERHEAD_TOKENS if size < max_seq_len else 0
            ctas = num_seqs * ceil_div(max_seq_len, size) * num_kv_heads
            lone = ctas <= num_sms
            key = lone, warps != GQA_NUM_WARPS, -size
            if warps != GQA_NUM_WARPS:  # lone, 8 warps
                turns = pair_rate / min(SM_TOKENS_PER_S, LONE_CTA_HBM_SHARE * hbm / ctas)
                return turns * size + PARTITION_OVERHEAD_TOKENS + merge, *key
            if ctas <= num_slots:  # one wave: the CTAs of an SM start, and end, together
                turns = ceil_div(ctas, num_sms)
                turns *= lone_cta_slowdown(num_sms, token_bytes) if lone else 1
                return turns * size + PARTITION_OVERHEAD_TOKENS + merge, *key
            turns = ctas_per_sm * ceil_div(ctas, num_slots)
            return turns * (size + PARTITION_OVERHEAD_TOKENS) + merge, *key
        merge = MIXED_MERGE_OVERHEAD_TOKENS if size < max_seq_len else 0
        return (_longest_first_makespan(lens, num_kv_heads, size, num_slots) + merge, False,
                False, -size)

    q = PARTITION_QUANTUM
    sizes = sorted({ceil_div(ceil_div(max_seq_len, n), q) * q
                    for n in range(1, ceil_div(max_seq_len, q) + 1)})
    if not mixed:
        options = [Split(size, GQA_NUM_WARPS) for size in sizes]
        if eight_warps:  # where lone CTAs of 4 warps cannot keep HBM busy
            for size in sizes:
                ctas = num_seqs * ceil_div(max_seq_len, size) * num_kv_heads
                if (size >= EIGHT_WARP_MIN_TOKENS and ctas <= num_sms
                        and ctas * LONE_CTA_TOKENS_PER_S < hbm):
                    options.append(Split(size, 8))
        return min(options, key=lambda split: makespan(*split))
    # mixed: the list schedule is costly, so try sizes from the least lower bound on their
    # makespan (the mean slot's work, or the longest CTA) and stop where it passes the best
    bounds = []
    for size in sizes:
        ctas = np.maximum(1, ceil_div(lens, size)).sum() * num_kv_heads
        work = int(lens.sum()) * num_kv_heads + MIXED_CTA_OVERHEAD_TOKENS * ctas
        longest = min(size, max_seq_len) + MIXED_CTA_OVERHEAD_TOKENS
        merge = MIXED_MERGE_OVERHEAD_TOKENS if size < max_seq_len else 0
        bounds.append((max(work / num_slots, longest) + merge, size))
    best = None
    for bound, size in sorted(bounds):
        if best is not None and bound > best[0]:
            break
        key = makespan(size)
        if best is None or key < best:
            best = key
    return Split(-best[3], GQA_NUM_WARPS)


def _check_split_args(num_seqs, num_kv_heads, max_seq_len, num_sms, ctas_per_sm, token_bytes,
                      seq_lens) -> np.ndarray | None:
    """ValueError for what `split_plan` cannot plan; returns seq_lens as int64 [num_seqs] (or
    None)."""
    for name, value in (("num_seqs", num_seqs), ("num_kv_heads", num_kv_heads),
                        ("num_sms", num_sms), ("ctas_per_sm", ctas_per_sm),
                        ("token_bytes", token_bytes)):
        check_positive_int(name, value)
    check_int("max_seq_len", max_seq_len, 1, MAX_SEQ_LEN)
    if seq_lens is None:
        return None
    lens = list(seq_lens)
    if not (len(lens) == num_seqs and all(is_int(n) and 0 <= n <= max_seq_len for n in lens)
            and max(lens) == max_seq_len):
        raise ValueError(f"seq_lens={seq_lens!r}: must be num_seqs={num_seqs} integers in "
                         f"[0, max_seq_len={max_seq_len}], the longest max_seq_len")
    return np.asarray(lens, dtype=np.int64)


def work_list(seq_lens, size: int) -> np.ndarray:
    """gqa's work items for a batch of mixed lengths at `size` tokens per partition (one item a
    sequence where `size` covers the longest): int32 [num_items, 2] (sequence, partition), the
    partitions that hold tokens (partition 0 of every sequence, even an empty one), the longest
    first (ties in sequence order), so that short ones fill the tail of the launch. The kernel
    runs each item as num_kv_heads CTAs launched together. ValueError unless size is a
    positive integer."""
    check_positive_int("size", size)
    lens = np.asarray(seq_lens, dtype=np.int64)
    counts = np.maximum(1, ceil_div(lens, size))
    seq = np.repeat(np.arange(lens.size), counts)
    partition = np.arange(seq.size) - np.repeat(np.cumsum(counts) - counts, counts)
    tokens = np.minimum(size, lens[seq] - partition * size)
    order = np.lexsort((partition, seq, -tokens))
    return np.stack([seq[order], partition[order]], axis=1).astype(np.int32)


def one_wave_order(work: np.ndarray, num_kv_heads: int, num_sms: int,
                   ctas_per_sm: int) -> np.ndarray:
    """`work` (a `work_list`, longest first) reordered for a launch whose CTAs, num_kv_heads an
    item, all fit at once on `num_sms` SMs of `ctas_per_sm` slots: the items of the first
    num_sms CTAs stay longest first, the rest follow shortest first, so that the SM of a long
    CTA takes a short one as its second, and the long one reads alone sooner. A larger launch
    keeps `work` (its slots come free in turn: longest first is what fills them evenly).
    NOTE: this assumes, without a document to say so, that the block scheduler gives the first
    num_sms CTAs an SM each and the next ones the SMs in the same order; the evidence is only
    the time it saves on one-wave batches in an unrecorded probe on the H200. Past one wave the
    same probe found it slower, hence one wave only."""
    if work.shape[0] * num_kv_heads > num_sms * ctas_per_sm:
        return work
    first = ceil_div(num_sms, num_kv_heads)
    return np.concatenate([work[:first], work[first:][::-1]])


def _longest_first_makespan(lens: np.ndarray, num_kv_heads: int, size: int,
                            num_slots: int) -> float:
    """When the last of `num_slots` slots comes free, in tokens, for the mixed batch `lens`
    split at `size` tokens (`work_list`'s items, num_kv_heads CTAs each) given out longest
    first, each to the slot free soonest, a CTA of t tokens lasting t +
    MIXED_CTA_OVERHEAD_TOKENS. The full partitions all last as long, so they fill the slots
    evenly (some one more); the sequences' last partitions follow one by one. The slots move in
    groups of g = gcd(num_slots, num_kv_heads), whose loads stay equal (an item's CTAs fill
    whole groups), so one group stands for g slots."""
    g = math.gcd(num_slots, num_kv_heads)
    groups, copies = num_slots // g, num_kv_heads // g
    full, rest = np.divmod(lens, size)
    rounds, extra = divmod(int(full.sum()) * copies, groups)
    cost = size + MIXED_CTA_OVERHEAD_TOKENS
    # a heap: the groups that took one partition less come first
    free_at = [rounds * cost] * (groups - extra) + [(rounds + 1) * cost] * extra
    replace = heapq.heapreplace
    for tokens in np.sort(rest[(rest > 0) | (lens == 0)])[::-1].tolist():
        for _ in range(copies):
            replace(free_at, free_at[0] + tokens + MIXED_CTA_OVERHEAD_TOKENS)
    return max(free_at)
