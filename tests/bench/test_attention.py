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
    (["gqa", "flashinfer", "flashinfer_tc", "sdpa"], True, False, False, 2.5),  # gqa's caches
    (["flashinfer", "sdpa"], False, False, False, 2),  # a gqa cache of its own, SDPA reads it
    (["vllm_v1", "flashinfer_tc"], False, False, True, 2),
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
    # SDPA read gqa's K/V and its output agreed with gqa's and the reference's
    assert all(r["kv_from"] == "gqa" and r["outputs_agree"] for r in sdpa), sdpa
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
    (sdpa,) = [r for r in result["rows"] if r["kernel"] == "sdpa"]
    assert sdpa["outputs_agree"] and sdpa["sdpa_rel_l2"]["reference"] < 1e-2, sdpa


@pytest.mark.gpu
def test_sdpa_alone_reads_a_cache_of_its_own_and_the_panel_entry_point_runs(tmp_path):
    result = attention.measure_point("llama3-8b", 3, 1000, kernels=["sdpa"], runs=3,
                                     prefetch=["none"])
    (sdpa,) = result["rows"]
    assert sdpa["kv_from"] == "gqa" and sdpa["outputs_agree"], sdpa
    assert result["command"] == ("python -m kvlab bench attention --models llama3-8b --batches 3 "
                                 "--contexts 1000 --kernels sdpa --runs 3 --prefetch none")


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


def stored_cache(lengths, block_size, layout, num_kv_heads=2, head_dim=64, dtype=None):
    """A CPU cache whose blocks are scattered over the pool, holding sequences of `lengths`
    tokens of known K/V: (cache, seq_ids, [(k, v) per sequence, each [len, heads, D]])."""
    import torch

    from kvlab.arith import ceil_div
    from kvlab.cache import PagedKVCache
    from kvlab.cache.fp8 import FP8_DTYPE

    dtype = dtype or torch.float16
    num_blocks = sum(ceil_div(n, block_size) for n in lengths) + 3
    cache = PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype,
                         layout=layout, seed=1)
    gen = torch.Generator().manual_seed(0)
    source = torch.float16 if dtype == FP8_DTYPE else dtype  # an fp8 cache is written from fp16
    kvs = [tuple(torch.randn(n, num_kv_heads, head_dim, generator=gen).to(source) for _ in "kv")
           for n in lengths]
    return cache, [cache.add_sequence(k, v) for k, v in kvs], kvs


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize(("batch", "context", "block_size"),
                         [(1, 1, 16), (3, 17, 16), (2, 97, 8), (4, 33, 32), (1, 256, 16)])
def test_dense_kv_is_the_kernels_kv_in_sdpas_layout(layout, batch, context, block_size):
    import torch

    cache, seq_ids, kvs = stored_cache([context] * batch, block_size, layout)
    blocks = [b for s in seq_ids for b in cache.manager.block_table(s)]
    assert len(blocks) == 1 or blocks != sorted(blocks)  # scattered over the pool
    k, v = attention.dense_kv(cache, seq_ids)
    assert k.shape == v.shape == (batch, 2, context, 64) and k.is_contiguous()
    assert torch.equal(k, torch.stack([k_.transpose(0, 1) for k_, _ in kvs]))
    assert torch.equal(v, torch.stack([v_.transpose(0, 1) for _, v_ in kvs]))


def test_dense_kv_refuses_mixed_lengths_and_fp8():
    import torch

    from kvlab.cache.fp8 import FP8_DTYPE

    cache, seq_ids, _ = stored_cache([17, 18], 16, "hnd")
    with pytest.raises(ValueError, match=r"sequences of 2 lengths \(17-18\)"):
        attention.dense_kv(cache, seq_ids)
    with pytest.raises(ValueError, match=r"seq_ids=\[\]"):
        attention.dense_kv(cache, [])
    fp8, ids, _ = stored_cache([5], 16, "hnd", dtype=FP8_DTYPE)
    assert fp8.k_cache.dtype == FP8_DTYPE
    with pytest.raises(ValueError, match="SDPA reads fp16/bf16 K/V, not fp8"):
        attention.dense_kv(fp8, ids)
    assert torch.float16 in attention.OUTPUT_TOLERANCE


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
def test_sdpa_on_the_gathered_kv_matches_the_reference_within_the_tolerance(layout):
    """What the benchmark checks before timing SDPA, on the CPU: SDPA on dense_kv's K/V against
    kvlab.reference on the paged cache (fp32 SDPA here: the CPU has no fp16 SDPA kernel)."""
    import torch
    import torch.nn.functional as F

    from kvlab.reference import decode_attention

    cache, seq_ids, _ = stored_cache([97] * 3, 16, layout, dtype=torch.float32)
    q = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(1))  # 4 q heads per KV
    k, v = attention.dense_kv(cache, seq_ids)
    out = F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]
    ref = decode_attention(q, cache, seq_ids)
    check = attention.output_check(out, ref, ref, attention.OUTPUT_TOLERANCE[torch.float16])
    assert check["outputs_agree"] and check["sdpa_rel_l2"]["reference"] < 1e-5
    # K/V of other values (what SDPA read before: random of its own) fail the same check
    other = F.scaled_dot_product_attention(q[:, :, None], torch.randn_like(k),
                                           torch.randn_like(v), enable_gqa=True)[:, :, 0]
    assert not attention.output_check(other, ref, ref, 2e-3)["outputs_agree"]


