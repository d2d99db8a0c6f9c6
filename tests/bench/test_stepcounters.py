"""kvlab.bench.stepcounters: the spec, the ncu command that keeps L2 between a step's kernels, the
rows of its CSV, and the subprocess with a fake `ncu` on the CPU; one real profile on the GPU."""

import csv
import io
import json
import shutil
import stat

import pytest

from kvlab.bench.stepcounters import (
    STEP_METRICS,
    StepSpec,
    command,
    is_gemm,
    main,
    measure_step,
    step_rows,
)
from kvlab.profile import CountersError

UNITS = {"l2_read_bytes": "sector", "l2_read_hit_bytes": "sector", "dram_read_bytes": "byte",
         "duration_us": "ns"}


def step_csv(kernels: list[tuple[str, int, int]]) -> str:
    """ncu's raw CSV of kernels (name, sectors asked of L2, of them hits), as ncu prints it."""
    metrics = [metric for metric, _ in STEP_METRICS.values()]
    rows = [["ID", "Kernel Name", *metrics],
            ["", "", *(UNITS[column] for column in STEP_METRICS)]]
    for i, (name, sectors, hits) in enumerate(kernels):
        rows.append([str(i), name, str(sectors), str(hits), str(32 * (sectors - hits)), "2,500"])
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "==PROF== Connected to process 7\n" + out.getvalue() + "==PROF== Disconnected\n"


# kernel names as ncu prints them by default: the function's, its namespace dropped (as the
# recorded tests/profile/data/ncu_raw_h200.csv has `void vllm_decode<...>` for kvlab::vllm's)
KERNELS = [("void rms_norm<__half, 1>(T1 *, T1 *, const T1 *, const T1 *, const T1 *, float, int, "
            "const void *, long long)", 100, 90),
           ("void linear<__half, 1, 4, 2, 0>(T1 *, const T1 *, const T1 *, const T1 *, const T1 *, "
            "int, int, long long, const void *, long long, int)", 1000, 250),
           ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1", 800, 0),
           ("void cublasLt::splitKreduce_kernel<32, 16, int, float>(...)", 50, 50),
           ("void gemv2T_kernel_val<int, int, __half, __half, float, 128>(...)", 400, 100),
           ("nvjet_hsh_64x8_64x16_2x1_v_bz_TNN", 300, 30),
           ("void silu_mul<__half>(T1 *, const T1 *, int, const void *, long long)", 10, 0)]


def test_the_spec_checks_its_fields_and_goes_through_json():
    spec = StepSpec("llama3-8b", 64, 512, 8 << 20, 4 << 20)
    assert StepSpec.from_json(spec.to_json()) == spec
    for change, message in (({"model": "gpt-5"}, "model='gpt-5': must be one of"),
                            ({"batch": 0}, "batch=0: must be"),
                            ({"prompt": 1 << 20}, r"prompt=1048576: must be an integer in"),
                            ({"ahead_bytes": -1}, r"ahead_bytes=-1: must be an integer in"),
                            ({"ahead_kv_bytes": 1 << 31},
                             r"ahead_kv_bytes=2147483648: must be an integer in")):
        with pytest.raises(ValueError, match=message):
            StepSpec(**{"model": "llama3-8b", "batch": 1, "prompt": 16, **change})
    with pytest.raises(ValueError, match="must be a JSON object of model, batch, prompt"):
        StepSpec.from_json('{"model": "llama3-8b"}')


def test_the_command_keeps_l2_between_kernels_and_replays_the_whole_process():
    spec = StepSpec("llama3-8b", 1, 512, 4096)
    argv = command(spec, "/opt/ncu")
    at = {flag: argv[argv.index(flag) + 1] for flag in (
        "--cache-control", "--replay-mode", "--profile-from-start", "--metrics")}
    assert at == {"--cache-control": "none", "--replay-mode": "application",
                  "--profile-from-start": "off",
                  "--metrics": ",".join(m for m, _ in STEP_METRICS.values())}
    assert argv[0] == "/opt/ncu" and argv[-3:-1] == ["-m", "kvlab.bench.stepcounters"]
    assert StepSpec.from_json(argv[-1]) == spec


def test_a_steps_gemms_are_the_linears_and_cublas_gemms_not_its_reductions():
    assert [is_gemm(name) for name, _, _ in KERNELS] == [False, True, True, False, True, True,
                                                         False]
    assert is_gemm("void kvlab::linear<__half, 2, 4, 2, 1>(...)")  # demangled in full too
    assert not is_gemm("void nonlinear<float>(float *)")


def test_rows_give_each_kernels_load_hits_in_launch_order():
    rows = step_rows(step_csv(KERNELS))
    assert [r["kernel_name"] for r in rows] == [name for name, _, _ in KERNELS]
    assert [r["load_hit_share"] for r in rows] == pytest.approx([0.9, 0.25, 0.0, 1.0, 0.25, 0.1,
                                                                 0.0])
    assert rows[1]["l2_read_bytes"] == 32_000 and rows[1]["duration_us"] == pytest.approx(2.5)
    assert step_rows(step_csv([("k", 0, 0)]))[0]["load_hit_share"] is None  # nothing read
    with pytest.raises(CountersError, match="ncu profiled no kernel matching a decode step"):
        step_rows("==PROF== Disconnected\n")


