"""What a recording records about where and by what code it ran (kvlab.bench.env): the
components' versions, the host, the GPU's UUID; nvidia-smi and torch faked (CPU)."""

import json
import socket
import subprocess
from types import SimpleNamespace

import pytest

from kvlab import components
from kvlab.bench import env

# One GPU as nvidia-smi answers NVIDIA_SMI_FIELDS: driver, uuid, clocks, temperature
SMI_LINE = "570.86.15, GPU-5f1e2d3c-0000-1111-2222-333344445555, 1980, 3201, 1980, 3201, 34\n"


def fake_smi(monkeypatch, stdout: str, returncode: int = 0) -> list:
    """nvidia-smi answering `stdout`; returns the list of the commands it was asked."""
    asked = []

    def run(command, **kwargs):
        asked.append(command)
        return subprocess.CompletedProcess(command, returncode, stdout=stdout, stderr="")

    monkeypatch.setattr(env.subprocess, "run", run)
    return asked


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch's properties of one GPU, its UUID as torch gives it (without nvidia-smi's "GPU-")."""
    import torch

    props = SimpleNamespace(name="Fake GPU", multi_processor_count=132,
                            uuid="5f1e2d3c-0000-1111-2222-333344445555")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    return props


def test_run_info_records_every_components_version_and_the_host(monkeypatch):
    monkeypatch.setattr(env, "git_state", lambda: {"git_revision": None, "git_dirty": None,
                                                   "git_source": None})
    info = env.run_info()
    assert info["components"] == components.versions()
    assert list(info["components"]) == list(components.COMPONENTS)
    assert info["host"] == socket.gethostname()
    assert list(info)[:6] == ["date", "kvlab", "git_revision", "git_dirty", "git_source",
                              "components"]


def test_nvidia_smi_reads_the_uuid_as_text(monkeypatch):
    asked = fake_smi(monkeypatch, SMI_LINE)
    found = env._nvidia_smi(0)
    assert "uuid" in asked[0][-1].split("=", 1)[1].split(",")
    assert found == {"driver_version": "570.86.15",
                     "uuid": "GPU-5f1e2d3c-0000-1111-2222-333344445555", "sm_mhz": 1980.0,
                     "mem_mhz": 3201.0, "max_sm_mhz": 1980.0, "max_mem_mhz": 3201.0,
                     "temperature_c": 34.0}
    assert env.gpu_state(0) == {"sm_mhz": 1980.0, "mem_mhz": 3201.0, "max_sm_mhz": 1980.0,
                                "max_mem_mhz": 3201.0, "temperature_c": 34.0}


def test_gpu_info_records_the_uuid_from_nvidia_smi(monkeypatch, fake_gpu):
    fake_smi(monkeypatch, SMI_LINE.replace("GPU-5f1e", "GPU-aaaa"))
    info = env.gpu_info(0)
    assert info["gpu"] == "Fake GPU" and info["driver"] == "570.86.15"
    assert info["gpu_uuid"] == "GPU-aaaa2d3c-0000-1111-2222-333344445555"
    assert "uuid" not in info["clocks_start"] and "driver_version" not in info["clocks_start"]


def test_gpu_info_takes_torchs_uuid_where_nvidia_smi_cannot_tell(monkeypatch, fake_gpu):
    fake_smi(monkeypatch, "", returncode=9)
    info = env.gpu_info(0)
    assert info["gpu_uuid"] == "GPU-5f1e2d3c-0000-1111-2222-333344445555"
    assert info["driver"] is None and info["clocks_start"] == {}
    del fake_gpu.uuid
    assert env.gpu_info(0)["gpu_uuid"] is None


def test_run_info_records_the_gpu_checks_the_device_script_ran(monkeypatch):
    monkeypatch.delenv("KVLAB_GPU_CHECKS", raising=False)
    assert "gpu_checks" not in env.run_info()
    checks = {"tests": "40 passed, 233 deselected (tests/bench)", "memcheck": "0 errors"}
    monkeypatch.setenv("KVLAB_GPU_CHECKS", json.dumps(checks))
    assert env.run_info()["gpu_checks"] == checks


@pytest.mark.parametrize("text", ["40 passed", "[]", '{"tests": 40}', '{"pytest": "40 passed"}'])
def test_gpu_checks_refuse_what_the_device_script_does_not_write(monkeypatch, text):
    monkeypatch.setenv("KVLAB_GPU_CHECKS", text)
    with pytest.raises(ValueError, match=r"KVLAB_GPU_CHECKS=.*: must be a JSON object of strings"):
        env.gpu_checks()
