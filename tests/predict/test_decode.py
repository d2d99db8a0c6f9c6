"""decode_launch: a recorded point returns its recording; elsewhere the closed form, labelled
interpolated or extrapolated (naming the dimension), with the held-out band; fast, with no L2
replay."""

import time

import pytest

import kvlab.sim
from kvlab.predict import decode_launch
from kvlab.predict.decode import fitted
from kvlab.results import load_result


def _row(name, **match):
    return next(r for r in load_result("h200", name)["rows"]
                if all(r.get(k) == v for k, v in match.items()))


@pytest.mark.parametrize(("name", "match", "args", "kwargs"), [
    ("attention", dict(model="llama3-8b", batch=16, context=4096, kernel="gqa",
                       prefetch="none"), ("llama3-8b", 16, 4096), {}),
    ("attention", dict(model="qwen2.5-7b", batch=1, context=32768, kernel="vllm_v1",
                       prefetch="line K+V d=2"),
     ("qwen2.5-7b", 1, 32768), dict(family="vllm_v1", prefetch="line K+V d=2")),
    ("attention_sms", dict(model="llama2-7b", batch=64, context=4096, kernel="vllm_v1", sms=32,
                           prefetch="bulk K+V d=1"),
     ((32, 32, 128), 64, 4096), dict(family="vllm_v1", prefetch="bulk K+V d=1", num_sms=32)),
    ("attention_mixed", dict(model="qwen2.5-14b", batch=64, lengths="lognormal:1536,2048",
                             kernel="gqa"),
     ("qwen2.5-14b", 64, None), dict(lengths="lognormal:1536,2048")),
    ("attention_fp8", dict(model="llama3-8b", batch=64, context=4096, kernel="gqa_fp8"),
     ("llama3-8b", 64, 4096), dict(dtype="fp8")),
    ("attention_bf16", dict(model="qwen2.5-7b", batch=16, context=4096, kernel="gqa"),
     ("qwen2.5-7b", 16, 4096), dict(dtype="bfloat16")),
])
def test_a_recorded_point_returns_its_recording(name, match, args, kwargs):
    row = _row(name, **match)
    answer = decode_launch(*args, **kwargs)
    assert (answer.source, answer.time_ms, answer.gbps) == ("measured", row["ms"], row["gbps"])
    assert answer.roofline_share == row["pct_roofline"] / 100
    date = load_result("h200", name)["date"][:10]
    assert answer.note == f"recorded on NVIDIA H200, {date} ({name}.json)"
    assert answer.error_band == (min(row["ms_runs"]), max(row["ms_runs"]))


def test_a_recording_of_earlier_kernels_says_so_beside_the_model():
    row = _row("attention_block_sizes", model="llama3-8b", batch=16, context=4096,
               kernel="vllm_v1", prefetch="none", block_size=32)
    answer = decode_launch("llama3-8b", 16, 4096, family="vllm_v1", block_size=32)
    assert (answer.source, answer.time_ms) == ("measured", row["ms"])
    assert "2026-11-29 (attention_block_sizes.json); by the kernels of that date (the closed " \
           "form for today's: " in answer.note


def test_inside_the_recorded_range_is_interpolated_with_the_one_model_out_band():
    answer = decode_launch("llama3-8b", 32, 6000, family="vllm_v1", prefetch="bulk K+V d=1")
    assert answer.source == "interpolated" and answer.extrapolated == ()
    band = load_result("cpu", "predict")["bands"]["vllm_v1"]["bulk K+V d=1"]["interpolated"]
    assert answer.error_band == pytest.approx((answer.time_ms / (1 + band),
                                               answer.time_ms / (1 - band)))
    assert answer.gbps == pytest.approx(32 * 6000 * 8 * 2 * 128 * 2 / answer.time_ms / 1e6)
    assert answer.roofline_share == pytest.approx(answer.gbps / 4280.7)


def test_between_recorded_points_the_model_lies_near_them():
    # llama3-8b gqa 16 x 4k and 16 x 8k recorded; 16 x 6k between them in time
    below = decode_launch("llama3-8b", 16, 4096).time_ms
    above = decode_launch("llama3-8b", 16, 8192).time_ms
    assert below < decode_launch("llama3-8b", 16, 6144).time_ms < above


@pytest.mark.parametrize(("args", "kwargs", "dimensions"), [
    (("llama3-8b", 16, 65536), {}, ("context",)),
    (("llama3-8b", 512, 4096), {}, ("batch",)),
    (((64, 8, 128), 16, 4096), {}, ("group",)),
    (((8, 8, 64), 16, 4096), {}, ("head_dim",)),
    (("llama3-8b", 16, 4096), {"block_size": 64}, ("block_size",)),
    (("llama3-8b", 16, 4096), {"family": "vllm_v1", "dtype": "bfloat16"}, ("dtype",)),
    (("llama3-8b", 16, 4096), {"prefetch": "bulk K d=1"}, ("prefetch",)),
    (("llama3-8b", 16, 4096), {"num_sms": 16}, ("num_sms",)),
    (("llama3-8b", 16, 4096), {"gpu": "h20"}, ("gpu",)),
    (("llama3-8b", 16, None), {"lengths": "lognormal:20000,65536"},
     ("lengths' longest", "lengths' mean")),
])
def test_beyond_the_recorded_range_is_extrapolated_and_says_where(args, kwargs, dimensions):
    answer = decode_launch(*args, **kwargs)
    assert answer.source == "extrapolated" and answer.extrapolated == dimensions
    assert all(f"{d} (" in answer.note for d in dimensions)
    lo, hi = answer.error_band
    assert lo < answer.time_ms < hi


