"""Batched decode attention over a PagedKVCache with the CUDA C kernels.

`DecodePlan` does the per-step work once (block tables and lengths on the device, the kernel and
its split chosen, kernels compiled); `DecodePlan.run` is then called once per layer and only
launches. `decode_attention` is both in one call.
"""

import torch

from kvlab.arith import ceil_div
from kvlab.cache.fp8 import FP8_DTYPE
from kvlab.checks import check_num_heads, check_positive_int, is_int
from kvlab.kernels import KERNEL_FAMILIES, KERNELS, green, select, tune, vllm_v1
from kvlab.kernels.families import family_for_layout
from kvlab.kernels.geometry import check_launch
from kvlab.kernels.gqa import query_dtypes
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.reference import softmax_scale

SHORT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "fp8": "fp8"}  # for messages


def dtype_label(dtype) -> str:
    """A cache dtype's name in KernelFamily.cache_dtypes: "float16", "bfloat16" or "fp8"."""
    return "fp8" if dtype == FP8_DTYPE else str(dtype).removeprefix("torch.")


def check_kernel(kernel: str, cache, num_qo_heads: int) -> None:
    """Raise ValueError unless `kernel` can run on `cache` with `num_qo_heads` query heads."""
    if kernel not in KERNEL_FAMILIES:
        raise ValueError(f"kernel={kernel!r}: must be one of {KERNELS}")
    family = KERNEL_FAMILIES[kernel]
    if cache.layout != family.layout:
        raise ValueError(
            f"cache.layout={cache.layout!r}: kernel={kernel!r} reads the {family.layout!r} layout"
        )
    if dtype_label(cache.dtype) not in family.cache_dtypes:
        reads = " and ".join(SHORT_DTYPES[d] for d in family.cache_dtypes)
        readers = " or ".join(f"kernel={f.name!r} (layout {f.layout!r})"
                              for f in KERNEL_FAMILIES.values() if "fp8" in f.cache_dtypes)
        raise ValueError(f"cache.dtype={cache.dtype}: kernel={kernel!r} reads {reads} caches; "
                         f"an fp8 cache is read by {readers}")
    family.check_shape(cache.block_size, num_qo_heads, cache.num_kv_heads)


def auto_kernel(cache) -> str:
    """The kernel family `kernel="auto"` runs: the one that reads the cache's layout."""
    return family_for_layout(cache.layout)


def _check_plan(cache, num_qo_heads: int, kernel: str, prefetch) -> str:
    """Raise ValueError unless a plan can run `kernel` on `cache`; returns the kernel family."""
    _check_cache(cache)
    check_num_heads(num_qo_heads, cache.num_kv_heads)
    chosen = auto_kernel(cache) if kernel == "auto" else kernel
    check_kernel(chosen, cache, num_qo_heads)
    if prefetch is not None and not isinstance(prefetch, PrefetchConfig):
        raise ValueError(f"prefetch={prefetch!r}: must be a PrefetchConfig or None")
    return chosen


def _check_values(cache, scale, num_sms) -> float:
    """The softmax scale (`softmax_scale`); ValueError for it, or for a num_sms that is not a
    positive integer or None (its upper bound, the GPU's SMs, is checked in `_setup`)."""
    if num_sms is not None:
        check_positive_int("num_sms", num_sms)
    return softmax_scale(scale, cache.head_dim)


def _check_cache(cache) -> None:
    if cache.device.type != "cuda":
        raise ValueError(f"cache.device={cache.device}: the CUDA kernels need a CUDA device")
    if cache.dtype not in (*vllm_v1.CUDA_TYPES, FP8_DTYPE):
        raise ValueError(
            f"cache.dtype={cache.dtype}: the CUDA kernels support "
            f"{(*vllm_v1.CUDA_TYPES, FP8_DTYPE)}"
        )


def _check_q_dtype(cache, q_dtype):
    """The dtype of q and out: q_dtype, or the default for the cache; ValueError unless the
    kernels take it over the cache's dtype."""
    allowed = query_dtypes(cache.dtype)
    if q_dtype is None:
        return allowed[0]
    if q_dtype not in allowed:
        raise ValueError(f"q_dtype={q_dtype}: over a cache of {cache.dtype} q and out must be one "
                         f"of {allowed}")
    return q_dtype


