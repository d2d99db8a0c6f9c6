"""`python -m kvlab bench attention`: one loop per point and block size, kernel="auto" three
ways, SDPA's backend named, ratios within a loop (CPU), and a tiny run on the GPU."""

import json

import pytest

from kvlab.bench import attention
from kvlab.bench.cli import main


@pytest.mark.parametrize(
    ("context", "block_size", "expected"),
    [(1024, 16, 768), (32768, 128, 24576), (1000, 16, 736), (4, 16, None), (3, 1, None), (7, 1, 5)],
)
def test_auto_is_reused_from_a_shorter_context_of_the_same_bucket(context, block_size, expected):
    assert attention.sibling_context(context, block_size) == expected


@pytest.mark.parametrize(
    ("kernels", "backend"),
    [
        (["void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>"], "flash"),
        (["cudnn_generated_fort_native_sdpa_sm90_flash_fprop"], "cudnn"),
        (["fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)"],
         "efficient"),
        (["ampere_fp16_s16816gemm_fp16_128x64", "softmax_warp_forward"], "math"),
        ([], "unknown"),
    ],
)
def test_sdpa_backend_is_named_from_the_kernels_it_ran(kernels, backend):
    assert attention.sdpa_backend(kernels) == backend


def row(loop, kernel, prefetch, ms, **extra):
    return {"loop": loop, "kernel": kernel, "prefetch": prefetch, "ms": ms, **extra}


def test_ratios_compare_rows_of_one_loop_only():
    rows = [
        row(0, "gqa", "none", 10.0), row(0, "gqa", "bulk K+V d=1", 9.0),
        row(0, "sdpa", "none", 9.5),
        row(0, "auto", "bulk K+V d=1", 9.3, family="gqa", auto_mode="tuned"),
        row(0, "auto", "none", 10.2, family="gqa", auto_mode="recorded"),
        # another loop, much faster: it must not enter loop 0's ratios
        row(1, "gqa", "none", 1.0), row(1, "sdpa", "none", 2.0),
    ]
    ratios = attention.loop_ratios(rows)
    assert ratios[0]["best"] == {"gqa": ("bulk K+V d=1", 9.0)}
    assert ratios[0]["gqa_over_sdpa"] == pytest.approx(0.95)
    assert ratios[0]["auto"] == {("gqa", "tuned"): pytest.approx(9.3 / 9.0),
                                 ("gqa", "recorded"): pytest.approx(10.2 / 9.0)}
    assert ratios[1]["gqa_over_sdpa"] == pytest.approx(2.0)
    assert "fp8_over_fp16" not in ratios[0]


def test_blocks_in_order_are_compared_with_scattered_and_sdpa_in_their_loop():
    rows = [row(0, "gqa", "bulk K+V d=1", 9.0), row(0, "gqa", "none", 10.0),
            row(0, "gqa_in_order", "none", 8.0), row(0, "vllm_v1", "none", 12.0),
            row(0, "vllm_v1_in_order", "none", 11.0), row(0, "sdpa", "none", 8.4),
            row(1, "gqa", "none", 1.0), row(1, "sdpa", "none", 2.0)]
    ratios = attention.loop_ratios(rows)
    assert ratios[0]["in_order_over_scattered"] == {"gqa": pytest.approx(10.0 / 8.0),
                                                    "vllm_v1": pytest.approx(12.0 / 11.0)}
    assert ratios[0]["gqa_in_order_over_sdpa"] == pytest.approx(8.4 / 8.0)
    assert ratios[0]["best"]["gqa"] == ("bulk K+V d=1", 9.0)  # scattered rows only
    assert ratios[1]["in_order_over_scattered"] == {}
    assert "gqa_in_order_over_sdpa" not in ratios[1]


