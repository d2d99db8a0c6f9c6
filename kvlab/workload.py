"""Request-length workloads: how many tokens each request holds in the KV cache.

A `Workload` is plain data: per-request prompt and output lengths, an optional shared prefix
(a system prompt several requests begin with), and the `max_seq_len` a contiguous cache must
preallocate per request. The generators (`uniform`, `lognormal`, `shared_prefix`) are seeded;
`make_workload` combines a named distribution (`DISTRIBUTIONS`) with a shared-prefix fraction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvlab.checks import check_int, is_int, is_real

__all__ = [
    "DISTRIBUTIONS",
    "Workload",
    "batch_shape",
    "describe_mixed",
    "lognormal",
    "lognormal_lengths",
    "lognormal_spec",
    "make_workload",
    "mixed_lengths",
    "mixed_spec",
    "production_lengths",
    "shared_prefix",
    "uniform",
]

# A request's KV length: the kernels take seq_lens as int32, so sums of two stay in int64.
MAX_SEQ_LEN = 2**31 - 1
# Requests of a generated workload: its three int64 arrays take at most 384 MiB.
MAX_NUM_REQUESTS = 2**24
# FlashInfer's production length mix (its decode benchmarks, issue #51): (KV length, weight %).
PRODUCTION_MIX = ((4096, 35), (8192, 20), (16384, 15), (32768, 12), (65536, 10), (131072, 8))
# The smallest longest length of a scaled production mix: its shortest length is then 1.
PRODUCTION_MIN_MAX = PRODUCTION_MIX[-1][0] // PRODUCTION_MIX[0][0]


def _int_array(name: str, values) -> np.ndarray:
    """`values` as a read-only 1-D int64 array; ValueError for another dtype or shape, or for a
    value past MAX_SEQ_LEN (checked before the cast, so that a uint64 cannot wrap around)."""
    arr = np.asarray(values)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: dtype {arr.dtype}: must be an integer array")
    if arr.ndim != 1:
        raise ValueError(f"{name}: shape {arr.shape}: must be 1-D")
    _check_all(name, arr, arr <= MAX_SEQ_LEN, f"<= {MAX_SEQ_LEN}")
    arr = arr.astype(np.int64)
    arr.setflags(write=False)
    return arr


def _check_all(name: str, arr: np.ndarray, ok: np.ndarray, allowed: str) -> None:
    """Raise for the first index where `ok` is False: `name[i]=value: must be <allowed>`."""
    bad = np.flatnonzero(~ok)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}]={int(arr[i])}: must be {allowed}")


def _check_count(name: str, value, minimum: int, maximum: int = MAX_SEQ_LEN) -> int:
    """`value` as an int; ValueError unless it is an integer in [minimum, maximum]."""
    if not is_int(value):
        raise ValueError(f"{name}={value!r}: must be an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name}={value}: must be >= {minimum}")
    if value > maximum:
        raise ValueError(f"{name}={value}: must be <= {maximum}")
    return int(value)


def _check_fraction(name: str, value) -> float:
    if not is_real(value) or not 0 <= value <= 1:
        raise ValueError(f"{name}={value!r}: must be in [0, 1]")
    return float(value)


def _check_sigma(sigma) -> float:
    if not is_real(sigma) or sigma < 0:
        raise ValueError(f"sigma={sigma!r}: must be >= 0, a finite number")
    return float(sigma)


@dataclass(frozen=True, eq=False)
class Workload:
    """Per-request KV lengths of a batch of requests, at their final lengths.

    Attributes:
        prompt_lens: int64 `[num_requests]`, >= 1. Prompt tokens, shared prefix included.
        output_lens: int64 `[num_requests]`, >= 0. Generated tokens.
        max_seq_len: per-request length a contiguous cache preallocates, at most MAX_SEQ_LEN;
            every `prompt_lens[i] + output_lens[i] <= max_seq_len`.
        prefix_group: int64 `[num_requests]`; -1 = no shared prefix, else an index into
            `prefix_lens`. Default: no request shares a prefix.
        prefix_lens: int64 `[num_groups]`, >= 1. Request i in group g begins with the
            `prefix_lens[g]` tokens of that group, so `prompt_lens[i] >= prefix_lens[g]`.
        name: label for plots and tables.

    Arrays are converted to read-only int64. Raises ValueError on any violated constraint
    (every length at most MAX_SEQ_LEN too), naming the field, the index and the value.
    """

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    max_seq_len: int
    prefix_group: np.ndarray | None = None
    prefix_lens: np.ndarray | None = None
    name: str = "custom"

    def __post_init__(self) -> None:
        defaults = {"prefix_group": np.full(len(self.prompt_lens), -1), "prefix_lens": []}
        for field in ("prompt_lens", "output_lens", "prefix_group", "prefix_lens"):
            value = getattr(self, field)
            value = _int_array(field, defaults[field] if value is None else value)
            object.__setattr__(self, field, value)
        for field in ("output_lens", "prefix_group"):
            if getattr(self, field).shape != self.prompt_lens.shape:
                raise ValueError(
                    f"{field}: shape {getattr(self, field).shape}: "
                    f"must match prompt_lens {self.prompt_lens.shape}"
                )
        object.__setattr__(self, "max_seq_len", _check_count("max_seq_len", self.max_seq_len, 1))
        self._check_lengths()

    def _check_lengths(self) -> None:
        prompt, output, prefix = self.prompt_lens, self.output_lens, self.prefix_lens
        _check_all("prompt_lens", prompt, prompt >= 1, ">= 1")
        _check_all("output_lens", output, output >= 0, ">= 0")
        _check_all("prefix_lens", prefix, prefix >= 1, ">= 1")
        group, num_groups = self.prefix_group, len(prefix)
        _check_all(
            "prefix_group",
            group,
            (group >= -1) & (group < num_groups),
            f"-1 or in [0, {num_groups})",
        )
        _check_all(
            "prompt_lens",
            prompt,
            prompt >= self.request_prefix_lens,
            ">= its shared prefix, prefix_lens[prefix_group[i]]",
        )
        _check_all(
            "seq_lens",
            self.seq_lens,
            self.seq_lens <= self.max_seq_len,
            f"<= max_seq_len={self.max_seq_len} (seq_lens = prompt_lens + output_lens)",
        )

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    @property
    def seq_lens(self) -> np.ndarray:
        """int64 `[num_requests]`: prompt + output tokens, the final KV length of each request."""
        return self.prompt_lens + self.output_lens

    @property
    def request_prefix_lens(self) -> np.ndarray:
        """int64 `[num_requests]`: shared-prefix tokens of each request (0 when not in a group)."""
        padded = np.append(self.prefix_lens, 0)  # index -1 -> the trailing 0
        return padded[self.prefix_group]

    def token_ids(self, i: int) -> list[int]:
        """Synthetic token ids of request `i` at its full length `seq_lens[i]`.

        Requests in the same prefix group start with identical ids for their `prefix_lens[g]`
        prefix tokens; every other token id is unique across the whole workload, so prefix
        caching can share exactly the blocks this workload says are shared.

        Raises IndexError if `i` is not in [0, num_requests), ValueError if it is not an integer.
        """
        if not is_int(i):
            raise ValueError(f"i={i!r}: must be an integer in [0, {self.num_requests})")
        if not 0 <= i < self.num_requests:
            raise IndexError(f"i={i}: must be in [0, {self.num_requests})")
        seq_len = int(self.seq_lens[i])
        # NOTE: ids [0, sum(prefix_lens)) are prefix tokens; request i owns the range
        # starting at sum(prefix_lens) + i * max_seq_len, so no two requests collide.
        own_start = int(self.prefix_lens.sum()) + i * self.max_seq_len
        group = int(self.prefix_group[i])
        if group < 0:
            return list(range(own_start, own_start + seq_len))
        prefix_start = int(self.prefix_lens[:group].sum())
        prefix_len = int(self.prefix_lens[group])
        return list(range(prefix_start, prefix_start + prefix_len)) + list(
            range(own_start + prefix_len, own_start + seq_len)
        )


def _check_range(name: str, value, minimum: int) -> tuple[int, int]:
    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: must be a (lo, hi) pair of ints") from None
    lo = _check_count(f"{name}[0]", lo, minimum)
    hi = _check_count(f"{name}[1]", hi, minimum)
    if lo > hi:
        raise ValueError(f"{name}=({lo}, {hi}): lo must be <= hi")
    return lo, hi


def uniform(
    num_requests: int,
    prompt_len: tuple[int, int] = (128, 1024),
    output_len: tuple[int, int] = (32, 512),
    max_seq_len: int | None = None,
    seed: int = 0,
) -> Workload:
    """Lengths drawn uniformly from the inclusive ranges `prompt_len` and `output_len`.

    Args:
        num_requests: in [1, MAX_NUM_REQUESTS].
        prompt_len: (lo, hi) with 1 <= lo <= hi.
        output_len: (lo, hi) with 0 <= lo <= hi.
        max_seq_len: contiguous preallocation per request; default `prompt_len[1] + output_len[1]`,
            and it must be at least that, and at most MAX_SEQ_LEN.
        seed: an int >= 0, the seed of `numpy.random.default_rng`.

    Raises ValueError for an argument out of range, naming it.
    """
    num_requests = _check_count("num_requests", num_requests, 1, MAX_NUM_REQUESTS)
    p_lo, p_hi = _check_range("prompt_len", prompt_len, 1)
    o_lo, o_hi = _check_range("output_len", output_len, 0)
    check_int("seed", seed, 0)
    longest = p_hi + o_hi
    if longest > MAX_SEQ_LEN:
        raise ValueError(f"prompt_len[1] + output_len[1] = {longest}: must be <= {MAX_SEQ_LEN}")
    if max_seq_len is None:
        max_seq_len = longest
    elif _check_count("max_seq_len", max_seq_len, 1) < longest:
        raise ValueError(
            f"max_seq_len={max_seq_len}: must be >= prompt_len[1] + output_len[1] = {longest}"
        )
    rng = np.random.default_rng(seed)
    return Workload(
        prompt_lens=rng.integers(p_lo, p_hi, size=num_requests, endpoint=True),
        output_lens=rng.integers(o_lo, o_hi, size=num_requests, endpoint=True),
        max_seq_len=int(max_seq_len),
        name=f"uniform prompt {p_lo}-{p_hi}, output {o_lo}-{o_hi}",
    )


def lognormal_spec(text: str) -> tuple[int, int]:
    """(mean, max_len) of a `lognormal:MEAN,MAX` spec (the arguments of `lognormal_lengths`).
    Raises ValueError unless both are integers (ASCII digits) with 1 <= MEAN <= MAX <=
    MAX_SEQ_LEN."""
    kind, _, numbers = text.partition(":") if isinstance(text, str) else ("", "", "")
    parts = [p.strip() for p in numbers.split(",")]
    if (kind == "lognormal" and len(parts) == 2
            and all(p.isascii() and p.isdigit() and len(p) <= 10 for p in parts)):
        mean, max_len = (int(p) for p in parts)
        if 1 <= mean <= max_len <= MAX_SEQ_LEN:
            return mean, max_len
    raise ValueError(f"{text!r}: must be lognormal:MEAN,MAX with integers 1 <= MEAN <= MAX <= "
                     f"{MAX_SEQ_LEN}, e.g. lognormal:3200,16384")


def lognormal_lengths(num_seqs: int, mean: int, max_len: int, sigma: float = 1.0,
                      seed: int = 0) -> np.ndarray:
    """int64 [num_seqs] KV lengths of a batch of mixed lengths: the prompts of `lognormal` with
    the median that gives `mean` before clipping (mean / exp(sigma^2 / 2)), clipped into
    [1, max_len] (so the batch's mean ends a little below `mean`). Raises ValueError for
    num_seqs not in [1, MAX_NUM_REQUESTS], max_len not in [1, MAX_SEQ_LEN], mean not in
    [1, max_len] (and as `lognormal`)."""
    num_seqs = _check_count("num_seqs", num_seqs, 1, MAX_NUM_REQUESTS)
    mean, max_len = _check_count("mean", mean, 1), _check_count("max_len", max_len, 1)
    if mean > max_len:
        raise ValueError(f"mean={mean}: must be in [1, max_len={max_len}]")
    sigma = _check_sigma(sigma)
    median = max(1, round(mean * math.exp(-sigma * sigma / 2)))  # sigma * sigma: inf, not raise
    return lognormal(num_seqs, median, 1, sigma, max_len, seed).prompt_lens


def mixed_spec(text: str) -> tuple[str, tuple[int, ...]]:
    """A spec of a batch of mixed lengths as (kind, arguments): ("lognormal", (MEAN, MAX)) for
    `lognormal:MEAN,MAX` (`lognormal_lengths`), ("production", (MAX,)) for `production:MAX`
    (`production_lengths`). Raises ValueError, naming both forms, for anything else."""
    kind, _, number = text.partition(":") if isinstance(text, str) else ("", "", "")
    if kind == "production":
        number = number.strip()
        if number.isascii() and number.isdigit() and len(number) <= 10:
            if PRODUCTION_MIN_MAX <= int(number) <= MAX_SEQ_LEN:
                return kind, (int(number),)
    elif kind == "lognormal":
        return kind, lognormal_spec(text)
    raise ValueError(f"{text!r}: must be lognormal:MEAN,MAX (integers 1 <= MEAN <= MAX <= "
                     f"{MAX_SEQ_LEN}) or production:MAX (an integer in "
                     f"[{PRODUCTION_MIN_MAX}, {MAX_SEQ_LEN}]), e.g. "
                     "lognormal:3200,16384 or production:32768")


def _production_scaled(max_len: int) -> np.ndarray:
    """PRODUCTION_MIX's lengths scaled (rounded) so that the longest is max_len."""
    max_len = _check_count("max_len", max_len, PRODUCTION_MIN_MAX, MAX_SEQ_LEN)
    lens = np.array([length for length, _ in PRODUCTION_MIX], dtype=np.int64)
    return (lens * max_len + lens[-1] // 2) // lens[-1]


def production_lengths(num_seqs: int, max_len: int, seed: int = 0) -> np.ndarray:
    """int64 [num_seqs] KV lengths in FlashInfer's production mix (PRODUCTION_MIX: 4k to 128k
    weighted 35, 20, 15, 12, 10, 8 %) scaled by max_len / 128k, so that the mix's longest length is
    max_len. Each length gets its weight's share of the batch, rounded by largest remainder
    (ties to the shorter), and the batch is shuffled (seeded); a batch of fewer sequences than
    the mix has lengths holds only some of them (1 sequence: the shortest). Raises ValueError
    for num_seqs not in [1, MAX_NUM_REQUESTS] or max_len not in [PRODUCTION_MIN_MAX,
    MAX_SEQ_LEN]."""
    num_seqs = _check_count("num_seqs", num_seqs, 1, MAX_NUM_REQUESTS)
    lens = _production_scaled(max_len)
    share = np.array([w for _, w in PRODUCTION_MIX], dtype=np.int64) * num_seqs
    counts = share // 100
    by_remainder = np.argsort(-(share % 100), kind="stable")  # stable: ties to the shorter
    counts[by_remainder[:num_seqs - int(counts.sum())]] += 1
    batch = np.repeat(lens, counts)
    np.random.default_rng(seed).shuffle(batch)
    return batch


def mixed_lengths(num_seqs: int, spec: str) -> np.ndarray:
    """int64 [num_seqs] KV lengths of a `mixed_spec` spec (seed 0), as `bench attention
    --lengths` draws them. Raises ValueError for a bad spec or num_seqs."""
    kind, args = mixed_spec(spec)
    draw = lognormal_lengths if kind == "lognormal" else production_lengths
    return draw(num_seqs, *args)


def describe_mixed(spec: str) -> str:
    """A mixed-lengths spec in words, for a chart's note."""
    kind, args = mixed_spec(spec)
    if kind == "lognormal":
        return f"lognormal of mean {args[0]} before clipping at {args[1]}"
    return (f"FlashInfer's production mix ({', '.join(str(n) for n in _production_scaled(*args))} "
            f"weighted {', '.join(str(w) for _, w in PRODUCTION_MIX)} %)")


def batch_shape(batch: int, shape: int | str) -> tuple[int | list[int], int, int, dict]:
    """A benchmark point's batch: `batch` sequences of `shape` tokens, or of the lengths of a
    `mixed_spec` spec (`mixed_lengths`). Returns what a filled cache takes (the context, or the
    lengths), the mean length (rounded), the tokens in all, and what a result row of mixed
    lengths records: {"lengths": the spec, "max_context": the longest} ({} for one context).
    Raises ValueError for batch not in [1, MAX_NUM_REQUESTS], or shape neither an integer in
    [1, MAX_SEQ_LEN] nor a `mixed_spec` spec."""
    batch = _check_count("batch", batch, 1, MAX_NUM_REQUESTS)
    if isinstance(shape, str):
        lengths = mixed_lengths(batch, shape)
        return (lengths.tolist(), round(float(lengths.mean())), int(lengths.sum()),
                {"lengths": shape, "max_context": int(lengths.max())})
    shape = _check_count("shape", shape, 1)
    return shape, shape, batch * shape, {}


def lognormal(
    num_requests: int,
    prompt_median: int,
    output_median: int,
    sigma: float = 1.0,
    max_seq_len: int = 4096,
    seed: int = 0,
) -> Workload:
    """Long-tailed lengths: `median * exp(sigma * N(0, 1))`, rounded, clipped into range.

    Prompts are clipped into [1, max_seq_len], then outputs into [0, max_seq_len - prompt],
    so every request fits `max_seq_len`.

    Args:
        num_requests: in [1, MAX_NUM_REQUESTS].
        prompt_median: in [1, max_seq_len].
        output_median: in [1, max_seq_len].
        sigma: a finite number >= 0, spread of log-length (0 gives every request the medians).
        max_seq_len: in [1, MAX_SEQ_LEN], contiguous preallocation per request.
        seed: an int >= 0, the seed of `numpy.random.default_rng`.

    Raises ValueError for an argument out of range, naming it.
    """
    num_requests = _check_count("num_requests", num_requests, 1, MAX_NUM_REQUESTS)
    max_seq_len = _check_count("max_seq_len", max_seq_len, 1)
    for name, median in [("prompt_median", prompt_median), ("output_median", output_median)]:
        if _check_count(name, median, 1) > max_seq_len:
            raise ValueError(f"{name}={median}: must be in [1, max_seq_len={max_seq_len}]")
    sigma = _check_sigma(sigma)
    check_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    # NOTE: clipped as floats, then cast: a long tail (exp of a large sigma: inf) cannot wrap
    prompt = np.clip(np.rint(prompt_median * rng.lognormal(0.0, sigma, num_requests)), 1,
                     max_seq_len).astype(np.int64)
    output = np.clip(np.rint(output_median * rng.lognormal(0.0, sigma, num_requests)), 0,
                     max_seq_len - prompt).astype(np.int64)
    return Workload(
        prompt_lens=prompt,
        output_lens=output,
        max_seq_len=max_seq_len,
        name=f"lognormal prompt~{prompt_median}, output~{output_median}, sigma={sigma:g}",
    )


def shared_prefix(
    base: Workload,
    shared_fraction: float,
    prefix_len: int,
    num_prefixes: int = 1,
    seed: int = 0,
) -> Workload:
    """`base` where a fraction of requests begin with one of `num_prefixes` shared prefixes.

    `round(shared_fraction * num_requests)` requests, chosen at random, get a shared prefix
    (a system prompt) of `prefix_len` tokens prepended to their prompt; each picks one of the
    `num_prefixes` prefixes at random. `max_seq_len` grows by `prefix_len` for every request,
    since a contiguous cache cannot know in advance which requests carry the prefix.

    Args:
        base: a workload without shared prefixes.
        shared_fraction: in [0, 1].
        prefix_len: in [1, MAX_SEQ_LEN - base.max_seq_len], tokens of each shared prefix.
        num_prefixes: in [1, MAX_NUM_REQUESTS], number of distinct prefixes (prefix groups).
        seed: an int >= 0, the seed of `numpy.random.default_rng`.

    Raises ValueError for an argument out of range, naming it.
    """
    if not isinstance(base, Workload):
        raise ValueError(f"base={base!r}: must be a Workload")
    if len(base.prefix_lens):
        raise ValueError(
            f"base has {len(base.prefix_lens)} prefix groups: must have none to add shared prefixes"
        )
    shared_fraction = _check_fraction("shared_fraction", shared_fraction)
    prefix_len = _check_count("prefix_len", prefix_len, 1, MAX_SEQ_LEN - base.max_seq_len)
    num_prefixes = _check_count("num_prefixes", num_prefixes, 1, MAX_NUM_REQUESTS)
    check_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    num_shared = int(round(shared_fraction * base.num_requests))
    shared_ids = rng.permutation(base.num_requests)[:num_shared]
    group = np.full(base.num_requests, -1, dtype=np.int64)
    group[shared_ids] = rng.integers(0, num_prefixes, size=num_shared)
    return Workload(
        prompt_lens=base.prompt_lens + np.where(group >= 0, prefix_len, 0),
        output_lens=base.output_lens,
        max_seq_len=base.max_seq_len + prefix_len,
        prefix_group=group,
        prefix_lens=np.full(num_prefixes, prefix_len, dtype=np.int64),
        name=f"{base.name}; {shared_fraction:.0%} share a {prefix_len}-token prefix",
    )


def _uniform_up_to(num_requests: int, max_seq_len: int, seed: int = 0) -> Workload:
    prompt_hi = max(1, max_seq_len // 2)
    return uniform(
        num_requests,
        prompt_len=(1, prompt_hi),
        output_len=(0, max_seq_len - prompt_hi),
        max_seq_len=max_seq_len,
        seed=seed,
    )


def _chat(num_requests: int, max_seq_len: int, seed: int = 0) -> Workload:
    median = max(1, min(256, max_seq_len // 8))
    return lognormal(num_requests, median, median, sigma=1.0, max_seq_len=max_seq_len, seed=seed)


def _long_prompt(num_requests: int, max_seq_len: int, seed: int = 0) -> Workload:
    prompt_median = max(1, min(2048, max_seq_len // 4))
    output_median = max(1, min(128, max_seq_len // 32))
    return lognormal(
        num_requests, prompt_median, output_median, sigma=0.6, max_seq_len=max_seq_len, seed=seed
    )


# name -> generator(num_requests, max_seq_len, seed) -> Workload, every request <= max_seq_len.
DISTRIBUTIONS: dict[str, Callable[[int, int, int], Workload]] = {
    "chat (lognormal)": _chat,
    "long prompt (lognormal)": _long_prompt,
    "uniform": _uniform_up_to,
}


def make_workload(
    distribution: str,
    num_requests: int,
    max_seq_len: int,
    shared_fraction: float = 0.0,
    prefix_len: int = 0,
    num_prefixes: int = 1,
    seed: int = 0,
) -> Workload:
    """A `DISTRIBUTIONS[distribution]` workload plus a shared-prefix fraction, within `max_seq_len`.

    The base lengths are drawn within `max_seq_len - prefix_len` so that, prefix included, the
    result's `max_seq_len` is exactly `max_seq_len` (e.g. the model's context length) whatever
    the shared fraction. `shared_fraction=0` or `prefix_len=0` gives no shared prefix.

    Raises ValueError for an unknown `distribution`, `prefix_len` not in [0, max_seq_len), and
    as the generators (max_seq_len at most MAX_SEQ_LEN, seed an int >= 0).
    """
    if not isinstance(distribution, str) or distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution={distribution!r}: must be one of {sorted(DISTRIBUTIONS)}")
    max_seq_len = _check_count("max_seq_len", max_seq_len, 1)
    prefix_len = _check_count("prefix_len", prefix_len, 0)
    if prefix_len >= max_seq_len:
        raise ValueError(f"prefix_len={prefix_len}: must be in [0, max_seq_len={max_seq_len})")
    shared_fraction = _check_fraction("shared_fraction", shared_fraction)
    check_int("seed", seed, 0)
    base = DISTRIBUTIONS[distribution](num_requests, max_seq_len - prefix_len, seed)
    if shared_fraction == 0 or prefix_len == 0:
        return replace(base, max_seq_len=max_seq_len)
    return shared_prefix(base, shared_fraction, prefix_len, num_prefixes, seed=seed + 1)
