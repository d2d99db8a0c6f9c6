"""A decoder layer's weights: `AttentionWeights` and `LayerWeights` (nn.Linear layout,
[out_features, in_features]), seeded random ones of a model's published shapes, their tensors by
name, and the check that a list of layers is a model's.

`fuse` stacks a layer's projections that share an input (Q, K, V; gate, up), so that a decode
step runs one GEMM where it ran three or two: at a small batch each GEMM reads its weights at
well under the copy roofline, and fewer, larger ones read faster.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvlab.cache.paged_cache import check_device
from kvlab.config import ModelConfig


def seeded_randn(seed: int, dtype, device):
    """`rand(*shape, scale=1.0)`: normal samples from a generator seeded with `seed`, made on
    `device` (so the weights of a 30B model never pass through the host). On the "meta" device
    the tensors have shapes and no data (to size things without allocating them)."""
    if torch.device(device).type == "meta":
        return lambda *shape, scale=1.0: torch.empty(*shape, dtype=dtype, device="meta")
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    return rand


@dataclass
class AttentionWeights:
    """One layer's attention parameters (nn.Linear layout: [out_features, in_features])."""

    w_q: torch.Tensor  # [num_qo_heads * head_dim, hidden]
    w_k: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    w_v: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    w_o: torch.Tensor  # [hidden, num_qo_heads * head_dim]
    b_q: torch.Tensor | None
    b_k: torch.Tensor | None
    b_v: torch.Tensor | None
    norm_weight: torch.Tensor  # [hidden]
    norm_bias: torch.Tensor | None  # LayerNorm only

    @classmethod
    def random(cls, model: ModelConfig, seed: int, dtype=torch.float32, device="cpu"):
        """Seeded random weights of `model`'s shapes, scaled so activations stay O(1)."""
        rand = seeded_randn(seed, dtype, device)
        h = model.hidden_size

        bias = model.qkv_bias
        return cls(
            w_q=rand(model.q_size, h, scale=h ** -0.5),
            w_k=rand(model.kv_size, h, scale=h ** -0.5),
            w_v=rand(model.kv_size, h, scale=h ** -0.5),
            w_o=rand(h, model.q_size, scale=model.q_size ** -0.5),
            b_q=rand(model.q_size, scale=0.1) if bias else None,
            b_k=rand(model.kv_size, scale=0.1) if bias else None,
            b_v=rand(model.kv_size, scale=0.1) if bias else None,
            norm_weight=1 + rand(h, scale=0.1),
            norm_bias=rand(h, scale=0.1) if model.norm == "layernorm" else None,
        )


@dataclass
class LayerWeights:
    attn: AttentionWeights
    b_o: torch.Tensor | None
    mlp_norm_weight: torch.Tensor
    mlp_norm_bias: torch.Tensor | None
    w_gate: torch.Tensor | None  # silu families only
    w_up: torch.Tensor
    b_up: torch.Tensor | None
    w_down: torch.Tensor
    b_down: torch.Tensor | None

    @classmethod
    def random(cls, model: ModelConfig, seed: int, dtype=torch.float32, device="cpu"):
        rand = seeded_randn(seed + 1_000_003, dtype, device)
        h, ffn, opt = model.hidden_size, model.intermediate_size, model.family == "opt"
        return cls(
            attn=AttentionWeights.random(model, seed, dtype, device),
            b_o=rand(h, scale=0.1) if opt else None,
            mlp_norm_weight=1 + rand(h, scale=0.1),
            mlp_norm_bias=rand(h, scale=0.1) if model.norm == "layernorm" else None,
            w_gate=None if opt else rand(ffn, h, scale=h ** -0.5),
            w_up=rand(ffn, h, scale=h ** -0.5),
            b_up=rand(ffn, scale=0.1) if opt else None,
            w_down=rand(h, ffn, scale=ffn ** -0.5),
            b_down=rand(h, scale=0.1) if opt else None,
        )


@dataclass(frozen=True)
class Fused:
    """A layer's stacked projections (see `fuse`): qkv [q_size + 2 kv_size, hidden] (W_Q, W_K,
    W_V) with b_qkv where the family has biases, and gate_up [2 intermediate, hidden] (W_gate,
    W_up; None for OPT, which has no gate)."""

    qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    gate_up: torch.Tensor | None