@pytest.mark.parametrize(("kernels", "fp8", "in_order", "mixed", "copies"), [
    (["vllm_v1", "gqa", "sdpa"], False, False, False, 3),
    (["vllm_v1", "gqa", "sdpa"], False, True, False, 5),
    (["gqa", "sdpa"], True, True, False, 3.5),
    (["gqa", "sdpa"], False, True, True, 2),  # no SDPA on mixed lengths
    (["gqa", "sdpa", "read"], False, False, False, 3),
    (["gqa", "read"], False, False, True, 2),  # the read's buffer, mixed lengths too
])
def test_a_loop_holds_a_copy_of_the_kv_per_cache(kernels, fp8, in_order, mixed, copies):
    from types import SimpleNamespace

    args = SimpleNamespace(kernels=kernels, fp8=fp8, in_order=in_order)
    assert attention.kv_copies(args, mixed) == copies


def test_gqa_and_sdpa_are_compared_with_the_plain_read_of_their_loop():
    rows = [row(0, "gqa", "bulk K+V d=1", 9.0), row(0, "gqa", "none", 10.0),
            row(0, "sdpa", "none", 9.5), row(0, "read", "none", 8.0),
            row(1, "gqa", "none", 1.0), row(1, "read", "none", 0.5),
            row(2, "gqa", "none", 3.0)]
    ratios = attention.loop_ratios(rows)
    assert ratios[0]["over_read"] == {"gqa": pytest.approx(0.8), "sdpa": pytest.approx(8 / 9.5)}
    assert ratios[1]["over_read"] == {"gqa": pytest.approx(0.5)}  # no SDPA: mixed lengths
    assert ratios[2]["over_read"] == {}  # no read in that loop
    lines = attention.report({"gpu": "H200", "roofline_copy_gbps": 4000.0, "num_runs": 3,
                              "skipped": [], "rows": [
                                  {**r, "model": "llama3-8b", "batch": 1, "context": 1024,
                                   "block_size": 16, "gbps": 1.0, "pct_roofline": 1.0}
                                  for r in rows]}).splitlines()
    assert "gqa (no prefetch) / a plain read of the same bytes, same loop: 0.500-0.800x" in lines
    assert "sdpa / a plain read of the same bytes, same loop: 0.842-0.842x" in lines


def test_fp8_over_fp16_compares_the_no_prefetch_rows_of_a_loop():
    rows = [row(0, "gqa", "none", 10.0), row(0, "gqa_fp8", "bulk K+V d=1", 4.0),
            row(0, "gqa_fp8", "none", 5.5), row(1, "gqa_fp8", "none", 1.0)]
    ratios = attention.loop_ratios(rows)
    assert ratios[0]["fp8_over_fp16"] == pytest.approx(10.0 / 5.5)
    assert "fp8_over_fp16" not in ratios[1]  # no fp16 row in that loop


def test_fp8_needs_gqa_among_the_kernels(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "attention", "--fp8", "--kernels", "vllm_v1", "sdpa"])
    assert exit_.value.code == 2
    assert "--fp8 times gqa on an fp8 cache: --kernels vllm_v1 sdpa leaves gqa out" in (
        capsys.readouterr().err)


def test_dtype_is_float16_or_bfloat16(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "attention", "--dtype", "float32"])
    assert exit_.value.code == 2
    assert "--dtype: invalid choice: 'float32'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("requested", "reason", "counts", "fell_back"),
    [
        (None, None, [None], False),  # the whole GPU, no green context
        ([132, 78, 32, 78], None, [None, 78, 32], False),  # the GPU's own count: no context
        ([78, 32], "torch 2.3 has no torch.cuda.green_contexts", [None], True),
        ([132], "torch 2.3 has no torch.cuda.green_contexts", [None], False),
    ],
)
def test_sm_counts_fall_back_to_the_whole_gpu_and_say_so(requested, reason, counts, fell_back):
    found, note = attention.sm_counts(requested, 132, reason)
    assert found == counts
    assert (note is not None) == fell_back
    if fell_back:
        assert f"--sms 78 32: green contexts are not available ({reason})" in note
        assert "whole GPU (132 SMs)" in note


