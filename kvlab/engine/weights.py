"""A whole decoder's weights: the token (and, for OPT, position) embeddings, the decoder layers,
the final norm and the LM head.

The layers are `kvlab.model.weights.LayerWeights`, the one implementation of each family's layer
that the KVPR runtime also runs. What is added here is what only a whole model has:

- embed [vocab_size, hidden_size]: the token embedding;
- positions [max_position + 2, hidden_size] (OPT only): learned positions, row p + 2 for
  position p, as HF's OPTLearnedPositionalEmbedding stores them (its offset of 2);
- norm_weight, norm_bias [hidden_size]: the final norm (LayerNorm for OPT, RMSNorm otherwise);
- lm_head [vocab_size, hidden_size]: the output projection; OPT ties it to embed (the same tensor),
  as HF's OPT does; Llama and Qwen2 presets have their own.

Each layer's projections that share an input are stacked when the weights are made
(`kvlab.model.weights.fuse`: the layers' own tensors become views of the stacks), so that a
decode step runs one GEMM for Q, K and V and one for the MLP's gate and up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvlab.cache.paged_cache import check_fits
from kvlab.checks import check_int
from kvlab.config import ModelConfig
from kvlab.model.weights import (
    Fused,
    LayerWeights,
    check_layers,
    fuse,
    named_tensors,
    random_layers,
    resolve_device,
    seeded_randn,
)

OPT_POSITION_OFFSET = 2  # HF's OPT keeps two unused rows before position 0
# the seeds of random weights: torch's generators take [-2**63, 2**64), and each tensor's seed
# is the model's plus an offset of a few million
SEED_RANGE = (-2**63, 2**63 - 1)


@dataclass
class ModelWeights:
    embed: torch.Tensor
    positions: torch.Tensor | None
    layers: list[LayerWeights]
    norm_weight: torch.Tensor
    norm_bias: torch.Tensor | None
    lm_head: torch.Tensor
    fused: list[Fused] = field(init=False, repr=False)

    def __post_init__(self):
        self.fused = [fuse(w) for w in self.layers]

    @classmethod
    def random(cls, model: ModelConfig, seed: int = 0, dtype=torch.float32,
               device="cpu") -> ModelWeights:
        """Seeded random weights of `model`'s shapes (the layers as `random_layers` makes them),
        made on `device`; scaled so that activations and logits stay O(1). Raises ValueError
        for a seed out of SEED_RANGE, a bad device, or weights that do not fit in the device's
        free memory (OPT's learned positions alone are max_position + 2 rows), before
        allocating anything."""
        check_int("seed", seed, *SEED_RANGE)
        seed, device = int(seed), resolve_device(device)
        if device.type != "meta":
            check_fits(f"model={model.name!r}: its random weights",
                       cls.random(model, dtype=dtype, device="meta").nbytes, device)
        rand = seeded_randn(seed + 2_000_003, dtype, device)
        h, opt = model.hidden_size, model.family == "opt"
        # 2 / sqrt(h): OPT's tied LM head then gives logits of O(1) as well
        embed = rand(model.vocab_size, h, scale=2 * h ** -0.5)
        return cls(
            embed=embed,
            positions=rand(model.max_position + OPT_POSITION_OFFSET, h, scale=h ** -0.5) if opt
            else None,
            layers=random_layers(model, seed, dtype, device),
            norm_weight=1 + rand(h, scale=0.1),
            norm_bias=rand(h, scale=0.1) if model.norm == "layernorm" else None,
            lm_head=embed if opt else rand(model.vocab_size, h, scale=h ** -0.5),
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors, each counted once (OPT's LM head is its embedding)."""
        own = [self.embed, self.positions, self.norm_weight, self.norm_bias,
               None if self.lm_head is self.embed else self.lm_head]
        layers = [t for w in self.layers for t in named_tensors(w).values()]  # views of `fused`
        return sum(t.nbytes for t in own + layers if t is not None)

    def check(self, model: ModelConfig) -> None:
        """Raise ValueError unless every tensor has `model`'s shape, one dtype and one device;
        the message names the first wrong tensor."""
        h, dtype, device = model.hidden_size, self.dtype, self.device
        opt = model.family == "opt"
        expected = {
            "embed": (model.vocab_size, h),
            "positions": (model.max_position + OPT_POSITION_OFFSET, h) if opt else None,
            "norm_weight": (h,),
            "norm_bias": (h,) if model.norm == "layernorm" else None,
            "lm_head": (model.vocab_size, h),
        }
        for name, shape in expected.items():
            t = getattr(self, name)
            got = None if t is None else tuple(t.shape)
            if got != shape:
                raise ValueError(f"weights.{name}: {'None' if t is None else f'shape {got}'}, "
                                 f"must be {shape} for {model.name}")
            if t is not None and (t.dtype, t.device) != (dtype, device):
                raise ValueError(f"weights.{name}: {t.dtype} on {t.device}, must be {dtype} on "
                                 f"{device} like weights.embed")
        check_layers(model, self.layers, dtype, device)
