"""kvlab.profile.ncu: the command, the parse of ncu's raw CSV (refusal, missing metric, bad value,
unknown unit), and the subprocess with a fake `ncu` (missing, refusing, failing, past its
timeout, answering) on the CPU; one real profile on the GPU."""

import csv
import io
import json
import math
import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from kvlab.profile import CountersError, KernelSpec, counters, measure, measure_many
from kvlab.profile.ncu import METRICS, SMS_MARKER, command, parse

# ncu 2025.3's output on the H200 for two launches (llama3-8b, 16 x 4k: vllm_v1 without prefetch,
# gqa with "bulk K+V d=2"), recorded by the command of kvlab.profile.ncu.command
SAMPLE = Path(__file__).parent / "data" / "ncu_raw_h200.csv"
REFUSAL = (
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
    "Performance Counters on the target device 0. For instructions on enabling permissions and "
    "to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
    "==PROF== Disconnected from process 4242\n"
    "==WARNING== No kernels were profiled.\n"
)
METRIC = "gpu__time_duration.sum"


def make_spec(kernel: str = "vllm_v1", **change) -> KernelSpec:
    return KernelSpec.for_model("llama2-7b", kernel, **{"batch": 64, "context": 4096, **change})


def sample() -> str:
    return SAMPLE.read_text()


