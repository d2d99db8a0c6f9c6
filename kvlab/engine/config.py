"""`EngineConfig`: the arguments of `kvlab.LLM`, checked and resolved before anything is allocated.

Each check raises ValueError naming the parameter, the value and what is allowed. Defaults that
depend on the machine or on other arguments ("auto" attention, dtype, device, num_blocks,
graph_max_len, async_decode) are resolved here, so that the scheduler and the runner read plain
values. `dataclasses.replace(config, attention=...)` checks the new combination again
(`LLM.with_attention`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from kvlab.arith import ceil_div
from kvlab.checks import check_block_size, check_bool, check_int, check_positive_int
from kvlab.config import MAX_AHEAD_BYTES, MODELS, ModelConfig
from kvlab.engine import checkpoint, offloaded, tp
from kvlab.engine.weights import SEED_RANGE, ModelWeights
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.model.weights import resolve_device
from kvlab.offload.scheduler import LinkAndCompute

ATTENTIONS = ("auto", "reference", "vllm_v1", "gqa")
DEFAULT_CACHED_TOKENS = 65536
DEFAULT_PREFILL_TOKENS = 8192
DEFAULT_GRAPH_MAX_LEN = 8192


@dataclass(frozen=True)
class EngineConfig:
    """The arguments of `kvlab.LLM`, checked, with their defaults resolved.

    Args:
        model: a kvlab.MODELS preset name or a ModelConfig (seeded random weights), or the path
            of a local Hugging Face checkpoint folder (config.json and safetensors; Llama,
            Qwen2 or OPT: kvlab.engine.checkpoint). Resolved to its ModelConfig.
        attention: one of ATTENTIONS: "reference" (kvlab.reference, fp32, any device), or on a
            GPU the CUDA kernels "vllm_v1", "gqa" or "auto" (kvlab.DecodePlan; "auto" takes the
            fastest for the cache's layout). "auto" resolves to "reference" off a GPU, and to
            offloaded.ATTENTION with offload.
        prefetch: a PrefetchConfig for the CUDA kernels (None: none, or the fastest with "auto").
        ahead_bytes: the cross-kernel L2 prefetch of a decode step (kvlab.model.layer.Ahead):
            kvlab's kernels before each GEMM (the linears' last waves, the RMSNorms, SwiGLU's
            product) bring this many of its weight's first bytes into L2; an integer in
            [0, MAX_AHEAD_BYTES], default 0 (off). With a CUDA attention (the paged cache on
            a GPU).
        ahead_kv_bytes: the same for the K and V blocks of each layer's attention
            (kvlab.model.layer.KvAhead): the layer's QKV linear, at steps of at most
            layer_ops.LINEAR_ROWS rows, brings up to this many of them into L2 as it drains, the
            rows' first blocks first; an integer in [0, MAX_AHEAD_BYTES], default 0 (off). With a
            CUDA attention.
        dtype: of the weights and the cache; default fp16 on a GPU, fp32 on the CPU.
        device: "cpu" or a CUDA device; default "cuda" when kvlab.backend() is "cuda", else
            "cpu".
        seed: of the random weights (and the default of generate's sampling seed), an
            integer in SEED_RANGE.
        block_size: tokens per cache block (8, 16 or 32 for vllm_v1; 8-256 otherwise).
        num_blocks: blocks in the cache, shared by all layers; default enough for 65,536 tokens.
            Their K, V tensors must fit in the device's free memory together with the weights
            the LLM makes or loads (the runner checks it).
        cuda_graphs: replay decode steps as CUDA graphs (kvlab.engine.graphs) for batches of
            up to 256 sequences of up to graph_max_len tokens, eagerly beyond; None (kept as
            given): True with the CUDA kernels (they alone can be captured). With offload: the
            runtime's graphs around the attention (default True on a GPU).
        graph_max_len: the longest sequence a graph serves (the longest span a graph's kernels
            are planned for; like vLLM's max_seq_len_to_capture), default the model's context
            limit or 8192, whichever is less; no more than the cache holds is used.
        max_prefill_tokens: the most prompt tokens one prefill pass takes (the requests admitted
            together, in order; a longer prompt is prefilled alone), default 8192.
        offload: keep the K, V in host memory and decode through the KVPR runtime
            (kvlab.engine.offloaded) instead of on a paged cache: attention "auto", no
            num_blocks, prefetch or tensor_parallel.
        offload_rates: with offload, the link and GPU rates (a LinkAndCompute) that choose each
            step's split; default None measures them on the GPU at each generate; a CPU run
            needs them given.
        tensor_parallel: run this rank's shard of the model (kvlab.engine.tp) in a
            torch.distributed group that the caller has initialised, one process per device
            (`torchrun --nproc-per-node N ...`); every rank then calls generate alike and
            gets the same tokens.
        async_decode: queue each decode step before the previous step's tokens reach the host
            (kvlab.engine.llm's docstring); default True on a GPU. Not with offload.
        weights: a ModelWeights of `model` in `dtype` on `device` to run as they are (the same
            tensors, not a copy) instead of seeded random ones; `model` is then a preset name
            or a ModelConfig. With tensor_parallel, this rank's shard.

    Found here: checkpoint_path (the checkpoint folder, or None), local (the shape this rank
    computes: `model` itself without tensor parallelism), rank and world_size.
    Flags are bools (numpy's too), counts integers (numpy's too, never bools).
    """

    model: str | ModelConfig = "tiny-llama"
    attention: str = "auto"
    prefetch: PrefetchConfig | None = None
    ahead_bytes: int = 0
    ahead_kv_bytes: int = 0
    dtype: torch.dtype | None = None
    device: torch.device | str | None = None
    seed: int = 0
    block_size: int = 16
    num_blocks: int | None = None
    cuda_graphs: bool | None = None
    graph_max_len: int | None = None
    max_prefill_tokens: int = DEFAULT_PREFILL_TOKENS
    offload: bool = False
    offload_rates: LinkAndCompute | None = None
    tensor_parallel: bool = False
    async_decode: bool | None = None
    weights: ModelWeights | None = field(default=None, repr=False, compare=False)
    checkpoint_path: str | os.PathLike | None = field(init=False, default=None)
    local: ModelConfig = field(init=False, repr=False, default=None)
    rank: int = field(init=False, default=0)
    world_size: int = field(init=False, default=1)

    def __post_init__(self):
        # NOTE: the checks run in this order, each on what the ones before resolved: the first
        # argument at fault is the one named.
        self._check_flags()
        self._resolve_model_and_device()
        self._check_attention()
        self._check_weights()
        self._check_cache()

    @property
    def decode_graphs(self) -> bool:
        """Whether the paged cache's decode steps are replayed as CUDA graphs."""
        if self.offload:
            return False
        return self.attention != "reference" if self.cuda_graphs is None else self.cuda_graphs

    @property
    def offload_graphs(self) -> bool:
        """Whether the KVPR runtime runs CUDA graphs around its attention (offload only)."""
        return self.offload and self.device.type == "cuda" and self.cuda_graphs is not False

    def _set(self, **values) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _check_flags(self) -> None:
        self._set(cuda_graphs=as_flag("cuda_graphs", self.cuda_graphs, optional=True),
                  async_decode=as_flag("async_decode", self.async_decode, optional=True),
                  offload=as_flag("offload", self.offload),
                  tensor_parallel=as_flag("tensor_parallel", self.tensor_parallel))
        check_positive_int("max_prefill_tokens", self.max_prefill_tokens)
        for name in ("ahead_bytes", "ahead_kv_bytes"):
            check_int(name, getattr(self, name), 0, MAX_AHEAD_BYTES)
        self._set(max_prefill_tokens=int(self.max_prefill_tokens),
                  ahead_bytes=int(self.ahead_bytes), ahead_kv_bytes=int(self.ahead_kv_bytes))

    def _resolve_model_and_device(self) -> None:
        model, device = self.model, self.device
        path = model if checkpoint.is_checkpoint(model) else None
        if device is None:
            from kvlab.device import backend

            device = "cuda" if backend() == "cuda" else "cpu"
        device = resolve_device(device)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: the engine runs on 'cpu' or 'cuda' (a "
                             f"CUDA device's index too), not on {device.type!r}")
        self._set(checkpoint_path=path, device=device,
                  model=checkpoint.model_config(model) if path is not None else _preset(model))

    def _check_attention(self) -> None:
        attention, prefetch, cuda = self.attention, self.prefetch, self.device.type == "cuda"
        if attention not in ATTENTIONS:
            raise ValueError(f"attention={attention!r}: must be one of {ATTENTIONS}")
        _check_offload(self.offload, self.offload_rates, attention, prefetch, self.num_blocks,
                       self.tensor_parallel, self.async_decode,
                       (self.ahead_bytes, self.ahead_kv_bytes), cuda)
        if self.async_decode is None:
            self._set(async_decode=cuda and not self.offload)
        if self.offload:  # the runtime's attention; the paged cache's does not apply
            attention = offloaded.ATTENTION
        if attention == "auto" and not cuda:
            attention = "reference"
        if attention in ("vllm_v1", "gqa") and not cuda:
            raise ValueError(f"attention={attention!r}: the CUDA kernels need device='cuda' (here "
                             f"{self.device}); attention='reference' runs anywhere")
        for name in ("ahead_bytes", "ahead_kv_bytes"):
            if getattr(self, name) and attention not in ("auto", "vllm_v1", "gqa"):  # auto: GPU
                raise ValueError(f"{name}={getattr(self, name)}: the cross-kernel prefetch runs "
                                 "in the kernels of a GPU step in fp16 or bf16; needs a CUDA "
                                 f"attention (here {attention!r} on {self.device}), or 0")
        if prefetch is not None and (attention == "reference" or
                                     not isinstance(prefetch, PrefetchConfig)):
            raise ValueError(f"prefetch={prefetch!r}: must be None, or a PrefetchConfig with a "
                             "CUDA kernel")
        dtype = self.dtype or (torch.float16 if cuda else torch.float32)
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"dtype={dtype!r}: must be torch.float16, bfloat16 or float32")
        if attention not in ("reference", offloaded.ATTENTION) and dtype == torch.float32:
            raise ValueError("dtype=torch.float32: the CUDA kernels read fp16 or bf16 caches")
        self._set(attention=attention, dtype=dtype)

    def _check_weights(self) -> None:
        rank, world = _tensor_parallel_rank(self.tensor_parallel)
        local = tp.shard_config(self.model, world) if world > 1 else self.model
        self._set(rank=rank, world_size=world, local=local)
        weights = self.weights
        if weights is None:
            return
        if not isinstance(weights, ModelWeights) or self.checkpoint_path is not None:
            raise ValueError(f"weights={type(weights).__name__}: must be None, or a "
                             "ModelWeights with a preset name or a ModelConfig as model")
        weights.check(local)
        if (weights.dtype, weights.device) != (self.dtype, self.device):
            raise ValueError(f"weights: {weights.dtype} on {weights.device}, must be "
                             f"dtype={self.dtype} on device={self.device}")

    def _check_cache(self) -> None:
        block_size, num_blocks, graph_max_len = self.block_size, self.num_blocks, self.graph_max_len
        check_block_size(block_size)
        if self.attention == "vllm_v1" and block_size not in (8, 16, 32):
            raise ValueError(f"block_size={block_size}: vllm_v1 runs blocks of 8, 16 or 32")
        if num_blocks is None:
            num_blocks = ceil_div(DEFAULT_CACHED_TOKENS, block_size)
        check_positive_int("num_blocks", num_blocks)
        check_int("seed", self.seed, *SEED_RANGE)
        if self.cuda_graphs and self.attention == "reference":
            raise ValueError("cuda_graphs=True: must be a bool, and False with "
                             "attention='reference' (only the CUDA kernels can be captured)")
        if graph_max_len is None:
            graph_max_len = min(self.model.max_position, DEFAULT_GRAPH_MAX_LEN)
        check_positive_int("graph_max_len", graph_max_len)
        self._set(seed=int(self.seed), block_size=int(block_size), num_blocks=int(num_blocks),
                  graph_max_len=int(graph_max_len))


def as_flag(name: str, value, *, optional: bool = False) -> bool | None:
    """`value` as a bool (a numpy bool too), or None where `optional`; ValueError for anything
    else."""
    if optional and value is None:
        return None
    try:
        check_bool(name, value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: must be {'None or ' if optional else ''}a "
                         "bool") from None
    return bool(value)


def _check_offload(offload, rates, attention, prefetch, num_blocks, tensor_parallel,
                   async_decode, ahead: tuple[int, int], cuda: bool) -> None:
    """ValueError unless the offload arguments fit the others."""
    if not offload:
        if rates is not None:
            raise ValueError(f"offload_rates={rates!r}: only with offload=True")
        return
    if rates is not None and not isinstance(rates, LinkAndCompute):
        raise ValueError(f"offload_rates={rates!r}: must be None or a "
                         "kvlab.offload.scheduler.LinkAndCompute")
    if rates is None and not cuda:
        raise ValueError("offload_rates=None: a CPU run needs the link and GPU rates given (a "
                         "LinkAndCompute); on a GPU they are measured")
    for name, value, default in (("attention", attention, "auto"), ("prefetch", prefetch, None),
                                 ("num_blocks", num_blocks, None),
                                 ("tensor_parallel", tensor_parallel, False),
                                 ("async_decode", async_decode, None),
                                 ("ahead_bytes", ahead[0], 0), ("ahead_kv_bytes", ahead[1], 0)):
        if value != default:
            raise ValueError(f"{name}={value!r}: offload=True decodes through the KVPR runtime "
                             f"(its own attention, no paged cache); leave {name}={default!r}")


def _tensor_parallel_rank(tensor_parallel: bool) -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) without tensor parallelism."""
    if not tensor_parallel:
        return 0, 1
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        raise ValueError("tensor_parallel=True: needs an initialised torch.distributed process "
                         "group, one process per device (torchrun --nproc-per-node N ...)")
    return distributed.get_rank(), distributed.get_world_size()


def _preset(model) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model={model!r}: must be a ModelConfig, a checkpoint folder with a "
                         f"config.json, or one of {', '.join(MODELS)}")
    return MODELS[model]