def fuse(w: LayerWeights) -> Fused:
    """Stack w's projections that share an input and point w's own fields at row blocks of the
    stacks (views, in place), so that nothing is stored twice and everything that reads w
    (the HF model sharing its tensors, the KVPR runtime) sees the same numbers."""
    a = w.attn
    qkv = torch.cat([a.w_q, a.w_k, a.w_v])
    rows = [len(a.w_q), len(a.w_k), len(a.w_v)]
    a.w_q, a.w_k, a.w_v = qkv.split(rows)
    b_qkv = None
    if a.b_q is not None:
        b_qkv = torch.cat([a.b_q, a.b_k, a.b_v])
        a.b_q, a.b_k, a.b_v = b_qkv.split(rows)
    gate_up = None
    if w.w_gate is not None:
        gate_up = torch.cat([w.w_gate, w.w_up])
        w.w_gate, w.w_up = gate_up.split([len(w.w_gate), len(w.w_up)])
    return Fused(qkv, b_qkv, gate_up)


def random_layers(model: ModelConfig, seed: int = 0, dtype=torch.float32, device="cpu",
                  num_layers: int | None = None) -> list[LayerWeights]:
    """Seeded random weights for the first `num_layers` layers (default: all) of `model`."""
    count = model.num_layers if num_layers is None else num_layers
    return [LayerWeights.random(model, seed + 7919 * i, dtype, device) for i in range(count)]


def resolve_device(device) -> torch.device:
    """`device` with its index: "cuda" means the current CUDA device. Raises ValueError, as
    PagedKVCache does, for what is not a device or a CUDA device that is not there."""
    device = check_device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


KV_FIELDS = ("attn.w_k", "attn.b_k", "attn.w_v", "attn.b_v")  # what recomputation needs


def named_tensors(w: LayerWeights) -> dict[str, torch.Tensor]:
    """The layer's tensors by dotted field name ("attn.w_k", "w_up", ...), KV_FIELDS first;
    fields that are None (biases a family lacks) are left out."""
    named = {}
    for field in dataclasses.fields(w):
        value = getattr(w, field.name)
        if dataclasses.is_dataclass(value):
            named.update({f"{field.name}.{f.name}": getattr(value, f.name)
                          for f in dataclasses.fields(value)})
        else:
            named[field.name] = value
    named = {name: t for name, t in named.items() if t is not None}
    return {**{n: named[n] for n in KV_FIELDS if n in named},
            **{n: t for n, t in named.items() if n not in KV_FIELDS}}


def check_layers(model: ModelConfig, layers: list[LayerWeights], dtype: torch.dtype,
                 device) -> None:
    """Raise ValueError unless `layers` are `model`'s num_layers layers, each tensor with the
    shape `random_layers(model)` gives it (and None where it gives None), of `dtype`, on
    `device`. The error names the first wrong layer and tensor."""
    if len(layers) != model.num_layers:
        raise ValueError(f"len(layers)={len(layers)}: must be {model.name}'s {model.num_layers}")
    device = resolve_device(device)
    shapes = {name: tuple(t.shape)
              for name, t in named_tensors(LayerWeights.random(model, 0, device="meta")).items()}
    for i, w in enumerate(layers):
        if not isinstance(w, LayerWeights):
            raise ValueError(f"layers[{i}]: {type(w).__name__}, must be LayerWeights")
        tensors = named_tensors(w)
        for name in [*shapes, *(n for n in tensors if n not in shapes)]:
            t, shape, where = tensors.get(name), shapes.get(name), f"layers[{i}].{name}"
            if (None if t is None else tuple(t.shape)) != shape:
                got = "None" if t is None else f"shape {tuple(t.shape)}"
                raise ValueError(f"{where}: {got}, must be {shape} for {model.name}")
            if t.dtype != dtype:
                raise ValueError(f"{where}: {t.dtype}, must be {dtype}")
            if t.device != device:
                raise ValueError(f"{where}: on {t.device}, must be on {device}")
