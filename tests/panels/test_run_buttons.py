"""The dashboard's Run buttons call the benchmarks' keyword entry points with the widgets'
values (no command line in between): the entry point replaced by a recorder, on the CPU."""

import pytest

import kvlab.panels.widgets
from kvlab.panels.decode_kernels import RECORDED
from kvlab.results import load_results, nearest_rows


def fake_gpu(monkeypatch, module):
    """The tab's cuda path without a GPU: an H200 in use."""
    from kvlab.gpus import GPUS

    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(kvlab.panels.widgets, "local_gpu", lambda: GPUS["h200"])
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")


@pytest.fixture
def measured(monkeypatch):
    """kvlab.bench.attention.measure_point replaced by a recorder of its calls that returns the
    recorded rows of the point asked."""
    from kvlab.bench import attention

    recorded, calls = load_results(*RECORDED), []

    def measure_point(model, batch, context, **options):
        calls.append({"model": model, "batch": batch, "context": context, **options})
        shape = 1024 if isinstance(context, str) else context
        return {**recorded, "rows": nearest_rows(recorded, model, batch, shape)}

    monkeypatch.setattr(attention, "measure_point", measure_point)
    return calls


@pytest.mark.parametrize(("controls", "expected"), [
    ({}, {"model": "llama3-8b", "batch": 64, "context": 1024, "block_sizes": [16],
          "distances": [1], "fp8": False, "in_order": False,
          "kernels": ["vllm_v1", "gqa", "sdpa", "read"]}),
    ({"model": "qwen2.5-7b", "batch": 16, "context": 4096, "distance": 2, "kv_dtype": "fp8"},
     {"model": "qwen2.5-7b", "batch": 16, "context": 4096, "block_sizes": [16],
      "distances": [2], "fp8": True, "in_order": False,
      "kernels": ["vllm_v1", "gqa", "sdpa", "read"]}),
    ({"blocks": "in order"}, {"in_order": True}),
    ({"lengths": "lognormal:3200,16384"},
     {"context": "lognormal:3200,16384", "kernels": ["vllm_v1", "gqa", "read"],
      "prefetch": ["none"]}),
])
def test_decode_kernels_run_calls_attention_measure_point(monkeypatch, measured, controls,
                                                          expected):
    import kvlab.panels.decode_kernels as module

    fake_gpu(monkeypatch, module)
    tab = module.DecodeKernelsTab(batch=64, context=1024)
    for name, value in controls.items():
        tab.controls[name].value = value
    tab.run_button.click()
    (call,) = measured
    assert {k: call[k] for k in expected} == expected
    assert set(call) - {"prefetch"} == {"model", "batch", "context", "block_sizes", "distances",
                                        "fp8", "in_order", "kernels"}
    assert tab.progress.value == tab.progress.max == 1
