"""The figures the docs show, made from the recorded results: one module per docs page, each
with `BLOCKS`, a dict from a block's name ("<module>.<what>") to a function of no arguments that
returns its Markdown (a list of lines for a block of its own, a string for a figure inside a
sentence). `benchmarks/docgen.py` writes them between the docs' markers and checks them.
"""

from __future__ import annotations

import importlib
import pkgutil


def blocks() -> dict:
    """Every module's BLOCKS, merged: name -> function. Raises ValueError for a name outside its
    module's prefix or named twice."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "common":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, make in getattr(module, "BLOCKS", {}).items():
            if not name.startswith(f"{info.name}.") or name in found:
                raise ValueError(f"block {name!r} of figures.{info.name}: a name must start "
                                 f"with {info.name + '.'!r} and be unique")
            found[name] = make
    return found