def test_output_check_names_the_worst_sequence_against_each():
    import torch

    ref = torch.ones(2, 4, 8)
    kernel = ref.clone()
    sdpa = ref.clone()
    sdpa[1, 0, 0] += 0.01  # one element of the second sequence: 0.01 / sqrt(32)
    check = attention.output_check(sdpa, kernel, ref, 2e-3)
    assert check["sdpa_rel_l2"] == {"reference": pytest.approx(0.01 / 32**0.5, rel=1e-2),
                                    "kernel": pytest.approx(0.01 / 32**0.5, rel=1e-2)}
    assert check["outputs_agree"] is True
    sdpa[1, 0, 0] += 0.1
    assert attention.output_check(sdpa, kernel, ref, 2e-3)["outputs_agree"] is False


def test_measures_options_are_the_clis_and_its_command_parses_back_to_them():
    from kvlab.bench.cli import parse

    cli = vars(parse(["bench", "attention"]))
    defaults = vars(attention.options_namespace())
    assert {k: cli[k] for k in defaults if k != "command"} == {
        k: v for k, v in defaults.items() if k != "command"}
    options = {"models": ["qwen2.5-7b"], "batches": (16,), "contexts": [4096],
               "block_sizes": [16, 32], "distances": [2], "fp8": True, "in_order": True,
               "kernels": ("gqa", "sdpa", "read"), "prefetch": ["none", "bulk"], "runs": 5,
               "dtype": "bfloat16"}
    args = attention.options_namespace(**options)
    parsed = vars(parse(args.command.split(" ", 3)[3].split()))  # after "python -m kvlab"
    assert {k: parsed[k] for k in defaults if k != "command"} == {
        k: v for k, v in vars(args).items() if k != "command"}
    assert args.command == ("python -m kvlab bench attention --models qwen2.5-7b --batches 16 "
                            "--contexts 4096 --block-sizes 16 32 --distances 2 --fp8 --in-order "
                            "--kernels gqa sdpa read --prefetch none bulk --runs 5 "
                            "--dtype bfloat16")
    points = attention.options_namespace(points=[(2, 300), (1, 600)], lengths=None)
    assert points.command == "python -m kvlab bench attention --points 2x300 1x600"


def test_measure_refuses_an_unknown_option_and_a_machine_without_a_gpu(monkeypatch):
    with pytest.raises(ValueError, match="block_size: not options of bench attention"):
        attention.measure(block_size=16)
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        attention.measure_point("llama3-8b", 1, 1024, runs=3)


def test_gqa_is_compared_with_flashinfer_on_the_same_cache_in_its_loop():
    rows = [row(0, "gqa", "none", 2.0), row(0, "flashinfer", "none", 3.0),
            row(0, "flashinfer_tc", "none", 2.5), row(0, "gqa_fp8", "none", 1.0),
            row(0, "flashinfer_fp8", "none", 1.5, kv_dtype="fp8"),
            row(1, "flashinfer", "none", 1.0)]  # no gqa in that loop: no ratio
    ratios = attention.loop_ratios(rows)
    assert ratios[0]["gqa_over_flashinfer"] == {"flashinfer": 1.5, "flashinfer_tc": 1.25,
                                                "flashinfer_fp8": 1.5}
    assert ratios[1]["gqa_over_flashinfer"] == {}
    lines = attention.report({"gpu": "H200", "roofline_copy_gbps": 4000.0, "num_runs": 3,
                              "skipped": [], "rows": [
                                  {**r, "model": "llama3-8b", "batch": 1, "context": 1024,
                                   "block_size": 16, "gbps": 1.0, "pct_roofline": 1.0}
                                  for r in rows]}).splitlines()
    assert "gqa (no prefetch) / flashinfer_tc, same loop: 1.250-1.250x" in lines
    assert "gqa_fp8 (no prefetch) / flashinfer_fp8, same loop: 1.500-1.500x" in lines


def test_the_clis_flashinfer_kernels_are_the_benchmarks():
    from kvlab.bench.cli import FLASHINFER

    assert tuple(attention.FLASHINFER_TENSOR_CORES) == FLASHINFER


def test_flashinfer_rows_check_its_output_on_the_sources_cache(monkeypatch):
    """With a fake flashinfer on the CPU: one row per kernel and cache, zero copy, its output
    checked against the reference and the source's kernel (here the reference itself)."""
    import types

    import torch
    from factories import FakeWrapper, install_fake_flashinfer, make_cache, make_seq

    from kvlab.kernels import flashinfer_peer
    from kvlab.reference import decode_attention

    install_fake_flashinfer(monkeypatch)
    monkeypatch.setattr(flashinfer_peer, "installed_version", lambda: "0.0-fake")
    cache = make_cache(num_blocks=32, block_size=16, num_kv_heads=2, head_dim=64,
                       dtype=torch.float16)
    seq_ids = [make_seq(cache, n, seed=n)[0] for n in (1, 17, 97)]
    plan = types.SimpleNamespace(run=lambda q: decode_attention(q, cache, seq_ids).half())
    source = {"family": "gqa", "cache": cache, "seq_ids": seq_ids, "plan": plan}
    q = torch.randn(3, 8, 64).half()
    out = torch.empty_like(q)
    found = attention.flashinfer_variants(q, out, ["flashinfer", "flashinfer_tc"], [source],
                                          torch.float16)
    assert set(found) == {("flashinfer", "none"), ("flashinfer_tc", "none")}
    for (kernel, _), (fields, call) in found.items():
        assert fields["kernel"] == kernel and fields["kv_from"] == "gqa"
        assert fields["outputs_agree"] and fields["flashinfer_version"] == "0.0-fake"
        assert call() is out
    assert [w.use_tensor_cores for w in FakeWrapper.made] == [False, True]
    assert all(w.ran["k_cache"] is cache.k_cache for w in FakeWrapper.made)
