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
