"""python -m kvlab bench e2e: what it counts (CPU), and a small run on a GPU."""

import json

import pytest
import torch

from kvlab.bench.cli import main
from kvlab.bench.e2e import (
    HF_VARIANT,
    VARIANTS,
    graph_max_len,
    prefetch_pairs,
    report,
    steady_steps,
    step_bytes,
)
from kvlab.config import MODELS
from kvlab.engine.weights import ModelWeights


def test_steady_steps_start_where_two_successive_steps_agree_within_5_percent():
    assert steady_steps([50.0, 20.0, 12.0, 10.4, 10.0, 10.1]) == [10.0, 10.1]
    assert steady_steps([3.0, 9.0]) == [3.0, 9.0]  # never steady: every step
    assert steady_steps([5.0]) == [5.0]


def test_each_lever_is_compared_with_its_base_variants_tokens():
    from kvlab.bench.e2e import base_variant, same_tokens

    assert [base_variant(v) for v in VARIANTS] == [None, "vllm_v1", None, "gqa", "gqa", "gqa",
                                                   "gqa"]
    assert base_variant(HF_VARIANT) is None
    runs = {"gqa": ([], [], [], [[1, 2]]), "gqa+ahead": ([], [], [], [[1, 2]]),
            "gqa+prefetch": ([], [], [], [[1, 3]]), "vllm_v1+prefetch": ([], [], [], [[1]]),
            HF_VARIANT: ([], [], [], [])}
    assert same_tokens(runs) == {"gqa+ahead": True, "gqa+prefetch": False}
    assert prefetch_pairs(VARIANTS, "+ahead") == [("gqa+ahead", "gqa")]


def test_each_variant_sets_its_lever_and_takes_the_runs_async_decode(monkeypatch):
    """+sync is gqa with async_decode off, as the first LLM of its layout or a twin; every other
    variant runs with the run's async_decode, and a lever's size where it has one."""
    from types import SimpleNamespace

    import kvlab
    from kvlab.bench.e2e import _kvlab_runners

    built = []

    class FakeLLM:
        def __init__(self, name, **settings):
            self.settings = settings
            built.append(settings)

        def with_attention(self, attention, **settings):
            return FakeLLM(self.settings, attention=attention, **settings)

    monkeypatch.setattr(kvlab, "LLM", FakeLLM)
    args = SimpleNamespace(tp=1, async_decode=True, prompt=20, new_tokens=4)
    levers = {"ahead_bytes": 5, "ahead_kv_bytes": 7, "async_decode": False}
    runners = _kvlab_runners("tiny-qwen", None, 8, args, ["gqa", "gqa+sync", "gqa+ahead"],
                             levers)
    assert list(runners) == ["gqa", "gqa+sync", "gqa+ahead"]
    assert [b["async_decode"] for b in built] == [True, False, True]
    assert built[1]["share_cache"] and built[2]["ahead_bytes"] == 5
    built.clear()
    _kvlab_runners("tiny-qwen", None, 8, args, ["gqa+sync", "gqa"], levers)
    assert [b["async_decode"] for b in built] == [False, True]
    assert "share_cache" not in built[0] and built[1]["share_cache"]


def test_prefetch_pairs_each_variant_with_its_kernel_alone():
    assert prefetch_pairs([*VARIANTS, HF_VARIANT]) == [("vllm_v1+prefetch", "vllm_v1"),
                                                       ("gqa+prefetch", "gqa")]
    assert prefetch_pairs(["gqa+prefetch", HF_VARIANT]) == []


def test_the_kv_prefetch_takes_a_layers_kv_up_to_half_the_l2():
    from kvlab.bench.e2e import ahead_kv_bytes

    m = MODELS["llama3-8b"]  # 8 KV heads of 128: 4 KiB of K and V a token in fp16
    assert ahead_kv_bytes(m, 1, 768, 60 << 20) == 768 * 4096 == 3 << 20
    assert ahead_kv_bytes(m, 2, 4096, 60 << 20) == 30 << 20  # 32 MiB, capped
    assert ahead_kv_bytes(m, 1, 32768, 50 << 20) == 25 << 20


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
def test_a_step_reads_the_weights_and_the_batchs_kv(name):
    m = MODELS[name]
    w = ModelWeights.random(m, dtype=torch.float16)
    every = sum(t.numel() for t in (w.lm_head, w.norm_weight)) + sum(
        t.numel() for layer in w.layers
        for t in (*vars(layer.attn).values(), *vars(layer).values())
        if isinstance(t, torch.Tensor))
    rows = 3 * m.hidden_size * (2 if m.family == "opt" else 1)
    kv = 2 * m.num_layers * m.kv_size * 3 * 100
    assert step_bytes(m, w, 3, 100) == 2 * (every + rows + kv)


