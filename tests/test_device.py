import pytest

import kvlab
import kvlab.device as device_module


def test_sim_override(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    assert kvlab.backend() == "sim"
    assert "simulated" in kvlab.device_label()


def test_unknown_override(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "tpu")
    with pytest.raises(ValueError, match=r"KVLAB_BACKEND='tpu': must be one of \('cuda', 'sim'\)"):
        kvlab.backend()


def test_detection_follows_the_gpu(monkeypatch):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    monkeypatch.setattr(device_module, "_gpu_name", lambda: "NVIDIA H200")
    assert kvlab.backend() == "cuda"
    assert kvlab.device_label() == "measured on NVIDIA H200"
    monkeypatch.setattr(device_module, "_gpu_name", lambda: None)
    assert kvlab.backend() == "sim"


def test_cuda_override_without_a_gpu_is_an_error(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "cuda")
    monkeypatch.setattr(device_module, "_gpu_name", lambda: None)
    with pytest.raises(RuntimeError, match="no CUDA GPU is usable"):
        kvlab.backend()


@pytest.mark.gpu
def test_detects_the_gpu(monkeypatch):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    assert kvlab.backend() == "cuda"


def test_without_a_driver_the_answer_needs_no_torch():
    """On a machine whose CUDA driver sees no GPU (this CPU test's machines), detection says
    "sim" without importing torch; where the driver reports one, torch confirms it."""
    import subprocess
    import sys

    code = ("import sys, kvlab, kvlab.device as d; b = kvlab.backend(); "
            "print(b, d._driver_device_count(), 'torch' in sys.modules)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "KVLAB_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    backend, devices, torch_loaded = out.stdout.split()
    if int(devices) == 0:
        assert (backend, torch_loaded) == ("sim", "False")
    else:
        assert torch_loaded == "True"


def test_no_driver_library_is_no_gpu(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(device_module.ctypes, "CDLL", missing)
    assert device_module._driver_device_count() == 0
