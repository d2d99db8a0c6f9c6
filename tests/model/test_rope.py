"""RoPE: the rotation is a complex rotation of each half-split pair, attention scores depend on
relative positions only, and the table's lookups equal computing cos and sin."""

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.rope import RopeTable, apply_rope, rope_cos_sin


def test_rope_matches_a_complex_rotation():
    # Pair i of the half-split convention is (x[i], x[i + d/2]); RoPE turns it by
    # pos * theta^(-2i/d).
    d, theta = 8, 10000.0
    x = torch.randn(5, 3, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(5) * 7
    cos, sin = rope_cos_sin(pos, d, theta, torch.float64)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:])
    angle = pos[:, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)
    turned = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    # the angles are fp32 (as in HF's rotary embedding): agreement to fp32 rounding
    expected = torch.cat([turned.real, turned.imag], -1)
    got = apply_rope(x, cos[:, None], sin[:, None])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_rope_scores_depend_on_relative_position_only():
    d = 16
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, d, dtype=torch.float64, generator=gen) for _ in "qk")

    def score(m, n):
        qm = apply_rope(q, *rope_cos_sin(torch.tensor([m]), d, 500000.0, torch.float64))
        kn = apply_rope(k, *rope_cos_sin(torch.tensor([n]), d, 500000.0, torch.float64))
        return (qm * kn).sum().item()

    assert score(3, 10) == pytest.approx(score(103, 110))
    assert abs(score(3, 10) - score(3, 11)) > 1e-2


def test_rope_table_lookup_equals_computing_it():
    model = MODELS["tiny-qwen"]
    table = RopeTable.build(model, 64, torch.float32, "cpu")
    positions = torch.tensor([0, 5, 63, 5])
    cos, sin = rope_cos_sin(positions, model.head_dim, model.rope_theta, torch.float32)
    assert torch.equal(table.cos[positions], cos) and torch.equal(table.sin[positions], sin)
