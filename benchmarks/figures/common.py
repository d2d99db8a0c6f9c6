"""Helpers shared by the figure modules: how a model, a context and a spread of ratios read."""

from __future__ import annotations

import statistics

from kvlab.config import MODELS


def heads(model: str) -> str:
    """"32:8": the model's query heads to KV heads."""
    m = MODELS[model]
    return f"{m.num_qo_heads}:{m.num_kv_heads}"


def context_label(tokens: int) -> str:
    """"32k" for 32768 tokens; a context under 1k as its number."""
    return f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)


def loops(result: dict, keep=lambda r: True) -> dict:
    """The rows of a result that `keep` accepts, by point: (model, batch, context, lengths spec
    or None) -> {kernel: row}, the variants timed in that point's loop."""
    found = {}
    for r in result["rows"]:
        if keep(r):
            key = (r["model"], r["batch"], r["context"], r.get("lengths"))
            found.setdefault(key, {})[r["kernel"]] = r
    return found


def spread(ratios) -> str:
    """"0.981-1.044x (median 1.002x)"."""
    return f"{min(ratios):.3f}-{max(ratios):.3f}x (median {statistics.median(ratios):.3f}x)"


def value_range(values, fmt: str = "{:.2f}", unit: str = "x") -> str:
    """"0.98-1.04x", or one value where both ends print alike ("1.00x"): the ends formatted
    with `fmt`, then `unit`."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def pct_range(values) -> str:
    """"71.2%" or "68.0-71.2%"."""
    return value_range(values, "{:.1f}", "%")


def source(machine: str, name: str) -> str:
    """Where a page's figures come from and whether they are current: "`results/h200/x.json`,
    recorded on NVIDIA H200, 2026-12-03 at bcfeff1; gqa, engine changed since" (every component
    of its benchmark whose code differs now, `kvlab.results.changed_since`)."""
    from kvlab.results import changed_since, label, load_result

    result = load_result(machine, name)
    changed = changed_since(result)
    text = f"`results/{machine}/{name}.json`, {label(result, changes=False)}"
    return text + (f"; {', '.join(changed)} changed since" if changed else "")
