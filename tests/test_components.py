"""The components a recording measures (kvlab.components): the table names real files and
covers the code, each benchmark's components hold what its harness imports, and a version
changes when one of its files does, in a checkout's layout as in a wheel's (CPU)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab import components
from kvlab.components import (
    BENCHMARKS,
    COMPONENTS,
    UNMEASURED,
    benchmark_components,
    digest,
    source_path,
    version,
)

ROOT = Path(__file__).resolve().parents[1]
# What a benchmark runs beyond its harness's imports: the process ncu profiles, the dashboard
ALSO_RUNS = {"counters": ["kvlab/profile/launch.py"], "dashboard": ["kvlab/panels/__init__.py"]}
# Benchmarks run as `python -m kvlab bench <name>`: their options are declared in cli.py
BY_CLI = ("attention", "counters", "timeline", "e2e", "kvpr", "cache", "l2sim")


def owners() -> dict[str, str]:
    """file -> the first component naming it."""
    found = {}
    for name, paths in COMPONENTS.items():
        for path in paths:
            found.setdefault(path, name)
    return found


def test_every_file_named_exists():
    missing = [(name, path) for name, paths in COMPONENTS.items() for path in paths
               if not (ROOT / path).is_file()]
    assert missing == []
    assert [p for p in UNMEASURED if not (ROOT / p).is_file()] == []


def test_every_kernel_and_module_is_in_a_component_or_unmeasured():
    code = {str(p.relative_to(ROOT)) for p in (ROOT / "kvlab").rglob("*.py")}
    code |= {str(p.relative_to(ROOT)) for ext in ("*.cu", "*.cuh")
             for p in (ROOT / "kernels").glob(ext)}
    named = set(owners())
    assert sorted(code - named - set(UNMEASURED)) == []
    assert named.isdisjoint(UNMEASURED)


def test_benchmarks_name_components_and_every_recorded_benchmark_is_mapped():
    import json

    for benchmark, names in BENCHMARKS.items():
        assert set(names) <= set(COMPONENTS), benchmark
        assert len(set(names)) == len(names), benchmark
    recorded = {json.loads(p.read_text())["benchmark"]
                for p in (ROOT / "benchmarks" / "results").glob("*/*.json")}
    assert recorded <= set(BENCHMARKS)


def module_file(module: str) -> Path | None:
    path = ROOT / Path(*module.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imported_files(path: Path) -> set[Path]:
    """The kvlab files that `path` imports anywhere in it, with the packages above each."""
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names if a.name.split(".")[0] == "kvlab"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *filter(None, [base])])
            if base.split(".")[0] == "kvlab":
                modules |= {f"{base}.{a.name}" if module_file(f"{base}.{a.name}") else base
                            for a in node.names}
    parts = [m.split(".") for m in modules]
    return {f for p in parts for i in range(1, len(p) + 1)
            if (f := module_file(".".join(p[:i]))) is not None}


def reached(entries: list[str]) -> set[str]:
    """The files `entries` import, directly or not (cli.py's own imports aside: it declares
    every benchmark's options, and runs none of them)."""
    seen, todo = set(), [ROOT / e for e in entries]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            if path != ROOT / "kvlab/bench/cli.py":
                todo.extend(imported_files(path))
    return {str(p.relative_to(ROOT)) for p in seen}


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_each_benchmark_holds_the_components_its_harness_imports(benchmark):
    harness = [p for name in BENCHMARKS[benchmark] if name.startswith("bench_")
               for p in COMPONENTS[name] if p.endswith(".py") and not p.startswith("tests/")]
    entries = harness + ALSO_RUNS.get(benchmark, [])
    if benchmark in BY_CLI:
        entries.append("kvlab/__main__.py")
    owner = owners()
    needed = {owner[f] for f in reached(entries) if f not in UNMEASURED}
    assert sorted(needed - set(BENCHMARKS[benchmark])) == []


def copy_tree(top: Path, names=("gqa", "vllm_v1"), wheel=False) -> Path:
    """The files of `names` under `top` as a checkout holds them, or (`wheel`) as a wheel does:
    kernels/ as kvlab/csrc/."""
    for path in {p for n in names for p in COMPONENTS[n]}:
        to = top / ("kvlab/csrc" + path.removeprefix("kernels") if wheel and path.startswith(
            "kernels/") else path)
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, to)
    return top


def use_tree(monkeypatch, top: Path) -> None:
    monkeypatch.setattr(components, "PACKAGE_DIR", top / "kvlab")
    monkeypatch.setattr(components, "CHECKOUT_DIR", top)
    monkeypatch.setattr(components, "PACKAGED_KERNELS", top / "kvlab" / "csrc")


def test_a_version_changes_when_a_file_of_it_changes(tmp_path, monkeypatch):
    before = {n: version(n) for n in ("gqa", "vllm_v1")}
    use_tree(monkeypatch, copy_tree(tmp_path))
    assert {n: version(n) for n in before} == before
    with open(tmp_path / "kernels" / "prefetch.cuh", "ab") as f:  # shared by both families
        f.write(b" ")
    assert version("gqa") != before["gqa"] and version("vllm_v1") != before["vllm_v1"]
    (tmp_path / "kvlab" / "kernels" / "gqa.py").unlink()
    assert version("gqa") is None
    assert version("vllm_v1") not in (None, before["vllm_v1"])


def test_a_wheel_computes_the_versions_of_its_checkout(tmp_path, monkeypatch):
    """kernels/ shipped as kvlab/csrc/ gives the same versions, and every component is made of
    files the wheel ships, so a label reads the same installed as checked out."""
    assert all(p.startswith(("kernels/", "kvlab/")) for f in COMPONENTS.values() for p in f)
    before = {n: version(n) for n in ("gqa", "vllm_v1")}
    use_tree(monkeypatch, copy_tree(tmp_path, wheel=True))
    assert source_path("kernels/paged_decode_gqa.cu") == (
        tmp_path / "kvlab" / "csrc" / "paged_decode_gqa.cu")
    assert version("gqa") == before["gqa"] and version("vllm_v1") == before["vllm_v1"]


def test_digest_is_of_names_bytes_and_order_and_none_for_an_absent_file():
    one = digest([("a", b"x"), ("b", b"y")])
    assert len(one) == components.VERSION_HEX and int(one, 16) >= 0
    assert one == digest([("a", b"x"), ("b", b"y")])
    assert one != digest([("b", b"y"), ("a", b"x")])
    assert one != digest([("a", b"x"), ("c", b"y")])
    assert digest([("a", b"xb"), ("", b"y")]) != digest([("a", b"x"), ("b", b"y")])
    assert digest([("a", b"x"), ("b", None)]) is None


def test_unknown_names_are_value_errors_listing_the_known():
    with pytest.raises(ValueError, match=r"name='gpa': not a component; components: \['gqa'"):
        version("gpa")
    with pytest.raises(ValueError, match=r"benchmark='attn': not a benchmark; benchmarks: "):
        benchmark_components("attn")
    assert benchmark_components("e2e") == BENCHMARKS["e2e"]


def test_versions_cover_every_component_here():
    found = components.versions()
    assert list(found) == list(COMPONENTS)
    assert all(v is not None for v in found.values())  # a checkout holds every file


def test_importing_components_loads_no_torch():
    code = "import sys, kvlab.components; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