def with_field(text: str, metric: str, row: int, value: str | None) -> str:
    """The sample with the `metric` field of CSV row `row` (0 header, 1 units, 2 launch) set to
    `value`, or the metric's column dropped everywhere when value is None."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.reader(lines[start:start + 3]))
    column = rows[0].index(metric)
    for i, fields in enumerate(rows):
        if value is None:
            del fields[column]
        elif i == row:
            fields[column] = value
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "\n".join(lines[:start]) + "\n" + out.getvalue() + "\n".join(lines[start + 3:])


def test_parse_the_recorded_sample_normalizes_units_and_separators():
    vllm, gqa = parse(sample(), expected=2)
    assert vllm["kernel_name"].startswith("void vllm_decode<__half, 128, 16, 512,")
    assert gqa["kernel_name"].startswith("void gqa_decode<__half, __half, 128, 16, 4,")
    assert vllm["duration_us"] == pytest.approx(159.008)  # "159,008" ns
    assert vllm["dram_read_bytes"] == 269_218_560  # "269,218,560" byte
    assert vllm["l2_hit_pct"] == pytest.approx(47.32)
    assert vllm["cpi"] == pytest.approx(6.56)  # cycle
    assert vllm["long_scoreboard_cycles"] == pytest.approx(2.74)  # inst
    assert vllm["l2_read_bytes"] == 22_547_891 * 32  # "22,547,891" sector
    assert vllm["l2_read_hit_bytes"] == 10_567_548 * 32
    assert gqa["l2_hit_pct"] == pytest.approx(32.34)
    # gqa asks L2 for each byte once: about as many sectors as DRAM gives (8,400,536 of 32 bytes)
    assert gqa["l2_read_bytes"] == 8_395_467 * 32
    assert gqa["dram_read_bytes"] == 268_817_152
    # its loads hit 47% where every lookup (the prefetches' and the L2 fabric's too) hits 32%
    assert gqa["l2_read_hit_bytes"] == 3_949_219 * 32
    assert gqa["l2_read_hit_bytes"] / gqa["l2_read_bytes"] == pytest.approx(0.4704, abs=1e-4)
    for row in (vllm, gqa):
        assert set(row) == {"kernel_name", *METRICS}
        assert all(math.isfinite(row[c]) for c in METRICS)


def test_parse_scales_a_prefixed_unit():
    text = with_field(with_field(sample(), METRIC, 1, "ms"), METRIC, 2, "1.5")
    assert parse(text, expected=2)[0]["duration_us"] == pytest.approx(1500.0)


def test_refusal_says_so_and_how_to_allow():
    with pytest.raises(CountersError) as err:
        parse(REFUSAL)
    assert err.value.reason == "refused"
    message = str(err.value)
    assert "ncu refused the performance counters (ERR_NVGPUCTRPERM" in message
    assert "NVreg_RestrictProfilingToAdminUsers=0" in message and "\n" not in message


@pytest.mark.parametrize(
    ("text", "reason", "message"),
    [
        (lambda s: with_field(s, METRIC, 0, None), "output",
         f"metric {METRIC} missing from ncu's output"),
        (lambda s: with_field(s, METRIC, 2, "n/a"), "output",
         f"metric {METRIC}: value 'n/a' is not a number"),
        (lambda s: with_field(s, METRIC, 2, "27.595.520"), "output",
         f"metric {METRIC}: value '27.595.520' is not a number"),
        (lambda s: with_field(s, METRIC, 1, "cycle"), "output",
         f"metric {METRIC}: unit 'cycle' unknown, expected one of"),
        (lambda s: s + next(line for line in reversed(s.splitlines()) if line.startswith('"'))
         + "\n", "output", "ncu profiled 3 launches matching regex:vllm_decode; expected 2"),
        (lambda s: "\n".join(line for line in s.splitlines() if not line.startswith(('"0"', '"1"')))
         + "\n==WARNING== No kernels were profiled.\n", "no_kernel",
         "ncu profiled no kernel matching regex:vllm_decode"),
        (lambda s: "==WARNING== No kernels were profiled.\n", "no_kernel",
         "ncu profiled no kernel matching regex:vllm_decode"),
    ],
)
def test_no_partial_row(text, reason, message):
    with pytest.raises(CountersError) as err:
        parse(text(sample()), "regex:vllm_decode", expected=2)
    assert err.value.reason == reason
    assert message in str(err.value)


def test_command_profiles_one_launch_of_each_spec_in_one_process():
    specs = [make_spec(num_sms=78), make_spec(kernel="gqa", prefetch="bulk K+V d=1")]
    cmd = command(specs, "/opt/ncu")
    assert cmd[0] == "/opt/ncu"
    options = cmd[1:cmd.index(sys.executable)]
    assert options[0] == "--csv"
    flags = dict(zip(options[1::2], options[2::2], strict=True))  # then options with values
    assert flags["--clock-control"] == "none" and flags["--cache-control"] == "all"
    assert flags["--kernel-name"] == "regex:gqa_decode|vllm_decode"
    assert "--launch-skip" not in flags and "--launch-count" not in flags
    assert flags["--page"] == "raw" and flags["--print-units"] == "base"
    assert flags["--metrics"].split(",") == [m for m, _ in METRICS.values()]
    assert cmd[-4:-1] == [sys.executable, "-m", "kvlab.profile.launch"]
    assert [KernelSpec(**fields) for fields in json.loads(cmd[-1])] == specs
    assert "regex:vllm_decode" in command([make_spec()])


def first_launch_only(text: str) -> str:
    """The sample without its second launch row (ID 1)."""
    return "\n".join(line for line in text.splitlines() if not line.startswith('"1"')) + "\n"


def test_parse_keeps_every_launch_in_order():
    rows = parse(sample(), expected=2)
    assert [r["duration_us"] for r in rows] == pytest.approx([159.008, 75.232])
    (row,) = parse(first_launch_only(sample()))
    assert row["duration_us"] == pytest.approx(159.008)


def fake_ncu(folder: Path, script: str) -> None:
    """An executable `ncu` in `folder` running the shell `script`."""
    path = folder / "ncu"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_missing_ncu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CountersError, match=r"^ncu not found on PATH \(ncu='ncu'\)") as err:
        counters(make_spec())
    assert err.value.reason == "not_found"


def test_refusing_ncu(monkeypatch, tmp_path):
    (tmp_path / "refusal.txt").write_text(REFUSAL)
    fake_ncu(tmp_path, f"cat {tmp_path / 'refusal.txt'}\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(CountersError) as err:
        counters(make_spec())
    assert err.value.reason == "refused"


def test_failed_process_gives_its_last_words(tmp_path):
    fake_ncu(tmp_path, "echo 'Traceback (most recent call last):' >&2\n"
                       "echo 'RuntimeError: num_sms=78: green contexts are not available' >&2\n"
                       "echo '==ERROR== The application returned an error code (1).'\nexit 1\n")
    with pytest.raises(CountersError) as err:
        measure(make_spec(), ncu=str(tmp_path / "ncu"))
    assert err.value.reason == "failed"
    assert str(err.value) == (
        "ncu exited with status 1: ==ERROR== The application returned an error code (1).; "
        "RuntimeError: num_sms=78: green contexts are not available")


def test_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    fake_ncu(tmp_path, f"sleep 60 &\necho $! > {pid_file}\nwait\n")
    started = time.monotonic()
    with pytest.raises(CountersError, match=r"^ncu ran past timeout_s=1; killed") as err:
        measure(make_spec(), timeout_s=1, ncu=str(tmp_path / "ncu"))
    assert err.value.reason == "timeout"
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    for _ in range(100):  # the orphaned sleep is reaped by init soon after its kill
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"the profiled process {child} outlived the timeout")


def test_answering_ncu_gives_one_whole_row(tmp_path):
    (tmp_path / "one.csv").write_text(first_launch_only(sample()))
    fake_ncu(tmp_path, f"cat {tmp_path / 'one.csv'}\necho '{SMS_MARKER}0 132' >&2\n")
    frame = counters(make_spec(), ncu=str(tmp_path / "ncu"))
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row["kernel"], row["batch"], row["num_sms"], row["num_sms_used"]) == (
        "vllm_v1", 64, None, 132)
    assert row["duration_us"] == pytest.approx(159.008)


def test_one_ncu_answers_for_many_specs_in_order(tmp_path):
    fake_ncu(tmp_path, f"cat {SAMPLE}\n"
                       f"echo '{SMS_MARKER}0 132' >&2\necho '{SMS_MARKER}1 80' >&2\n")
    specs = [make_spec(), make_spec(num_sms=78)]
    rows = measure_many(specs, ncu=str(tmp_path / "ncu"))
    assert [(r["num_sms"], r["num_sms_used"]) for r in rows] == [(None, 132), (78, 80)]
    assert [r["duration_us"] for r in rows] == pytest.approx([159.008, 75.232])
    with pytest.raises(CountersError, match="profiled 2 launches matching .*; expected 3"):
        measure_many([*specs, make_spec()], ncu=str(tmp_path / "ncu"))


def test_answering_ncu_without_the_sms_line_is_refused(tmp_path):
    (tmp_path / "one.csv").write_text(first_launch_only(sample()))
    fake_ncu(tmp_path, f"cat {tmp_path / 'one.csv'}\n")
    with pytest.raises(CountersError, match="did not write one line") as err:
        measure(make_spec(), ncu=str(tmp_path / "ncu"))
    assert err.value.reason == "failed"


@pytest.mark.parametrize(("change", "message"), [
    ({"spec": "llama2-7b"}, "spec='llama2-7b': must be a KernelSpec"),
    ({"timeout_s": 0}, "timeout_s=0: must be a finite number > 0"),
    ({"timeout_s": math.inf}, "timeout_s=inf: must be a finite number > 0"),
])
def test_bad_arguments_before_anything_runs(change, message):
    arguments = {"spec": make_spec(), "timeout_s": 1, **change}
    with pytest.raises(ValueError, match=message):
        measure(arguments.pop("spec"), **arguments)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu on PATH)")
@pytest.mark.parametrize("kernel", ["vllm_v1", "gqa"])
def test_ncu_on_a_small_case_returns_every_metric(kernel):
    spec = KernelSpec.for_model("tiny-llama", kernel, "bulk K+V d=1", batch=4, context=97)
    row = counters(spec, timeout_s=300).iloc[0]
    assert ("vllm_decode" if kernel == "vllm_v1" else "gqa_decode") in row["kernel_name"]
    for column in METRICS:
        assert math.isfinite(row[column]), column
    assert row["duration_us"] > 0 and row["num_sms_used"] >= 1