def test_context_beyond_the_models_limit_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "e2e", "--models", "tiny-llama", "--prompt", "500", "--new-tokens", "20"])
    assert exit_.value.code == 2
    assert "--prompt 500 + --new-tokens 20: beyond tiny-llama's context limit of 512" in \
        capsys.readouterr().err


def test_tensor_parallel_runs_under_torchrun_over_heads_that_divide(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--tp", "2"])
    assert ("--tp 2: one process per GPU, launched as torchrun --nproc-per-node 2 -m kvlab "
            "bench e2e --tp 2 (WORLD_SIZE is unset)") in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--tp", "3"])
    assert "llama3-8b's num_kv_heads=8 does not divide by 3" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--tp", "2", "--serve-rates", "8"])
    assert "--serve-rates with --tp 2: a serving run admits requests as they arrive" in \
        capsys.readouterr().err


@pytest.mark.parametrize("variant", ["gqa+ahead_kv", "gqa+sync"])
def test_a_serving_run_of_a_levers_variant_is_refused_before_the_run(capsys, variant):
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--serve-rates", "8",
              "--serve-variant", variant])
    assert (f"--serve-variant {variant}: the serving run takes the run's settings, not a "
            "lever's; one of vllm_v1, vllm_v1+prefetch, gqa, gqa+prefetch"
            in capsys.readouterr().err)