@pytest.mark.gpu
def test_fewer_sms_are_timed_in_their_own_loops(tmp_path):
    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama2-7b", "--batches", "16",
          "--contexts", "4096", "--prefetch", "none", "--runs", "3", "--kernels", "gqa",
          "--sms", "132", "32"])
    result = json.loads(out.read_text())
    by_sms = {r["sms"]: r for r in result["rows"]}
    assert set(by_sms) == {132, *map(int, result["roofline_copy_gbps_by_sms"])}
    held = min(by_sms)
    assert 32 <= held < 132 and by_sms[held]["loop"] != by_sms[132]["loop"]
    assert by_sms[held]["ms"] > 1.2 * by_sms[132]["ms"]  # 16 x 4k MHA is bandwidth-bound


@pytest.mark.gpu
def test_tiny_attention_benchmark_times_every_variant_in_one_loop(tmp_path, capsys):
    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama3-8b", "--batches", "2",
          "--contexts", "1024", "--block-sizes", "16", "128", "--distances", "1", "--runs", "3",
          "--kernels", "vllm_v1", "gqa", "sdpa", "auto", "read"])
    result = json.loads(out.read_text())
    rows = result["rows"]
    loops = {r["loop"] for r in rows}
    assert loops == {0, 1}  # block 16 (both families) and block 128 (gqa only)
    first = [r for r in rows if r["loop"] == 0]
    assert {(r["kernel"], r.get("family"), r.get("auto_mode")) for r in first} == {
        ("vllm_v1", None, None), ("gqa", None, None), ("sdpa", None, None),
        ("read", None, None),
        *(("auto", f, m) for f in ("vllm_v1", "gqa") for m in ("tuned", "reused", "recorded"))}
    assert all(r["tuned_at_context"] == 768 for r in first if r.get("auto_mode") == "reused")
    assert {r["kernel"] for r in rows if r["loop"] == 1} == {"gqa", "sdpa", "auto", "read"}
    sdpa = [r for r in rows if r["kernel"] == "sdpa"]
    assert all(r["sdpa_backend"] != "unknown" and r["block_size"] is None for r in sdpa)
    read = [r for r in rows if r["kernel"] == "read"]
    assert all(r["block_size"] is None and r["kv_bytes"] == first[0]["kv_bytes"] for r in read)
    # the plans' launches: vllm_v1 by vLLM's rule (2 x 32 query heads, two partitions: v2);
    # gqa in 64 CTAs of 256 tokens (kvlab.kernels.geometry.split_plan)
    plans = {(r["kernel"], r["partition_size"], r["warps"]) for r in first
             if r["kernel"] in ("vllm_v1", "gqa")}
    assert plans == {("vllm_v1", 512, 4), ("gqa", 256, 4)}
    for r in rows:
        assert len(r["ms_runs"]) == 3 and r["gbps"] > 0
    assert result["roofline_copy_gbps"] > 0 and "clocks_end" in result
    printed = capsys.readouterr().out
    assert "gqa (no prefetch) / SDPA, same loop" in printed
    assert "gqa (no prefetch) / a plain read of the same bytes, same loop" in printed


@pytest.mark.gpu
def test_a_bf16_run_times_bf16_caches_and_a_bf16_q_over_fp8(tmp_path):
    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama3-8b", "--batches", "2",
          "--contexts", "1024", "--prefetch", "none", "--runs", "3", "--kernels", "gqa", "sdpa",
          "--fp8", "--dtype", "bfloat16"])
    result = json.loads(out.read_text())
    assert result["dtype"] == "bfloat16"
    assert {r["kernel"] for r in result["rows"]} == {"gqa", "gqa_fp8", "sdpa"}