def test_another_gpu_says_its_rates_are_assumed():
    answer = decode_launch("llama3-8b", 16, 4096, family="vllm_v1", gpu="h20")
    assert "NVIDIA H20: copy roofline assumed: the NVIDIA H200's measured share" in answer.note
    assert answer.roofline_share == pytest.approx(answer.gbps / (4280.7 / 4800 * 4000))


def test_an_unrecorded_prefetch_setting_is_modelled_by_the_nearest_recorded():
    answer = decode_launch("llama3-8b", 16, 4096, prefetch="line K+V d=3 evict_last")
    assert "modelled as 'line K+V d=4'" in answer.note
    assert answer.extrapolated == ("prefetch",)


def test_a_prediction_is_fast_and_replays_nothing(monkeypatch):
    """The largest shapes a GPU holds, by the closed form alone (performance targets belong in
    benchmarks: this guards against an L2 replay on the way)."""
    def no_replay(*args, **kwargs):
        raise AssertionError("decode_launch replayed the L2")

    monkeypatch.setattr(kvlab.sim, "simulate", no_replay)
    decode_launch("llama3-8b", 1, 1024)  # loads predict.json and the recordings once
    fitted()
    for args, kwargs in [(("llama3-8b", 1, 30_000_000), {}),
                         (("llama3-8b", 65535, 500), {"family": "vllm_v1"}),
                         (("llama3-8b", 65535, None), {"lengths": "lognormal:400,1000"})]:
        start = time.perf_counter()
        answer = decode_launch(*args, **kwargs)
        assert time.perf_counter() - start < 0.5, (args, kwargs)
        assert answer.source == "extrapolated" and answer.time_ms > 0


def test_the_walkthroughs_figures_on_other_gpus_are_the_models():
    """The walkthrough's "Would prefetch pay on my GPU?" and the README state these ranges; each
    is recomputed here from kvlab.predict and found in both."""
    import json
    from pathlib import Path

    from kvlab.predict import prefetch_speedup

    def speedup(gpu, batch, context):
        return prefetch_speedup("llama3-8b", batch, context, "bulk K+V d=1", gpu=gpu)

    def span(values):
        return f"{min(values):.2f}-{max(values):.2f}x"

    hopper = ("h200", "h100-sxm", "h20", "h800-sxm", "gh200")
    grid = [(1, 4096), (1, 32768), (16, 4096), (64, 8192)]
    claims = [
        f"every Hopper GPU gains {span([speedup(g, 1, 4096) for g in hopper])}",
        f"({span([speedup(g, 64, 8192) for g in ('h100-sxm', 'h800-sxm', 'h200', 'gh200')])})",
        f"most {max(speedup('h20', *p) for p in grid):.2f}x and "
        f"{max(speedup('b200', *p) for p in grid):.2f}x",
    ]
    assert min(speedup(g, *p) for g in ("h20", "b200") for p in grid) > 1  # "at every point"
    root = Path(__file__).resolve().parents[2]
    notebook = " ".join("".join(c["source"]) for c in json.loads(
        (root / "notebooks" / "walkthrough.ipynb").read_text())["cells"]
        if c["cell_type"] == "markdown")
    for prose in (notebook, (root / "README.md").read_text()):
        prose = " ".join(prose.split())
        for claim in claims:
            assert claim in prose, claim


def test_prefetch_speedup_is_the_closed_forms_ratio_and_checks_the_setting():
    from kvlab.predict import prefetch_speedup

    none = decode_launch("llama3-8b", 16, 8192, family="vllm_v1", recordings=False)
    bulk = decode_launch("llama3-8b", 16, 8192, family="vllm_v1", prefetch="bulk K+V d=1",
                         recordings=False)
    assert prefetch_speedup("llama3-8b", 16, 8192, "bulk K+V d=1") == pytest.approx(
        none.time_ms / bulk.time_ms)
    assert decode_launch("llama3-8b", 16, 8192, family="vllm_v1").source == "measured"
    with pytest.raises(ValueError, match="needs sm_90 or later; gpu='l40s'"):
        prefetch_speedup("llama3-8b", 16, 8192, "bulk K+V d=1", gpu="l40s")
    with pytest.raises(ValueError, match="recordings=1: must be True or False"):
        decode_launch("llama3-8b", 16, 8192, recordings=1)
