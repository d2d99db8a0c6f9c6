"""Figures the docs may state that no kvlab recording measured: a paper's claim, a GPU's
specification, a target an issue set. Each with its source; `benchmarks/docgen.py` accepts these
and no other figure typed into the prose."""

FACTS = {
    "2.15x": "arXiv 2504.06319: the prefetch kernel's speedup over vLLM's on an H20",
    "1.84-2.15x": "arXiv 2504.06319: its kernel speedups over vLLM's on an H20, over its models",
    "3.11": "the oldest Python kvlab supports (pyproject.toml, requires-python)",
    "1.08x": "issue 52's target: a batch-1 step at most this over the roofline step",
    "1.20x": "issue 52's target: a batch-64 step at most this over the roofline step",
}
