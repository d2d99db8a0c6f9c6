"""benchmarks/gemm_paths.py on the CPU: its options checked before torch is touched, and the
linears and bytes it times."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gemm_paths  # noqa: E402

from kvlab.config import MODELS  # noqa: E402


@pytest.mark.parametrize(("argv", "message"), [
    (["--models", "llama3-8b", "gpt-9"], r"--models gpt-9: not a preset"),
    (["--rows", "16", "0"], r"--rows 16 0: each must be >= 1"),
    (["--layers", "0"], r"--layers 0: each must be >= 1"),
    (["--runs", "-1"], r"--runs -1: each must be >= 1"),
])
def test_bad_options_raise_naming_the_option_and_value(argv, message):
    with pytest.raises(ValueError, match=message):
        gemm_paths.parse_args(argv)


def test_a_models_linears_are_the_engines_four_with_the_qkv_bias_where_it_has_one():
    qwen, llama = gemm_paths.linears("qwen2.5-7b"), gemm_paths.linears("llama3-8b")
    assert list(qwen) == ["qkv", "o", "gate_up", "down"]
    m = MODELS["qwen2.5-7b"]
    assert qwen["qkv"] == (3584, (28 + 2 * 4) * 128, True) and qwen["o"] == (3584, 3584, False)
    assert qwen["gate_up"] == (3584, 2 * 18944, False)
    assert qwen["down"] == (m.intermediate_size, m.hidden_size, False)
    assert llama["qkv"] == (4096, (32 + 2 * 8) * 128, False)


def test_bytes_count_weight_bias_input_and_output_of_every_layer_in_bf16():
    # 2 layers of a 4 -> 3 linear with a bias at 5 rows: (12 + 3 + 5 * (3 + 4)) * 2 B each
    assert gemm_paths.linear_bytes(4, 3, True, 5, 2) == 2 * (12 + 3 + 35) * 2
    assert gemm_paths.linear_bytes(4, 3, False, 5, 2) == 2 * (12 + 35) * 2
    # with the residual it adds: read once more, as large as the output
    assert gemm_paths.linear_bytes(4, 3, False, 5, 2, residual=True) == 2 * (12 + 5 * 10) * 2


def test_only_the_down_projection_without_a_bias_gains_the_residual_forms():
    assert gemm_paths.variants("down", False) == {
        "cublas": ("cublas", "linear"), "cublaslt": ("cublaslt", "linear"),
        "cublas+add": ("cublas", "add"), "cublaslt+add": ("cublaslt", "add"),
        "cublas+addmm_": ("cublas", "addmm_"), "cublaslt+addmm_": ("cublaslt", "addmm_")}
    assert list(gemm_paths.variants("down", True)) == ["cublas", "cublaslt"]
    assert list(gemm_paths.variants("o", False)) == ["cublas", "cublaslt"]


def test_the_forms_compute_the_same_and_addmm_updates_the_residual_in_place():
    import torch

    gen = torch.Generator().manual_seed(0)
    x, w, r = (torch.randn(shape, generator=gen, dtype=torch.float64)
               for shape in ((5, 7), (3, 7), (5, 3)))
    expected = r + x @ w.t()
    assert torch.allclose(gemm_paths.apply(torch, "add", x, w, None, r), expected)
    assert torch.allclose(gemm_paths.apply(torch, "linear", x, w, None, r), x @ w.t())
    updated = gemm_paths.apply(torch, "addmm_", x, w, None, r)
    assert updated is r and torch.allclose(r, expected)


def test_each_variant_is_compared_with_cublas_of_the_same_sum_on_the_untouched_residual():
    import torch

    gen = torch.Generator().manual_seed(1)
    x, w, r = (torch.randn(shape, generator=gen, dtype=torch.float64)
               for shape in ((4, 6), (5, 6), (4, 5)))
    before, asked = r.clone(), []
    found = gemm_paths.differences(torch, gemm_paths.variants("down", False), x, w, None, r,
                                   asked.append)
    assert torch.equal(r, before) and asked == [p for _ in range(3) for p in gemm_paths.PATHS]
    assert set(found) == set(gemm_paths.variants("down", False))
    assert max(found.values()) < 1e-12  # the same sums: linear against linear, the rest r + xW


def test_the_docs_table_gives_each_variant_a_layers_time_and_its_multiple_of_its_bytes():
    from figures.e2e import gemm_paths_table

    def row(linear, variants):
        return {"model": "llama3-8b", "linear": linear, "num_rows": 64,
                "us_per_layer": {v: 40.0 + i for i, v in enumerate(variants)},
                "over_bytes": {v: 1.1 + i / 100 for i, v in enumerate(variants)}}

    table = gemm_paths_table({"h100": {"rows": [
        row("qkv", gemm_paths.variants("qkv", False)),
        row("down", gemm_paths.variants("down", False))]}})
    assert table[2] == "| H100 | llama3-8b | qkv | 64 | 40.0 us (1.10x) | 41.0 us (1.11x) | " \
                       "- | - | - | - |"
    # the columns in the table's order: cuBLAS, Lt, then each path's add and in-GEMM forms
    assert table[3] == ("| H100 | llama3-8b | down | 64 | 40.0 us (1.10x) | 41.0 us (1.11x) | "
                        "42.0 us (1.12x) | 44.0 us (1.14x) | 43.0 us (1.13x) | 45.0 us (1.15x) |")
    assert gemm_paths_table({}) == ["No result of `benchmarks/gemm_paths.py` is committed yet."]