@pytest.mark.gpu
def test_fp8_rows_read_half_the_bytes_in_the_same_loop(tmp_path, capsys):
    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama3-8b", "--batches", "4",
          "--contexts", "4096", "--distances", "1", "--prefetch", "none", "bulk", "--runs", "3",
          "--kernels", "gqa", "--fp8"])
    rows = json.loads(out.read_text())["rows"]
    by_kernel = {(r["kernel"], r["prefetch"]): r for r in rows}
    assert set(by_kernel) == {(k, p) for k in ("gqa", "gqa_fp8") for p in ("none",
                                                                           "bulk K+V d=1")}
    assert {r["loop"] for r in rows} == {0}
    fp16, fp8 = by_kernel["gqa", "none"], by_kernel["gqa_fp8", "none"]
    assert fp8["kv_bytes"] * 2 == fp16["kv_bytes"] and fp8["kv_dtype"] == "fp8"
    assert "gqa on fp8 / on fp16 (no prefetch), tokens/s, same loop" in capsys.readouterr().out


@pytest.mark.gpu
def test_blocks_in_order_are_timed_beside_scattered_ones_in_the_same_loop(tmp_path, capsys):
    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama3-8b", "--batches", "4",
          "--contexts", "2048", "--prefetch", "none", "--runs", "3", "--kernels", "vllm_v1",
          "gqa", "sdpa", "--in-order"])
    rows = json.loads(out.read_text())["rows"]
    orders = {r["kernel"]: r.get("block_order") for r in rows}
    assert orders == {"vllm_v1": "scattered", "gqa": "scattered", "vllm_v1_in_order": "in_order",
                      "gqa_in_order": "in_order", "sdpa": None}
    assert {r["loop"] for r in rows} == {0}
    by_kernel = {r["kernel"]: r for r in rows}
    # the same plan over either table: only where the blocks lie differs
    for family in ("vllm_v1", "gqa"):
        mine, ordered = by_kernel[family], by_kernel[f"{family}_in_order"]
        assert (mine["partition_size"], mine["warps"], mine["kv_bytes"]) == (
            ordered["partition_size"], ordered["warps"], ordered["kv_bytes"])
    printed = capsys.readouterr().out
    assert "gqa (no prefetch) on blocks in order / SDPA, same loop" in printed
    assert "vllm_v1 (no prefetch) on blocks in order / scattered, same loop" in printed


@pytest.mark.gpu
def test_points_replace_the_batches_x_contexts_grid(tmp_path):
    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama3-8b", "--points",
          "2x300", "1x600", "--batches", "4", "--contexts", "100", "--prefetch", "none",
          "--runs", "3", "--kernels", "vllm_v1", "gqa"])
    rows = json.loads(out.read_text())["rows"]
    assert sorted({(r["batch"], r["context"]) for r in rows}) == [(1, 600), (2, 300)]


@pytest.mark.gpu
def test_mixed_lengths_are_timed_on_their_own_lengths(tmp_path):
    from kvlab.config import MODELS
    from kvlab.workload import lognormal_lengths

    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama3-8b", "--batches", "8",
          "--lengths", "lognormal:1000,4096", "--prefetch", "none", "--runs", "3",
          "--kernels", "vllm_v1", "gqa", "sdpa", "read"])
    rows = json.loads(out.read_text())["rows"]
    lens = lognormal_lengths(8, 1000, 4096)
    # no SDPA on mixed lengths; gqa also with its split planned for the longest sequence; a
    # plain read of the batch's bytes
    assert {r["kernel"] for r in rows} == {"vllm_v1", "gqa", "gqa_split_longest", "read"}
    for r in rows:
        assert r["lengths"] == "lognormal:1000,4096" and r["max_context"] == lens.max()
        assert r["context"] == round(lens.mean())
        assert r["kv_bytes"] == 2 * int(lens.sum()) * MODELS["llama3-8b"].kv_size * 2


def test_rows_record_their_plans_launch():
    from types import SimpleNamespace

    def plan(partition_size, num_partitions, warps):
        return SimpleNamespace(launcher=SimpleNamespace(
            partition_size=partition_size, num_partitions=num_partitions, warps=warps))

    assert attention.launch_fields(plan(1024, 3, 8)) == {"partition_size": 1024, "warps": 8}
    # one partition covers the longest sequence: each CTA takes a whole sequence
    assert attention.launch_fields(plan(4096, 1, 4)) == {"partition_size": 0, "warps": 4}
