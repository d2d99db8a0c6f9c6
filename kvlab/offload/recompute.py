"""K and V of a decoder layer from its stored input activations: KVPR's recomputation.

KVPR keeps, for every cached token and layer, the activation that W_K and W_V multiply: the layer's
input after the attention norm (`kvlab.model.attention.attention_input`). From it,

    K = X W_K^T (+ b_K),  V = X W_V^T (+ b_V),  and for RoPE families K <- rope(K, position),

with the token's absolute position in its sequence (so a recomputed prefix [0:l] gets positions
0..l-1, and a copied suffix keeps the positions it was written with): what
`kvlab.model.attention.project_kv` computes, here for a range of tokens of a batch, in place, in
the runtime's token-major layout.
"""

from __future__ import annotations

import torch

from kvlab.config import ModelConfig
from kvlab.model.rope import RopeTable, apply_rope
from kvlab.model.weights import AttentionWeights


def recompute_kv(model: ModelConfig, w: AttentionWeights, x: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, start: int, rope: RopeTable | None) -> None:
    """K, V of a range of tokens [start, start + n) of a batch, written in place: x [n, batch,
    hidden] (token-major, as the runtime's buffers hold it) into k, v [n, batch, num_kv_heads,
    head_dim] (contiguous). Equal to `project_kv` at positions start..start + n - 1 for each
    sequence, in fewer operations (the runtime is host-bound on small ones): the GEMMs write
    into k and v, RoPE turns k in place with a slice of the table, no gather."""
    if x.dim() != 3 or x.shape[2] != model.hidden_size:
        raise ValueError(f"x.shape={tuple(x.shape)}: must be [tokens, batch, {model.hidden_size}]")
    shape = (*x.shape[:2], model.num_kv_heads, model.head_dim)
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name}.shape={tuple(t.shape)}: must be {shape}, contiguous")
    if model.position == "rope" and rope is None:
        raise ValueError(f"rope=None: {model.name} needs a RopeTable")
    rows = x.reshape(-1, model.hidden_size)
    for weight, bias, out in ((w.w_k, w.b_k, k), (w.w_v, w.b_v, v)):
        out = out.view(rows.shape[0], model.kv_size)
        if bias is None:
            torch.mm(rows, weight.t(), out=out)
        else:
            torch.addmm(bias, rows, weight.t(), out=out)
    if model.position == "rope":
        end = start + x.shape[0]
        apply_rope(k, rope.cos[start:end, None, None, :], rope.sin[start:end, None, None, :],
                   out=k)
