"""The performance model (results/cpu/predict.json): its constants, its held-out error and the
paper's H20 predicted. docs/predict.md is written whole by benchmarks/predict_fit.py
(kvlab.predict.report.markdown, whose blocks are `kvlab.predict.report.figures`); these are the
same blocks, so that docgen checks the page like every other.
"""

from __future__ import annotations

import functools

from kvlab.predict import report
from kvlab.results import load_result


@functools.cache
def _figures() -> dict:
    return report.figures(load_result("cpu", "predict"))


BLOCKS = {f"predict.{name}": (lambda name=name: _figures()[name]) for name in _figures()}