def fake_ncu(folder, script: str) -> str:
    path = folder / "ncu"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_measure_runs_ncu_and_says_why_it_gave_nothing(tmp_path, monkeypatch):
    spec = StepSpec("tiny-llama", 2, 16)
    (tmp_path / "out.csv").write_text(step_csv(KERNELS))
    rows = measure_step(spec, ncu=fake_ncu(tmp_path, f"cat {tmp_path / 'out.csv'}\n"))
    assert len(rows) == len(KERNELS)
    failing = fake_ncu(tmp_path, "echo 'RuntimeError: out of memory' >&2\nexit 1\n")
    with pytest.raises(CountersError, match="exited with status 1: RuntimeError: out of"):
        measure_step(spec, ncu=failing)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(CountersError, match=r"ncu not found on PATH") as err:
        measure_step(spec)
    assert err.value.reason == "not_found"
    with pytest.raises(ValueError, match="spec='tiny-llama': must be a StepSpec"):
        measure_step("tiny-llama")
    with pytest.raises(ValueError, match="timeout_s=0: must be"):
        measure_step(spec, timeout_s=0, ncu=failing)


def test_the_profiled_process_refuses_bad_arguments(capsys):
    assert main([]) == 2 and "0 arguments: expected one" in capsys.readouterr().err
    assert main([json.dumps({"model": "tiny-llama", "batch": 0, "prompt": 4,
                             "ahead_bytes": 0, "ahead_kv_bytes": 0})]) == 2
    assert "batch=0" in capsys.readouterr().err
    assert main(["not json"]) == 2


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu on PATH)")
def test_ncu_on_a_tiny_step_gives_every_kernel_with_and_without_the_prefetch():
    """The same kernels with the prefetch as without (it launches nothing), one GEMM a linear
    of the step: the step model's count for a streaming batch."""
    from kvlab.predict.step import ahead_hits

    without = measure_step(StepSpec("tiny-llama", 1, 16, 0), timeout_s=600)
    ahead = measure_step(StepSpec("tiny-llama", 1, 16, 1 << 20), timeout_s=600)
    assert [r["kernel_name"] for r in without] == [r["kernel_name"] for r in ahead]
    assert sum(r["is_gemm"] for r in ahead) == len(ahead_hits("tiny-llama", 1, 18, 1 << 20))
    assert all(r["l2_read_bytes"] > 0 for r in ahead if r["is_gemm"])


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu on PATH)")
def test_the_prefetch_brings_w_o_into_l2_before_it_runs():
    """Llama-3-8B at batch 1 on a short prompt: the QKV linear's last wave prefetches W_O's
    first 16 MiB (half of it), and little K/V is read in between, so W_O's loads hit L2 for
    at least 0.15 of its bytes more than without. The step model says half; what arrives in
    time is less (an H100 measured 0.016 without, 0.221 with: kvlab.predict.ahead's delivery)."""
    from kvlab.predict.step import ahead_hits

    def w_o_shares(ahead_bytes):
        rows = measure_step(StepSpec("llama3-8b", 1, 16, ahead_bytes), timeout_s=900)
        gemms = [r for r in rows if r["is_gemm"]]
        assert len(gemms) == len(ahead_hits("llama3-8b", 1, 18, ahead_bytes))
        return sorted(g["load_hit_share"] for g in gemms[1::4])  # a layer's second: W_O

    without, ahead = w_o_shares(0), w_o_shares(16 << 20)
    assert ahead[len(ahead) // 2] >= without[len(without) // 2] + 0.15


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu on PATH)")
def test_the_qkv_linear_brings_the_attentions_kv_blocks_into_l2():
    """Llama-3-8B at batch 1 on 1,000 tokens (4 MB of K and V a layer): with ahead_kv_bytes,
    each layer's QKV linear prefetches the layer's blocks as it drains, so the attention's loads
    hit L2 for at least a quarter of their bytes more than without."""
    def attention_shares(ahead_kv_bytes):
        rows = measure_step(StepSpec("llama3-8b", 1, 1000, 0, ahead_kv_bytes), timeout_s=900)
        shares = sorted(r["load_hit_share"] for r in rows if "gqa_decode" in r["kernel_name"])
        assert len(shares) == 32  # a layer's attention is one kernel at batch 1 here
        return shares

    without, with_kv = attention_shares(0), attention_shares(16 << 20)
    print(f"attention's L2 load hit share, median: {without[16]:.3f} without, "
          f"{with_kv[16]:.3f} with the K/V prefetch")
    assert with_kv[16] >= without[16] + 0.25
