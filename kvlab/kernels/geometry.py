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

# vllm_v1 (kernels/paged_decode_vllm.cu)
VLLM_BLOCK_SIZES = (8, 16, 32)
VLLM_NUM_WARPS = 4  # 128 threads per CTA
PARTITION_SIZE = 512  # tokens per CTA of v2
MAX_V1_SEQ_LEN = 8192  # like vLLM: v1 only up to this many tokens
V1_MIN_CTAS = 512  # like vLLM: a split v1 batch runs v1 only above this many (sequence, head) CTAs
# CTAs an H200 SM holds (registers, at head_dim 128, block 16): 5, v1 and v2, with or without
# prefetch (88-96 registers a thread; the launch bounds ask for 5), as vLLM's own build holds
# both (96 registers a thread: vLLM 0.9.2's source by nvcc 13 for sm_90, and its CUDA 12.8 wheel)
VLLM_CTAS_PER_SM = 5

# gqa (kernels/paged_decode_gqa.cu)
GQA_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
GQA_MAX_GROUP = 8  # query heads per KV head: the n-width of one mma
GQA_NUM_WARPS = 4  # warps of a CTA, unless split_plan picks 8
GQA_WARP_TOKENS = 16  # rows of a tile owned by one warp
PARTITION_QUANTUM = 256  # gqa partition sizes are multiples of this many tokens
PARTITION_OVERHEAD_TOKENS = 128  # a CTA's fixed cost (prologue, pipeline fill, epilogue), in tokens
MERGE_OVERHEAD_TOKENS = 256  # the merge launch's cost, in tokens of one CTA
# mixed lengths, in tokens of one slot (a CTA's share of its SM): a CTA's fixed cost, the merge's
MIXED_CTA_OVERHEAD_TOKENS = 256
MIXED_MERGE_OVERHEAD_TOKENS = 768
# Read rates of gqa_decode on the H200 (fp16, head_dim 128: 512 bytes of K and V a token; 32 SMs
# of a green context, where HBM is not the limit; session probe at revision af1c220, not a
# recorded result): one CTA alone on an SM 86M tokens/s (llama3-8b 1 x 32k in 32 CTAs:
# 1,413 GB/s), two CTAs an SM 113M tokens/s (64 CTAs: 1,853 GB/s; the copy roofline of those 32
# SMs: 2,274 GB/s). In tokens, not bytes: a lone CTA is bound by the tokens it handles, and on
# an fp8 cache (256 bytes a token) it read 24.7 GB/s, 97M tokens/s (llama3-8b 16 x 32k unsplit,
# 128 CTAs on the whole GPU: 74% of the roofline, against 94% split in two; attention_fp8.json
# at revision 2967426).
HBM_GBPS = 4280.0  # the copy roofline of the whole GPU
LONE_CTA_TOKENS_PER_S = 86e6
SM_TOKENS_PER_S = 113e6
# What a lone CTA of 8 warps reaches of its share of HBM where HBM is the limit: fitted to the
# two probes split_plan's docstring names (0.87-0.92 choose alike; this is mid-way)
LONE_CTA_HBM_SHARE = 0.9
# 8 warps only for partitions of at least 4 tiles a warp: below, a warp's stages hold its whole
# share (not timed lone; see split_plan)
EIGHT_WARP_MIN_TOKENS = 512
SM_SHARED_BYTES = 228 * 1024  # shared memory per SM on Hopper (H100, H200)
CTA_RESERVED_SHARED_BYTES = 1024  # what the driver reserves per resident CTA