def test_a_serving_rate_whose_arrivals_pass_a_day_is_refused_before_the_run(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--serve-rates", "8", "0.001"])
    assert ("--serve-rates 0.001: 512 requests would arrive over 5" in capsys.readouterr().err)


def test_a_cache_that_ran_out_of_memory_does_not_fit_as_one_refused_before():
    from kvlab.bench.e2e import does_not_fit
    from kvlab.cache.paged_cache import DoesNotFit

    def refusal(cause):
        try:
            raise ValueError("num_blocks=8: could not allocate the K/V tensors") from cause
        except ValueError as error:
            return error

    assert does_not_fit(DoesNotFit("num_blocks=8: the K/V tensors need 9 bytes"))
    assert does_not_fit(refusal(torch.OutOfMemoryError("CUDA out of memory")))
    assert not does_not_fit(refusal(RuntimeError("CUDA error: an illegal memory access")))
    assert not does_not_fit(ValueError("--prompt 9: beyond the context limit"))


@pytest.mark.gpu
def test_a_batch_whose_cache_runs_out_of_memory_is_skipped_and_the_run_goes_on(tmp_path,
                                                                              monkeypatch):
    """check_fits judges on the free memory; an allocation may still fail (the allocator's
    fragments): that batch is skipped, with why, like one refused before allocating."""
    from kvlab.cache import paged_cache

    sizes = []  # the blocks of each K or V tensor asked for; batch 1's cache is the first

    class Torch:  # paged_cache's torch, out of memory for any cache larger than batch 1's
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(shape, **kwargs):
            sizes.append(shape[0])
            if shape[0] > sizes[0]:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 514.00 MiB")
            return torch.zeros(shape, **kwargs)

    monkeypatch.setattr(paged_cache, "torch", Torch())
    out = tmp_path / "e2e.json"
    main(["bench", "e2e", "--models", "tiny-qwen", "--batches", "1", "3", "--prompt", "20",
          "--new-tokens", "24", "--variants", "gqa", "--no-hf", "--rounds", "1",
          "--json", str(out)])
    result = json.loads(out.read_text())
    assert [(r["variant"], r["batch"]) for r in result["rows"]] == [("gqa", 1)]
    ((skipped),) = result["skipped"]
    assert (skipped["model"], skipped["batch"]) == ("tiny-qwen", 3)
    assert skipped["reason"].startswith(f"num_blocks={max(sizes)}: could not allocate the K/V "
                                        "tensors on cuda")
    assert "CUDA out of memory. Tried to allocate 514.00 MiB" in skipped["reason"]


@pytest.mark.gpu
def test_a_small_run_times_every_variant_and_hf(tmp_path):
    out, checkpoint = tmp_path / "e2e.json", tmp_path / "checkpoint.json"
    main(["bench", "e2e", "--models", "tiny-qwen", "--batches", "1", "3", "--prompt", "20",
          "--new-tokens", "24", "--json", str(out), "--checkpoint", str(checkpoint)])
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert json.loads(checkpoint.read_text())["rows"] == rows  # written after the last point
    assert result["async_decode"] is True
    assert {(r["variant"], r["batch"]) for r in rows} == {
        (v, b) for v in (*VARIANTS, HF_VARIANT) for b in (1, 3)} - {("gqa+ahead_kv", 3)}
    assert result["skipped"] == [{  # layer_ops' linears take at most 2 rows
        "model": "tiny-qwen", "batch": 3, "variant": "gqa+ahead_kv",
        "reason": "the K/V prefetch runs in layer_ops' linears, of at most 2 rows"}]
    assert result["hf_compile"] == "on" and result["warmup_rounds"] == 1
    for r in rows:
        assert len(r["step_ms_runs"]) == 23 and r["roofline_ms"] > 0
        assert r["compiled"] is (r["variant"] == HF_VARIANT)  # HF compiles its static cache
        # the steps and the prefill fit in the generate call timed from outside, and fill most
        # of it: steps timed on another basis (not waited for, or counted twice) would not
        for steps, wall in zip([r["step_ms_runs"]], r["round_wall_ms"][-1:], strict=True):
            assert sum(steps) <= wall
            assert sum(steps) + r["prefill_ms"] >= 0.5 * wall, (r["variant"], wall)
        # the timed steps exclude the warm-up: none near a compile's (some 1000x a step)
        assert max(r["step_ms_runs"][r["steady_from"]:]) < 10 * r["step_ms"]
    for r in rows:  # the cross-kernel prefetch changes no token
        assert (r.get("ahead_bytes", 0) > 0) is (r["variant"] == "gqa+ahead")
        # all of a layer's K and V at the last step (44 tokens of 2 KV heads of 64, fp16)
        assert r.get("ahead_kv_bytes") == (2 * 44 * 2 * 64 * 2 if r["variant"] == "gqa+ahead_kv"
                                           else None)
        assert r.get("same_tokens") is (
            True if r["variant"].endswith(("+ahead", "+prefetch", "+ahead_kv", "+sync"))
            else None)
        assert r.get("async_decode") is (False if r["variant"] == "gqa+sync" else None)
    # a bigger batch decodes more tokens a second on the same model
    by = {(r["variant"], r["batch"]): r["tokens_per_s"] for r in rows}
    assert all(by[v, 3] > by[v, 1] for v in (*VARIANTS, HF_VARIANT) if v != "gqa+ahead_kv")


@pytest.mark.gpu
def test_hf_compile_both_times_hf_eager_and_compiled_in_turn(tmp_path):
    out = tmp_path / "e2e.json"
    main(["bench", "e2e", "--models", "tiny-llama", "--batches", "2", "--prompt", "16",
          "--new-tokens", "16", "--variants", "gqa", "--hf-compile", "both", "--json", str(out)])
    result = json.loads(out.read_text())
    compiled = {r["variant"]: r["compiled"] for r in result["rows"]}
    assert compiled == {"gqa": False, HF_VARIANT: True, "hf-static-eager": False}
    assert result["hf_compile"] == "both"


@pytest.mark.parametrize(("async_decode", "said"), [
    (True, "; kvlab's steps queued ahead of the host (async decode)"),
    (False, "; each kvlab step waited for (no async decode)"),
    (None, "GB/s"),
])
def test_the_report_says_whether_steps_were_queued_ahead(async_decode, said):
    result = {"gpu": "H200", "roofline_copy_gbps": 4278.0, "rows": [], "serving": []}
    if async_decode is not None:  # older results do not say
        result["async_decode"] = async_decode
    assert report(result).splitlines()[0].endswith(said)


def test_serving_stats_from_arrival_first_and_last_tokens():
    from types import SimpleNamespace

    from kvlab.bench.e2e import serving_stats

    gen = SimpleNamespace(tokens=[[1, 2, 3], [4]], arrival_s=[0.0, 1.0],
                          first_token_s=[0.5, 1.25], finish_s=[0.7, 1.25], preemptions=2)
    stats = serving_stats(gen)
    assert stats["output_tokens"] == 4 and stats["duration_s"] == 1.25
    assert stats["output_tokens_per_s"] == pytest.approx(3.2)
    assert stats["tpot_ms_p50"] == pytest.approx(100.0)  # 0.2 s over 2 tokens; [4] has one
    assert stats["ttft_ms_p50"] == pytest.approx(375.0) and stats["preemptions"] == 2


def test_a_serving_workload_is_seeded_poisson_and_fits_the_model():
    from kvlab.bench.e2e import serving_workload

    m = MODELS["tiny-llama"]
    prompts, limits, arrivals = serving_workload(200, 20.0, m)
    again = serving_workload(200, 20.0, m)
    assert (prompts, limits, arrivals) == again
    assert all(b > a for a, b in zip(arrivals, arrivals[1:], strict=False))
    assert arrivals[-1] == pytest.approx(10.0, rel=0.3)  # 200 requests at 20/s
    assert all(len(p) + n <= m.max_position for p, n in zip(prompts, limits, strict=True))
    assert min(limits) >= 1 and max(max(p) for p in prompts) < m.vocab_size


@pytest.mark.gpu
def test_a_small_serving_run(tmp_path):
    out = tmp_path / "e2e.json"
    main(["bench", "e2e", "--models", "tiny-qwen", "--batches", "1", "--prompt", "20",
          "--new-tokens", "8", "--variants", "gqa", "--no-hf", "--serve-rates", "50",
          "--serve-requests", "24", "--no-async-decode", "--json", str(out)])
    result = json.loads(out.read_text())
    (serving,) = result["serving"]
    assert result["async_decode"] is False
    assert serving["requests"] == 24 and serving["rate"] == 50.0
    assert serving["output_tokens_per_s"] > 0 and serving["tpot_ms_p99"] >= serving["tpot_ms_p50"]


class FakeGPU:
    """A clock (s) that the host's work advances at once and the GPU's queued work only when the
    host waits for it (`sync`): a step timed without waiting would read the host's time alone."""

    def __init__(self):
        self.now, self.queued, self.log = 0.0, 0.0, []

    def clock(self) -> float:
        self.log.append("clock")
        return self.now

    def sync(self) -> None:
        self.log.append("sync")
        self.now, self.queued = self.now + self.queued, 0.0

    def host(self, ms: float) -> None:
        self.now += ms / 1e3

    def queue(self, ms: float) -> None:
        self.queued += ms / 1e3


class FakeHF:
    """HF's generate on a FakeGPU: a prefill of PREFILL_MS with the first token, then a decode
    step of STEP_MS per token, each handed to the stopping criteria; where it compiles (as HF
    does unless disable_compile), it asks for its compiled call and the first decode step also
    takes COMPILE_MS of host time (in its first run)."""

    PREFILL_MS, STEP_MS, COMPILE_MS = 50.0, 10.0, 24_000.0

    def __init__(self, gpu: FakeGPU):
        import types

        self.gpu, self.device = gpu, torch.device("cpu")
        self.generation_config = types.SimpleNamespace()
        self.compiled_calls = 0

    def get_compiled_call(self, config=None):
        self.compiled_calls += 1

    def generate(self, ids, max_new_tokens, min_new_tokens, do_sample, cache_implementation,
                 disable_compile, stopping_criteria):
        assert cache_implementation == "static" and not do_sample
        if not disable_compile:
            self.get_compiled_call(None)
        self.gpu.queue(self.PREFILL_MS)
        stopping_criteria(ids, None)
        for step in range(max_new_tokens - 1):
            if step == 0 and not disable_compile and self.compiled_calls == 1:
                self.gpu.host(self.COMPILE_MS)  # the first compiled run only, as torch caches
            self.gpu.queue(self.STEP_MS)
            stopping_criteria(ids, None)


@pytest.mark.parametrize("compile", [True, False])
def test_hf_steps_wait_for_each_token_before_reading_the_clock(compile):
    from kvlab.bench.e2e import _hf_steps

    gpu = FakeGPU()
    hf = FakeHF(gpu)
    steps, prefill, compiled = _hf_steps(hf, [[1, 2, 3]], 6, compile, gpu.clock, gpu.sync)
    # each step is its GPU time (the host waited for it), the compile on the first decode step
    first = FakeHF.STEP_MS + (FakeHF.COMPILE_MS if compile else 0.0)
    assert steps == pytest.approx([first] + [FakeHF.STEP_MS] * 4)
    assert prefill == pytest.approx(FakeHF.PREFILL_MS)
    assert compiled is compile and hf.compiled_calls == int(compile)
    assert "get_compiled_call" not in vars(hf)  # the spy is taken off again
    reads = [i for i, what in enumerate(gpu.log) if what == "clock"]
    assert all(gpu.log[i - 1] == "sync" for i in reads)  # synchronised before every stamp


def test_warm_up_runs_are_untimed_and_a_compile_never_counts_as_steady():
    """kvlab's runner and HF's compiled one in turn on one FakeGPU: the warm-up round (where HF
    compiles) is left out, every round's wall time holds its steps, and a row's step time is
    the steady step on both, as the GPU would give it."""
    from types import SimpleNamespace

    from kvlab.bench.e2e import HF_VARIANT, _in_turn, _row, hf_variants

    gpu = FakeGPU()
    calls = []

    def kvlab_runner(prompts):  # a CUDA-graph capture on the first call, then 8 ms steps
        calls.append("kvlab")
        gpu.host(500.0 if calls.count("kvlab") == 1 else 0.0)
        steps = []
        for _ in range(5):
            gpu.queue(8.0)
            gpu.sync()
            steps.append(8.0)
        return steps, [40.0]

    hf = hf_variants(FakeHF(gpu), 6, "on", gpu.clock, gpu.sync)
    runs = _in_turn("fake", [[1, 2]], 2, {"gqa": kvlab_runner, **hf}, clock=gpu.clock,
                    sync=gpu.sync)
    assert calls == ["kvlab"] * 3  # one warm-up call, two timed
    assert hf[HF_VARIANT].compiled is True
    args = SimpleNamespace(prompt=2, new_tokens=6)
    for variant, step in (("gqa", 8.0), (HF_VARIANT, FakeHF.STEP_MS)):
        rounds, prefills, walls, tokens = runs[variant]
        assert tokens == []  # neither runner gives its tokens
        assert len(rounds) == len(walls) == 2
        assert all(max(steps) == pytest.approx(step) for steps in rounds)  # no compile, no capture
        for steps, wall in zip(rounds, walls, strict=True):
            assert sum(steps) <= wall + 1e-9
        assert _row("m", variant, 1, args, rounds, 1.0, 1.0)["step_ms"] == pytest.approx(step)
    # without the warm-up round the compile falls in the first round: the steady rule drops it
    gpu = FakeGPU()
    hf = hf_variants(FakeHF(gpu), 8, "on", gpu.clock, gpu.sync)
    runs = _in_turn("fake", [[1, 2]], 1, hf, warmup_rounds=0, clock=gpu.clock, sync=gpu.sync)
    (steps,) = runs[HF_VARIANT][0]
    assert steps[0] > 1000 and _row("m", HF_VARIANT, 1, args, [steps], 1.0, 1.0)[
        "steady_from"] >= 1


class CycleRunner:
    """A kvlab runner on a FakeGPU that holds itself, as an LLM (with its caches and weights)
    sits in reference cycles: only a collection frees it. `built` keeps a weak reference to
    each one made."""

    built: list = []

    def __init__(self, gpu: FakeGPU):
        import weakref

        self.gpu, self.me = gpu, self
        CycleRunner.built.append(weakref.ref(self))

    def __call__(self, prompts):
        self.gpu.queue(8.0)
        self.gpu.sync()
        return [8.0] * 4, [40.0]


def test_a_batchs_kvlab_runners_are_freed_before_hfs_and_none_outlive_the_batch():
    """A set of runners is gone before the next set is built and when the batch returns:
    otherwise its caches would shrink the memory the next set's fit is judged on (a batch
    wrongly skipped as not fitting) or run the next model's weights out of memory."""
    from kvlab.bench.e2e import hf_variants, measure_batch

    gpu = FakeGPU()
    CycleRunner.built = []

    def make_hf_runners():
        assert CycleRunner.built[0]() is None, "kvlab's runners were alive when HF's were built"
        return hf_variants(FakeHF(gpu), 6, "on", gpu.clock, gpu.sync)

    runs, equal, compiled = measure_batch("fake", [[1, 2]], 1, lambda: {"gqa": CycleRunner(gpu)},
                                          make_hf_runners, clock=gpu.clock, sync=gpu.sync)
    assert CycleRunner.built[0]() is None
    assert compiled == {"gqa": False, HF_VARIANT: True}
    assert set(runs) == {"gqa", HF_VARIANT} and equal == {}


def test_a_set_part_built_before_it_did_not_fit_is_freed_before_the_next_is_built():
    """A batch whose second cache does not fit leaves its first LLM behind, in a cycle: the
    next batch's set is built only once that is collected."""
    from kvlab.bench.e2e import measure_batch
    from kvlab.cache.paged_cache import DoesNotFit

    gpu = FakeGPU()
    CycleRunner.built = []

    def part_built():
        CycleRunner(gpu)
        raise DoesNotFit("the second layout's cache does not fit")

    def make_runners():
        assert CycleRunner.built[0]() is None, "the part-built set was alive"
        return {"gqa": CycleRunner(gpu)}

    with pytest.raises(DoesNotFit):
        measure_batch("fake", [[1]], 1, part_built)
    runs, _, _ = measure_batch("fake", [[1]], 1, make_runners, clock=gpu.clock, sync=gpu.sync)
    assert list(runs) == ["gqa"]


def test_a_compile_then_a_recompile_alike_do_not_start_the_steady_state():
    assert steady_steps([24_000.0, 23_500.0, 10.0, 10.2, 10.1, 10.0]) == [10.2, 10.1, 10.0]
    assert steady_steps([12.0, 10.4, 10.0, 10.1]) == [10.0, 10.1]


def test_hf_compile_gives_one_variant_per_setting():
    from kvlab.bench.e2e import HF_EAGER_VARIANT, hf_variants

    assert {v: r.compile for v, r in hf_variants(None, 4, "both").items()} == {
        HF_VARIANT: True, HF_EAGER_VARIANT: False}
    assert list(hf_variants(None, 4, "off")) == [HF_EAGER_VARIANT]
    with pytest.raises(ValueError, match="hf_compile='yes': must be one of on, off, both"):
        hf_variants(None, 4, "yes")


def test_the_report_flags_a_lever_that_changed_the_tokens_and_says_what_was_skipped():
    row = {"model": "m", "batch": 1, "roofline_ms": 1.0, "ratio_to_roofline": 1.0,
           "step_ms": 5.0, "tokens_per_s": 200.0}
    rows = [{**row, "variant": "gqa"}, {**row, "variant": "gqa+ahead", "same_tokens": False},
            {**row, "variant": "gqa+prefetch", "same_tokens": True}]
    lines = report({"gpu": "H200", "roofline_copy_gbps": 1.0, "rows": rows, "skipped": [
        {"model": "m", "batch": 128, "reason": "num_blocks=9: the K/V tensors need 9 bytes"},
        {"model": "m", "batch": 4, "variant": "gqa+ahead_kv", "reason": "at most 2 rows"}]}
    ).splitlines()
    assert lines[3].endswith("TOKENS DIFFER from gqa")
    assert "TOKENS" not in lines[2] + lines[4]
    assert lines[5] == "m batch 128 skipped: num_blocks=9: the K/V tensors need 9 bytes"
    assert lines[6] == "m batch 4 gqa+ahead_kv skipped: at most 2 rows"


def test_ahead_bytes_needs_a_variant_to_size(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--variants", "gqa", "--ahead-bytes", "4096"])
    assert "--ahead-bytes 4096: sizes the +ahead variants (gqa+ahead), and --variants has " \
        "none" in capsys.readouterr().err


def test_the_report_compares_with_the_compiled_peer_where_it_ran():
    row = {"model": "m", "batch": 1, "roofline_ms": 1.0, "ratio_to_roofline": 1.0}
    rows = [{**row, "variant": "gqa", "step_ms": 5.0, "tokens_per_s": 200.0},
            {**row, "variant": HF_VARIANT, "step_ms": 10.0, "tokens_per_s": 100.0},
            {**row, "variant": "hf-static-eager", "step_ms": 20.0, "tokens_per_s": 50.0}]
    lines = report({"gpu": "H200", "roofline_copy_gbps": 1.0, "rows": rows}).splitlines()
    assert lines[2].split()[-1] == "2.00x" and lines[3].split()[-1] == lines[4].split()[-1] == "-"


def test_a_run_past_the_engines_default_graphs_is_served_by_graphs_to_its_end():
    from kvlab.engine.config import DEFAULT_GRAPH_MAX_LEN

    assert graph_max_len(512, 256) is None  # the engine's default: its spans, its plans
    assert graph_max_len(DEFAULT_GRAPH_MAX_LEN - 256, 256) is None
    assert graph_max_len(32640, 128) == 32768
