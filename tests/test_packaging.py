"""The set-up promises: Binder mirrors the conda environment, dependencies agree, CI runs the
README's test command, and the installed wheel carries the CUDA C sources."""

import importlib.resources
import os
import re
import tomllib
from pathlib import Path

import pytest

import kvlab

ROOT = Path(__file__).resolve().parents[1]
# conda-forge's names for PyPI requirements
CONDA_NAMES = {"torch": "pytorch-cpu", "nvidia-cuda-nvrtc": "cuda-nvrtc"}


def requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0].lower()


def conda_dependencies() -> dict[str, str]:
    """name -> its line, for each dependency of environment.yml."""
    text = (ROOT / "environment.yml").read_text()
    lines = text[text.index("dependencies:"):].splitlines()
    return {requirement_name(line.strip()[2:]): line.strip()[2:] for line in lines
            if line.startswith("  - ")}


def lower_bound(spec: str) -> str | None:
    found = re.search(r">=\s*([0-9][0-9.]*)", spec)
    return found and found.group(1)


def test_binder_environment_is_the_root_environment():
    binder = (ROOT / "binder" / "environment.yml").read_bytes()
    assert binder == (ROOT / "environment.yml").read_bytes()


def test_binder_scripts():
    for name in ("postBuild", "start"):
        assert os.access(ROOT / "binder" / name, os.X_OK), f"binder/{name} must be executable"
    assert "KVLAB_BACKEND=sim" in (ROOT / "binder" / "start").read_text()
    assert "pip install" in (ROOT / "binder" / "postBuild").read_text()


def test_conda_environment_names_exactly_the_dependencies_with_their_bounds():
    """environment.yml (and so Binder) is the pyproject's runtime and dev dependencies, no more,
    no fewer, at the same lower bounds; plus python and pip. (What conda-forge resolves is left
    to conda: no solver runs here.)"""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    specs = {CONDA_NAMES.get(requirement_name(s), requirement_name(s)): s for s in wanted}
    conda = conda_dependencies()
    assert set(conda) == set(specs) | {"python", "pip"}
    for name, spec in specs.items():
        assert lower_bound(conda[name]) == lower_bound(spec), (conda[name], spec)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make lab " in readme and "make test " in readme
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)


def test_installed_package_ships_the_cuda_sources():
    package_dir = Path(kvlab.__file__).resolve().parent
    if package_dir.parent == ROOT:
        pytest.skip("kvlab is imported from the source tree, not from an installed wheel")
    shipped = importlib.resources.files("kvlab") / "csrc"
    expected = {p.name for p in (ROOT / "kernels").iterdir() if p.is_file()}
    assert expected and expected <= {p.name for p in shipped.iterdir()}


def test_readme_examples_run():
    """Blocks fenced ```python run on a CPU; GPU-only snippets are fenced ```py."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