def _check_tensor(name: str, t, shape: tuple, dtype, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: must be {shape}")
    if t.dtype != dtype:
        raise ValueError(f"{name}.dtype={t.dtype}: must be {dtype}")
    if t.device != device:
        raise ValueError(f"{name}.device={t.device}: must be {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous())")
    if t.data_ptr() % 16:  # the kernels move 8- and 16-byte vectors
        raise ValueError(f"{name}: must start on a 16-byte boundary, starts "
                         f"{t.data_ptr() % 16} bytes past one (call .clone())")


class DecodePlan:
    """One decode step's plan for a batch of sequences of a paged cache.

    Args:
        cache: a PagedKVCache on a CUDA device, fp16, bf16 or fp8 (float8_e4m3fn: kernel "gqa"
            only, which dequantises in registers).
        seq_ids: the B live sequences to decode, in the order of q's rows.
        num_qo_heads: query heads, a multiple of cache.num_kv_heads.
        kernel: "auto", "vllm_v1" (layout "vllm", block sizes 8/16/32) or "gqa" (layout "hnd",
            block sizes 8..256, groups 1..8). "auto" runs the family that reads the cache's
            layout and, when prefetch is None, the fastest prefetch setting: measured on this GPU
            on the first plan of a shape bucket (kvlab.kernels.tune; tens of ms plus compiling
            the candidates), or, with KVLAB_AUTOTUNE=0, taken from the recorded H200 benchmark
            for the nearest shape (kvlab.kernels.select).
        prefetch: a PrefetchConfig; None means no prefetch (or, with "auto", the fastest).
        scale: softmax scale, default 1 / sqrt(head_dim); a finite number fp32 holds.
        num_sms: the SMs the launches will have, for the split policies; None: those of the
            enclosing `kvlab.kernels.green.sm_limit` block, else the whole GPU's.
        q_dtype: the dtype of q and out. None: the cache's, fp16 over an fp8 cache. Over an fp8
            cache it may be float16 or bfloat16; over others it is the cache's.
    The plan captures the sequences' block tables and lengths now: make a new plan after the
    cache changes (once per decode step), and reuse it for every layer of that step.
    Raises ValueError, before anything is allocated on the GPU or launched, for anything the
    kernels cannot run (more than geometry.MAX_GRID_YZ sequences among them).
    """

    def __init__(self, cache, seq_ids, num_qo_heads: int, kernel: str = "auto",
                 prefetch: PrefetchConfig | None = None, scale: float | None = None,
                 num_sms: int | None = None, q_dtype=None):
        chosen = _check_plan(cache, num_qo_heads, kernel, prefetch)
        q_dtype = _check_q_dtype(cache, q_dtype)
        scale = _check_values(cache, scale, num_sms)
        seq_ids = list(seq_ids)
        if not seq_ids:
            raise ValueError("seq_ids=[]: must name at least one sequence")
        host_seq_lens = [cache.manager.seq_len(s) for s in seq_ids]
        check_launch(chosen, len(seq_ids), max(host_seq_lens))
        self._setup(cache, cache.block_tables(seq_ids), cache.seq_lens(seq_ids), host_seq_lens,
                    num_qo_heads, chosen, kernel == "auto" and prefetch is None, prefetch, scale,
                    num_sms, q_dtype, tune_here=True)

    @classmethod
    def for_capture(cls, cache, num_seqs: int, max_seq_len: int, num_qo_heads: int,
                    kernel: str = "auto", prefetch: PrefetchConfig | None = None,
                    scale: float | None = None, num_sms: int | None = None,
                    q_dtype=None) -> "DecodePlan":
        """A plan to capture in a CUDA graph and replay for changing batches of at most
        num_seqs sequences of at most max_seq_len tokens. Its `block_tables` (int32 [num_seqs,
        ceil(max_seq_len / block_size)]) and `seq_lens` (int32 [num_seqs]) are device buffers
        the caller fills in place before each replay; a row no sequence uses keeps a valid
        block id and a length of at least 1 (they start as block 0 and length 1). The kernels'
        split is planned for num_seqs sequences of max_seq_len tokens: shorter ones leave some
        CTAs with nothing to do. With kernel="auto" and prefetch None the prefetch setting is
        the recorded choice (nothing is timed). ValueError, before anything is allocated, for a
        max_seq_len longer than the cache holds, besides what DecodePlan refuses."""
        chosen = _check_plan(cache, num_qo_heads, kernel, prefetch)
        q_dtype = _check_q_dtype(cache, q_dtype)
        scale = _check_values(cache, scale, num_sms)
        check_positive_int("max_seq_len", max_seq_len)
        capacity = cache.num_blocks * cache.block_size
        if max_seq_len > capacity:
            raise ValueError(f"max_seq_len={max_seq_len}: the cache holds at most {capacity} "
                             "tokens")
        check_launch(chosen, num_seqs, max_seq_len)
        num_seqs, max_seq_len = int(num_seqs), int(max_seq_len)
        width = ceil_div(max_seq_len, cache.block_size)
        plan = cls.__new__(cls)
        plan._setup(cache, torch.zeros(num_seqs, width, dtype=torch.int32, device=cache.device),
                    torch.ones(num_seqs, dtype=torch.int32, device=cache.device),
                    [int(max_seq_len)] * num_seqs, num_qo_heads, chosen,
                    kernel == "auto" and prefetch is None, prefetch, scale, num_sms, q_dtype,
                    tune_here=False)
        return plan

    def _setup(self, cache, block_tables, seq_lens, host_seq_lens, num_qo_heads, chosen: str,
               choose_prefetch: bool, prefetch, scale, num_sms, q_dtype,
               tune_here: bool) -> None:
        self.block_tables = block_tables  # int32 [B, max_num_blocks]
        self.seq_lens = seq_lens  # int32 [B]
        self.host_seq_lens = host_seq_lens  # what the split plans
        self.max_seq_len = max(self.host_seq_lens)
        self.cache, self.kernel, self.num_qo_heads = cache, chosen, num_qo_heads
        self.q_dtype = q_dtype  # of q and out
        self.scale = scale
        total = green.device_sms(cache.device)
        if num_sms is not None and (not is_int(num_sms) or not 1 <= num_sms <= total):
            raise ValueError(f"num_sms={num_sms!r}: must be an integer in [1, {total}] (this "
                             "GPU's SMs) or None")
        self.num_sms = green.current_sms(cache.device) if num_sms is None else int(num_sms)
        if choose_prefetch:
            prefetch = self._auto_prefetch() if tune_here else self._recorded_prefetch()
        self.prefetch = prefetch or PrefetchConfig()
        self.launcher = self._launcher(self.prefetch)

    def _launcher(self, prefetch: PrefetchConfig):
        launcher = KERNEL_FAMILIES[self.kernel].launcher_class()
        return launcher(self.cache, self.num_qo_heads, self.host_seq_lens, prefetch, self.num_sms,
                        self.q_dtype)

    def _recorded_prefetch(self) -> PrefetchConfig:
        return select.best_prefetch(self.kernel, self.num_qo_heads, self.cache.num_kv_heads,
                                    self.cache.block_size, self.num_seqs, self.max_seq_len)

    def _auto_prefetch(self) -> PrefetchConfig:
        cache = self.cache
        recorded = self._recorded_prefetch
        if not tune.enabled():
            return recorded()
        q = torch.zeros(self.num_seqs, self.num_qo_heads, cache.head_dim, dtype=self.q_dtype,
                        device=cache.device)
        out = torch.empty_like(q)

        def make_run(prefetch):
            launcher = self._launcher(prefetch)
            return lambda: launcher(out, q, cache.k_cache, cache.v_cache, self.block_tables,
                                    self.seq_lens, self.scale)

        key = tune.bucket(cache, self.kernel, self.num_qo_heads, self.num_seqs, self.max_seq_len,
                          self.num_sms)
        return tune.fastest(key, cache.device, make_run, recorded)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    def run(self, q: torch.Tensor, k_cache: torch.Tensor | None = None,
            v_cache: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of q against one layer's paged K/V (default: the cache's own tensors).

        q: [B, num_qo_heads, head_dim] in the plan's q_dtype, contiguous.
        k_cache, v_cache: the shapes, dtype and device of cache.k_cache / cache.v_cache (an fp8
        cache's scales go with them: other layers need plans of their own caches). out: where to
        write, like q (default: a new tensor). Returns out.
        """
        cache = self.cache
        k_cache = cache.k_cache if k_cache is None else k_cache
        v_cache = cache.v_cache if v_cache is None else v_cache
        q_shape = (self.num_seqs, self.num_qo_heads, cache.head_dim)
        _check_tensor("q", q, q_shape, self.q_dtype, cache.device)
        _check_tensor("k_cache", k_cache, tuple(cache.k_cache.shape), cache.dtype, cache.device)
        _check_tensor("v_cache", v_cache, tuple(cache.v_cache.shape), cache.dtype, cache.device)
        if out is None:
            out = torch.empty_like(q)
        _check_tensor("out", out, q_shape, self.q_dtype, cache.device)
        self.launcher(out, q, k_cache, v_cache, self.block_tables, self.seq_lens, self.scale)
        return out


def decode_attention(q: torch.Tensor, cache, seq_ids, kernel: str = "auto",
                     prefetch: PrefetchConfig | None = None, scale: float | None = None,
                 num_sms: int | None = None):
    """One decode step of attention with a CUDA kernel: `DecodePlan(...).run(q)`.

    q: [B, num_qo_heads, head_dim], the cache's dtype (fp16 or bf16 over an fp8 cache), on its
    device.
    Returns the same shape and dtype. See DecodePlan for the arguments and errors.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        shape = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"q: must be a 3-d torch.Tensor [B, num_qo_heads, head_dim], got {shape}")
    q_dtype = q.dtype if cache.dtype == FP8_DTYPE else None  # otherwise run() names q's dtype
    return DecodePlan(cache, seq_ids, q.shape[1], kernel, prefetch, scale,
                      q_dtype=q_dtype).run(q)
