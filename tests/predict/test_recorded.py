"""The recordings the model is fitted on and answers with (kvlab.predict.recorded), and the
figures its docstrings cite about them."""

import statistics

from kvlab.config import MODELS
from kvlab.predict import paper, recorded
from kvlab.predict.fit import COUNTERS
from kvlab.results import load_result


def test_every_family_run_on_scattered_blocks_is_a_launch():
    found = recorded.recorded(recorded.FITTED)
    rows = [r for name in recorded.FITTED for r in load_result("h200", name)["rows"]
            if r["kernel"] in recorded.KERNELS and r.get("block_order", "scattered") ==
            "scattered"]
    assert len(found) == len(rows) and len(found) > 1000
    assert {r.point.family for r in found} == {"vllm_v1", "gqa"}
    fp8 = [r for r in found if r.row["kernel"] == "gqa_fp8"]
    assert fp8 and all(r.point.dtype == "fp8" and r.point.family == "gqa" for r in fp8)
    assert {r.point.dtype for r in found if r.source == "attention_bf16" and
            r.row["kernel"] == "gqa"} == {"bfloat16"}


def test_a_point_recorded_twice_answers_with_the_first_recording():
    point = next(r.point for r in recorded.recorded(("attention_sms",))
                 if r.point.num_sms == 132)
    assert recorded.measured(point).source == "attention"


def test_ranges_are_what_was_recorded():
    ranges = recorded.ranges(recorded.recorded(recorded.FITTED))
    assert ranges["gqa"]["dtype"] == ["bfloat16", "float16", "fp8"]
    assert ranges["vllm_v1"]["dtype"] == ["float16"]
    assert ranges["gqa"]["num_sms"] == [32, 132] and ranges["gqa"]["head_dim"] == [128]
    assert ranges["vllm_v1"]["group"] == [1, 7] and ranges["gqa"]["context"] == [1024, 32768]
    assert ranges == load_result("cpu", "predict")["ranges"]


def _ratios(kernel):
    older = {(r["model"], r["batch"], r["context"]): r["ms"]
             for r in load_result("h200", "attention_evict_last")["rows"]
             if r["kernel"] == kernel and r["prefetch"] == "none"}
    return [older[(r["model"], r["batch"], r["context"])] / r["ms"]
            for r in load_result("h200", "attention")["rows"]
            if r["kernel"] == kernel and r["prefetch"] == "none"]


def test_the_older_kernels_ran_as_the_module_says():
    # "vllm_v1 at block 16 ran 0.66-1.35x as long then as now, gqa 1.04-1.43x"
    for kernel, (low, high) in (("vllm_v1", (0.66, 1.35)), ("gqa", (1.04, 1.43))):
        ratios = _ratios(kernel)
        assert (round(min(ratios), 2), round(max(ratios), 2)) == (low, high)
    assert f"{0.66}-{1.35}x" in recorded.__doc__ and f"{1.04}-{1.43}x" in recorded.__doc__


def test_ncu_read_kv_once_for_vllm_without_prefetch():
    # paper.memory_pct: "ncu read K+V once, within 2%, for vllm_v1 without prefetch"
    shares = []
    for name in COUNTERS:
        for r in load_result("h200", name)["rows"]:
            if r["kernel"] == "vllm_v1" and r["prefetch"] == "none":
                m = MODELS[r["model"]]
                kv = r["batch"] * r["context"] * m.num_kv_heads * m.head_dim * 4
                shares.append(r["dram_read_bytes"] / kv)
    assert 0.98 < min(shares) and max(shares) < 1.02 and statistics.median(shares) < 1.002
    assert "within 2%" in paper.memory_pct.__doc__