# block sizes each family runs
FAMILY_BLOCK_SIZES = {"vllm_v1": VLLM_BLOCK_SIZES, "gqa": GQA_BLOCK_SIZES}


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
    """gqa's tokens per partition (a multiple of PARTITION_QUANTUM) and warps per CTA on
    `num_sms` SMs that hold `ctas_per_sm` CTAs of 4 warps each, for K and V of `token_bytes` a
    token and KV head (2 x head_dim x the element's bytes); `eight_warps`: whether a CTA of 8
    warps fits an SM (`ctas_per_sm(head_dim, kv_bytes, 8) >= 1`). Ties go to two CTAs an SM,
    then to 4 warps, then to fewer partitions (less merge work).

    Equal lengths (seq_lens None, or all equal): minimises a makespan model in token-times.
    Reading is bound by bandwidth, and an SM reads nearly as fast with one CTA as with two, so
    CTAs that share an SM take turns at its bandwidth. Up to one wave, an SM's turns are the CTAs
    it holds, ceil(CTAs / num_sms), times `lone_cta_slowdown(num_sms, token_bytes)` when each SM
    holds at most one: `turns x partition tokens + PARTITION_OVERHEAD_TOKENS`, the overhead once,
    since the CTAs of an SM start together and their prologues and epilogues overlap. Beyond a
    wave, every wave costs ctas_per_sm turns and a partial wave a whole one, each turn with its
    overhead: `turns x (partition tokens + PARTITION_OVERHEAD_TOKENS)`. A split adds
    MERGE_OVERHEAD_TOKENS. Of equal makespans, two CTAs an SM beat one (a lone CTA an SM read
    0.3-3.3% slower than a pair even where HBM is the limit, below), then fewer partitions win.
    8 warps: where a launch's lone CTAs of 4 warps cannot keep HBM busy (CTAs x
    LONE_CTA_TOKENS_PER_S below HBM's tokens a second: on the H200 up to 97 CTAs of fp16 at
    head_dim 128, up to 194 of fp8), a lone CTA of 8 warps reads like a pair,
    SM_TOKENS_PER_S, or at most LONE_CTA_HBM_SHARE of its share of HBM: its turns are the
    pair's rate over that. Equal lengths and partitions of EIGHT_WARP_MIN_TOKENS or more only.
    NOTE: observed on the H200 in session probes (not recorded results; the choices of two
    models timed in one loop where they differ):
    - gqa v9 (revision f115b32) at forced partition sizes, 32 equal-length points of the four
      paper models, one loop a point: the model before this one, which charged the overhead to
      every turn, ran one CTA an SM where two an SM were 0.3-3.3% faster (1 x 32k: llama3-8b
      79.3% -> 80.6% of the copy roofline, qwen2.5-14b 78.8% -> 80.8%; qwen2.5-7b 4 x 8k
      63.7% -> 65.8%; llama2-7b 1 x 8k 79.6% -> 81.8%). This one picks the fastest size at 30 of
      the 32 points and sizes within 0.5 points of it at the other two;
    - against the model before it, which counted waves of slots alone and so split to fill both
      of an SM's slots (21 points of the four paper models, gqa v2 and a constant lone-CTA
      slowdown): 1.03-1.11x faster where this choice drops the merge or halves it (llama3-8b
      and qwen2.5-14b 16 x 1k 1.106x and 1.086x, llama3-8b 16 x 4k 1.032x, qwen2.5-7b 32 x 4k
      1.055x and 1 x 32k 1.030x), 0.986-1.005x elsewhere;
    - `lone_cta_slowdown` against the constant 1.05 it replaced (gqa v8, revision af1c220): on
      80 SMs 1.05-1.18x faster at all 12 points tried and on 32 SMs 1.06-1.23x at all 8 (it
      splits where a lone CTA an SM cannot keep up: llama3-8b 8 x 4k on 80 SMs 51.4 -> 43.5
      us); on the whole GPU, where it keeps one CTA an SM, 0.984-1.020x at 15 points (llama3-8b
      16 x 8k 1.019x, llama2-7b 1 x 32k 0.984x). Counted in bytes (as first written), it also
      ran fp8 caches one CTA an SM on the whole GPU, 1.2-1.3x slower (see LONE_CTA_TOKENS_PER_S).
    Past a wave (gqa v1), llama3-8b at 16 x 32k ran 93.5% of the roofline in 2 partitions (one
    wave), 92.1% in 9 and 87.3% in 3 (two waves).
    Mixed lengths: CTAs of every size, launched longest first (`work_list`), take the
    `num_sms x ctas_per_sm` slots as they come free: a CTA of t tokens holds its slot for
    `t + MIXED_CTA_OVERHEAD_TOKENS`. The model is that list schedule's makespan
    (`_longest_first_makespan`), plus MIXED_MERGE_OVERHEAD_TOKENS where it splits (both in a
    slot's token-times; the constants sit mid-way in a plateau of equal fit: 192-256 and
    512-1024). NOTE: fitted to a sweep of forced partition sizes on the H200 (gqa at revision
    bab5ead, the four paper models at batches 16, 64 and 256 of lognormal lengths, mean 1.5k and
    3.2k, max 2k to 32k; 36 points, one loop a point; a session's probe, not a recorded
    result): its choice ran 0.1 points of the copy roofline below the fastest size on average,
    at most 0.8. The model before it (total work spread over the slots plus a quarter of the
    longest CTA) gave up 1.1 points on average, up to 5.2: it split batches of up to 16k-token
    sequences that LPT runs fastest whole (qwen2.5-14b 256 sequences of mean 3.2k: 99.5% split
    in 2,816-token partitions, 104.7% whole). Out of the fit's sample (the same probe at revision
    306bef0; batches 32 and 128 of lognormal lengths, mean 800 and 6k, max 4k and 32k; the three
    GQA models, 12 points): 0.4 points below the fastest size on average, at most 2.2 (qwen2.5-7b
    128 x mean 800: 2,048-token partitions 71.4%, 1,280 73.6%), and 2.3-12.2 points above gqa
    v9 with the model before. `bench attention --lengths` checks it. Rechecked once the merge
    left sequences of one partition to the decode launch (the same probe, that change on
    revision 0c2da42; 12 points of batches 16, 64 and 256, max 2k to 32k): 0.8 points below the
    fastest size on average, at most 2.0 (qwen2.5-7b 16 sequences of mean 2.1k, max 7k: 768
    tokens 61.0%, 512 63.0%).
    8 warps (gqa v12), in two session probes (not recorded; one loop a point):
    - at revision 93d7cc5, every partition size that changes the count down to a sixteenth of
      the sequence, and 32 partitions, with 4 warps and with 8 where those CTAs are lone, SDPA
      beside; 9 shapes of the four paper models, fp16 and, at three, fp8: the choice changed at
      6 of 32 equal-length points, each time to the fastest size measured: fp8 16 x 8k 84.3 ->
      87.2% of the copy roofline (llama3-8b) and 83.3 -> 87.2% (qwen2.5-14b), fp8 16 x 32k
      95.2 -> 97.8% and 95.2 -> 97.6%, qwen2.5-7b 16 x 1k 46.8 -> 49.8% and 16 x 4k 80.0 ->
      80.5%; it gives up 0.18 points to the fastest on average, the model before 0.66. Without
      the gate above, 8 warps ran where lone CTAs of 4 already keep HBM busy: -1.2 to +0.9
      points against them (fp16 16 x 8k and 16 x 32k), and up to 4 points below pairs of 4
      (llama2-7b 1 x 32k, 96 CTAs of 11k tokens: 93.7% against 96.7%). On batches of mixed
      lengths 8 warps ran 0.3-4.3 points below the best of 4 (16 sequences of lognormal
      lengths, max 16k; 64 of max 2k);
    - the plan without 8 warps against the plan with them at the 15 points of the recorded
      grids where they differ, on the whole GPU and on green contexts of 32 and 80 SMs: with
      LONE_CTA_HBM_SHARE at 0.97, 8 warps ran 1.007-1.13x as fast at 13 (fp8 llama3-8b
      16 x 1k 40.8 -> 46.2%, qwen2.5-7b 16 x 4k on 80 SMs 78.8 -> 86.3%, llama2-7b 1 x 4k on
      32 SMs 81.1 -> 86.5%) and 0.974x and 0.984x at llama3-8b and qwen2.5-14b 1 x 32k on 80
      SMs (80 lone CTAs of 8 warps against 152 of 4), which the share of 0.9 leaves at 4 warps.
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
    num_sms CTAs an SM each and the next ones the SMs in the same order; what was observed is
    the time it saves. Session probe on the H200 (gqa
    v10, not recorded; one loop a point): one-wave batches of lognormal lengths, max 2k,
    unsplit: qwen2.5-7b 64 sequences (256 CTAs) 79.1 -> 80.5% of the copy roofline, llama2-7b
    8 (256 CTAs) 83.7 -> 86.8%; at 208 and 264 CTAs unchanged (+-0.3 points); applied to
    launches of 344-556 CTAs, 1.8-11.5 points slower, hence one wave only."""
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
