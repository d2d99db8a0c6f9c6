"""Figures of whole-model decoding (`python -m kvlab bench e2e` rows, or one `kvlab.LLM`
generation): tokens/s against batch per attention variant beside HF's static cache and the
roofline, tokens/s against the tensor-parallel degree, and the time of each decode step; and
the rows of the reference GPU's runs modelled for another GPU (`modelled_rows`), for the same
figures."""

from __future__ import annotations

import statistics

import plotly.graph_objects as go

from kvlab import gpus
from kvlab.checks import check_positive_int, is_real
from kvlab.config import MODELS
from kvlab.viz.layout import style

__all__ = ["TITLES", "anatomy_figure", "is_hf", "kernel_name", "modelled_rows", "steps_figure",
           "tensor_parallel_figure", "throughput_figure", "trace_figure", "trace_groups"]

VARIANT_COLORS = {"vllm_v1": "#1f77b4", "vllm_v1+prefetch": "#9ecae1", "gqa": "#2ca02c",
                  "gqa+prefetch": "#98df8a", "gqa+ahead": "#17becf", "hf-static": "#7f7f7f",
                  "hf-static-eager": "#bdbdbd"}


def is_hf(variant: str) -> bool:
    """Whether `variant` is HF's peer (compiled, "hf-static", or eager, "hf-static-eager")
    rather than one of kvlab's."""
    return variant.startswith("hf-")
# Each figure's title, for `str.format(model=..., batch=...)`: also the title of the note shown in
# its place where the model or batch has nothing recorded
TITLES = {"throughput": "Decode throughput: {model}",
          "steps": "Decode steps: {model}, batch {batch}",
          "tensor_parallel": "Tensor parallel: {model}, batch {batch}",
          "anatomy": "Where a step's HBM idles: {model}, batch {batch}",
          "trace": "One step traced, kernel by kernel: {model}, batch {batch}"}
# the anatomy's segments: (key of kvlab.predict.step.step_anatomy's kernels, legend, colour)
ANATOMY_PARTS = (("roofline_us", "HBM busy: the kernel's bytes at the copy roofline", "#2ca02c"),
                 ("idle_us", "HBM idle (fitted): gaps, ramps and tails", "#d62728"),
                 ("hidden_us", "idle the cross-kernel prefetch would hide (bound)", "#c7c7c7"))

# A traced kernel's group: (group, what its kernel_name holds, the step model's kernels whose
# bytes it moves: kvlab.predict.step.step_anatomy's names). The first group that matches holds
# it; a kernel no group matches is "other".
TRACE_GROUPS = (
    ("GEMMs", ("linear", "nvjet", "gemm", "splitkreduce", "cutlass"),
     ("qkv", "w_o", "gate + up", "down", "lm head")),
    ("attention", ("gqa_decode", "gqa_merge", "paged_attention"), ("attention",)),
    ("norms", ("rms_norm",), ("attention norm", "mlp norm", "final norm")),
    ("rope + cache write", ("rope",), ("rope + cache write",)),
    ("element-wise", ("silu", "elementwise"), ()),
)
TRACE_GAP_COLOR = "#d62728"
TRACE_COLORS = {"GEMMs": "#2ca02c", "attention": "#1f77b4", "norms": "#9467bd",
                "rope + cache write": "#8c564b", "element-wise": "#ff7f0e", "other": "#7f7f7f"}


def modelled_rows(rows: list[dict], run_gbps: dict[str, float], gpu: str
                  ) -> tuple[list[dict], dict[int, str]]:
    """`rows` of runs on the reference GPU (kvlab.gpus.REFERENCE) modelled for GPU `gpu` (a key of
    kvlab.gpus.GPUS): the rows of every batch that fits its memory, and for each batch that does
    not, why (naming model, GPU and bytes).

    A row's step reads `step_bytes` (added to it): the weights and the batch's K, V at the run's
    mean context, as `python -m kvlab bench e2e` counts them: its roofline step times the copy
    roofline its run measured, `run_gbps[row["source"]]` (GB/s). On `gpu` the roofline step
    (`roofline_ms`) is those bytes over the GPU's copy roofline (kvlab.gpus.copy_roofline_gbps),
    and the step (`step_ms`) that times the row's ratio_to_roofline: the reference's measured
    ratio, assumed to hold there (each of `step_ms_runs` times its own); tokens/s follow. A batch
    fits where the weights a step reads and the K, V of every prompt and new token do, at least.
    ValueError for a `gpu` not in the table."""
    g = gpus.gpu(gpu)
    gbps = gpus.copy_roofline_gbps(g)[0]
    shown, past = [], {}
    for r in rows:
        step_bytes = r["roofline_ms"] * 1e-3 * run_gbps[r["source"]] * 1e9
        per_token = MODELS[r["model"]].kv_bytes_per_token() * r["batch"]
        weights = step_bytes - per_token * (r["prompt"] + r["new_tokens"] / 2)
        tokens = r["prompt"] + r["new_tokens"]
        if weights + per_token * tokens > g.memory_bytes:
            past[r["batch"]] = (
                f"{r['model']} at batch {r['batch']} needs at least "
                f"{(weights + per_token * tokens) / 1e9:,.1f} GB (the {weights / 1e9:,.1f} GB of "
                f"weights a step reads, {per_token * tokens / 1e9:,.1f} GB of K, V for "
                f"{r['batch']} x {tokens} tokens): past the {g.name}'s "
                f"{g.memory_bytes / 1e9:,.0f} GB")
            continue
        roofline_ms = step_bytes / gbps / 1e6
        step_ms = roofline_ms * r["ratio_to_roofline"]
        shown.append({**r, "step_bytes": step_bytes, "roofline_ms": roofline_ms,
                      "step_ms": step_ms, "tokens_per_s": r["batch"] / step_ms * 1e3,
                      "step_ms_runs": [ms / r["roofline_ms"] * roofline_ms
                                       for ms in r["step_ms_runs"]]})
    return shown, past


def throughput_figure(rows: list[dict], model: str, provenance: str,
                      height: int = 420) -> go.Figure:
    """Decode tokens/s against batch (log axis) for each variant of `model`'s rows, HF's static
    cache dashed, and the roofline's tokens/s (batch over the roofline step) dotted. Raises
    ValueError when `rows` has nothing of `model`."""
    mine = [r for r in rows if r["model"] == model]
    if not mine:
        raise ValueError(f"model={model!r}: no rows (recorded: "
                         f"{', '.join(dict.fromkeys(r['model'] for r in rows))})")
    fig = go.Figure()
    for variant in dict.fromkeys(r["variant"] for r in mine):
        points = sorted((r for r in mine if r["variant"] == variant), key=lambda r: r["batch"])
        fig.add_trace(go.Scatter(
            x=[r["batch"] for r in points], y=[r["tokens_per_s"] for r in points],
            name=variant, mode="lines+markers",
            line=dict(color=VARIANT_COLORS.get(variant, "black"),
                      dash="dash" if is_hf(variant) else "solid"),
            customdata=[[r["step_ms"], r["ratio_to_roofline"]] for r in points],
            hovertemplate=f"{variant}<br>batch %{{x}}: %{{y:,.0f}} tokens/s<br>"
                          "%{customdata[0]:.2f} ms a step, %{customdata[1]:.2f}x the roofline"
                          "<extra></extra>"))
    roof = sorted({r["batch"]: r["roofline_ms"] for r in mine}.items())
    fig.add_trace(go.Scatter(x=[b for b, _ in roof], y=[b / ms * 1e3 for b, ms in roof],
                             name="roofline (weights + KV at the copy roofline)", mode="lines",
                             line=dict(color="black", dash="dot", width=1)))
    fig.update_layout(xaxis=dict(title="batch (sequences decoded together)", type="log"),
                      yaxis=dict(title="decode tokens/s", type="log"))
    first = mine[0]
    return style(fig, TITLES["throughput"].format(model=model), provenance,
                 f"prompt {first['prompt']} tokens, {first['new_tokens']} new each; median "
                 "step from steady state", height=height)


def tensor_parallel_figure(rows: list[dict], model: str, batch: int, provenance: str,
                           height: int = 360) -> go.Figure:
    """Decode tokens/s against the tensor-parallel degree (each row's `tp`, 1 where absent) for
    each kvlab variant of `model` at `batch`: the prefetch paper's section 5.5 experiment. HF's
    rows (one GPU only) are left out. Raises ValueError when `rows` has no such row, or for a
    `batch` that is not a positive integer."""
    check_positive_int("batch", batch)
    mine = [r for r in rows if r["model"] == model and r["batch"] == batch
            and not is_hf(r["variant"])]
    if not mine:
        raise ValueError(f"model={model!r}, batch={batch}: no kvlab rows")
    fig = go.Figure()
    for variant in dict.fromkeys(r["variant"] for r in mine):
        points = sorted((r for r in mine if r["variant"] == variant),
                        key=lambda r: r.get("tp", 1))
        fig.add_trace(go.Scatter(
            x=[r.get("tp", 1) for r in points], y=[r["tokens_per_s"] for r in points],
            name=variant, mode="lines+markers",
            line=dict(color=VARIANT_COLORS.get(variant, "black")),
            customdata=[[r["step_ms"]] for r in points],
            hovertemplate=f"{variant}<br>%{{x}} GPUs: %{{y:,.0f}} tokens/s<br>"
                          "%{customdata[0]:.2f} ms a step<extra></extra>"))
    degrees = sorted({r.get("tp", 1) for r in mine})
    fig.update_layout(xaxis=dict(title="GPUs (tensor-parallel degree)", type="log",
                                 tickvals=degrees, ticktext=[str(d) for d in degrees]),
                      yaxis=dict(title="decode tokens/s"))
    return style(fig, TITLES["tensor_parallel"].format(model=model, batch=batch), provenance,
                 "each GPU holds 1/N of the heads and MLP columns; one process a GPU",
                 height=height)


def steps_figure(step_ms: dict[str, list[float]], title: str, provenance: str,
                 detail: str = "", height: int = 360) -> go.Figure:
    """The time of every decode step, one line per run ({name: [ms, ...]}). The axis ends at
    twice the slowest run's median, so that the first steps (warm-up, CUDA graph capture), off
    the scale, do not flatten the rest; hover gives every value. Raises ValueError where
    `step_ms` holds no run, or a run that is not a non-empty list of finite ms >= 0."""
    if not isinstance(step_ms, dict) or not step_ms:
        raise ValueError(f"step_ms={step_ms!r}: must be a dict of at least one run "
                         "{name: [ms, ...]}")
    for name, ms in step_ms.items():
        if not isinstance(ms, list | tuple) or not ms or not all(
                is_real(t) and t >= 0 for t in ms):
            raise ValueError(f"step_ms[{name!r}]={ms!r}: must be a non-empty list of finite "
                             "ms >= 0")
    fig = go.Figure([go.Scatter(y=ms, x=list(range(1, len(ms) + 1)), name=name, mode="lines",
                                line=dict(color=VARIANT_COLORS.get(name)))
                     for name, ms in step_ms.items()])
    top = 2 * max(statistics.median(ms) for ms in step_ms.values())
    fig.update_layout(xaxis=dict(title="decode step"), yaxis=dict(title="ms", range=[0, top]))
    return style(fig, title, provenance, detail, "the axis ends at twice the slowest median: "
                 "warm-up steps may lie above it", height=height)


def anatomy_figure(anatomy: dict, title: str, provenance: str, recorded_ms: float | None = None,
                   height: int = 360, learned_ms: float | None = None) -> go.Figure:
    """A decode step kernel by kernel (`kvlab.predict.step.step_anatomy`): per kernel, over the
    whole step, the time HBM is busy with its bytes and the time it idles around it (and, with
    the cross-kernel prefetch, the idle time it would hide, past the step's end); a last bar
    for the step, with the per-sequence work; and a line at `recorded_ms`, the step recorded at
    that point, and one at `learned_ms`, the step with the prefetch as learned from its
    recordings (kvlab.predict.ahead). Raises ValueError for an anatomy without kernels or a step
    of time, or a `recorded_ms` or `learned_ms` that is not a finite number > 0."""
    kernels = anatomy.get("kernels") if isinstance(anatomy, dict) else None
    if not kernels or not all(isinstance(k, dict) for k in kernels) or not (
            is_real(anatomy.get("step_us")) and anatomy["step_us"] > 0):
        raise ValueError("anatomy: must hold kernels and a step_us > 0 "
                         "(kvlab.predict.step.step_anatomy)")
    for name, value in (("recorded_ms", recorded_ms), ("learned_ms", learned_ms)):
        if value is not None and not (is_real(value) and value > 0):
            raise ValueError(f"{name}={value!r}: must be a finite number > 0 or None")
    names = [f"{k['name']} x{k['count']}" for k in kernels]
    step = "whole step"
    fig = go.Figure()
    base = [0.0] * (len(kernels) + 1)  # each segment starts where the one before it ends
    per_sequence = [0.0] * len(kernels) + [anatomy["per_sequence_us"]]
    for key, legend, color in ANATOMY_PARTS:
        if key == "hidden_us":  # the step's own time first: the per-sequence work
            fig.add_bar(y=[step], x=[per_sequence[-1] / 1e3], base=[base[-1]],
                        orientation="h", name="per-sequence work beyond the bytes",
                        marker_color="#ff7f0e")
            base = [b + w / 1e3 for b, w in zip(base, per_sequence, strict=True)]
            if not anatomy.get(key):  # no prefetch: nothing hidden
                continue
        x = [k[key] / 1e3 for k in kernels] + [anatomy[key] / 1e3]
        fig.add_bar(y=[*names, step], x=x, base=list(base), name=legend, orientation="h",
                    marker_color=color,
                    marker_pattern_shape="/" if key == "hidden_us" else "")
        base = [b + w for b, w in zip(base, x, strict=True)]
    for value, name, dash in ((recorded_ms, "recorded step", "dash"),
                              (learned_ms, "with the prefetch, learned", "dot")):
        if value is not None:
            line = dict(color="black", dash=dash, width=1)
            fig.add_vline(x=value, line=line)
            fig.add_scatter(x=[None], y=[None], mode="lines", name=f"{name} {value:.2f} ms",
                            line=line)
    fig.update_layout(barmode="overlay", xaxis=dict(title="ms a step"),
                      yaxis=dict(autorange="reversed"))
    idle = anatomy["idle_us"] / anatomy["step_us"]
    return style(fig, title, provenance, f"idle budget {anatomy['idle_us'] / 1e3:.2f} ms, "
                 f"{idle:.0%} of the modelled step", height=height)


def kernel_name(signature: str) -> str:
    """A traced kernel's function name, without its return type, namespaces, template
    arguments and parameters: "void kvlab::linear<__half, 1>(__half*, ...)" -> "linear"."""
    head = signature.replace("(anonymous namespace)", "").split("(", 1)[0].split("<", 1)[0]
    return head.strip().rsplit(" ", 1)[-1].rsplit("::", 1)[-1]


def trace_groups(kernels: list[dict], anatomy: dict | None = None) -> list[dict]:
    """A traced step's kernels ({"name", "start_us", "dur_us"}, `python -m kvlab bench
    steptrace`'s) grouped (TRACE_GROUPS, in its order, then "other"; groups without a kernel left
    out): {"group", "count", "busy_us" (their time), "roofline_us" (the step model's bytes of
    the group at the copy roofline, from `anatomy`, kvlab.predict.step.step_anatomy's; None
    without one or for a group it has no kernels of), "kernels"}. Raises ValueError for a
    kernel without those keys."""
    found: dict[str, list[dict]] = {}
    for i, k in enumerate(kernels):
        if not (isinstance(k, dict) and isinstance(k.get("name"), str)
                and is_real(k.get("start_us")) and is_real(k.get("dur_us"))):
            raise ValueError(f"kernels[{i}]={k!r:.80}: must be a dict of name, start_us and "
                             "dur_us")
        name = kernel_name(k["name"]).lower()
        group = next((g for g, keys, _ in TRACE_GROUPS if any(key in name for key in keys)),
                     "other")
        found.setdefault(group, []).append(k)
    modelled = {k["name"]: k["roofline_us"] for k in (anatomy or {}).get("kernels", [])}
    groups = []
    for group in [*(g for g, _, _ in TRACE_GROUPS), "other"]:
        if group not in found:
            continue
        names = next((m for g, _, m in TRACE_GROUPS if g == group), ())
        roofline = [modelled[m] for m in names if m in modelled]
        groups.append({"group": group, "count": len(found[group]),
                       "busy_us": sum(k["dur_us"] for k in found[group]),
                       "roofline_us": sum(roofline) if roofline else None,
                       "kernels": found[group]})
    return groups


def trace_figure(row: dict, groups: list[dict], title: str, provenance: str,
                 height: int = 420) -> go.Figure:
    """One traced decode step on its time axis (`python -m kvlab bench steptrace`'s row): a lane
    per kernel group (`trace_groups`) with a bar per kernel where it ran, a lane of the gaps
    between kernels (HBM idle, marked), and lines at the step's bytes at the copy roofline
    (the row's roofline_us) and at its end. Raises ValueError for a row without kernels, a
    span_us > 0, gap_us and roofline_us, or no groups."""
    if not isinstance(row, dict) or not row.get("kernels") or not all(
            is_real(row.get(k)) for k in ("span_us", "gap_us", "roofline_us")) or not (
            row["span_us"] > 0):
        raise ValueError("row: must hold kernels, span_us > 0, gap_us and roofline_us "
                         "(python -m kvlab bench steptrace)")
    if not groups:
        raise ValueError("groups=[]: must hold the row's kernels (trace_groups)")
    fig = go.Figure()
    for g in groups:
        lane = f"{g['group']} x{g['count']}"
        busy = f"{g['busy_us'] / 1e3:.2f} ms busy"
        if g["roofline_us"] is not None:
            busy += f", its bytes {g['roofline_us'] / 1e3:.2f} ms at the copy roofline"
        fig.add_bar(y=[lane] * g["count"], x=[k["dur_us"] / 1e3 for k in g["kernels"]],
                    base=[k["start_us"] / 1e3 for k in g["kernels"]], orientation="h",
                    name=f"{g['group']}: {busy}", marker_color=TRACE_COLORS[g["group"]],
                    customdata=[kernel_name(k["name"]) for k in g["kernels"]],
                    hovertemplate="%{customdata}: %{x:.3f} ms at %{base:.3f} ms<extra></extra>")
    kernels = sorted(row["kernels"], key=lambda k: k["start_us"])
    gaps, end = [], kernels[0]["start_us"]
    for k in kernels:
        if k["start_us"] > end:
            gaps.append((end, k["start_us"] - end))
        end = max(end, k["start_us"] + k["dur_us"])
    lane = f"between kernels x{len(gaps)}"
    fig.add_bar(y=[lane] * len(gaps), x=[d / 1e3 for _, d in gaps],
                base=[s / 1e3 for s, _ in gaps], orientation="h", marker_color=TRACE_GAP_COLOR,
                name=f"HBM idle between kernels: {row['gap_us'] / 1e3:.2f} ms",
                hovertemplate="gap %{x:.4f} ms at %{base:.3f} ms<extra></extra>")
    for x, text, dash in ((row["roofline_us"] / 1e3, "the step's bytes at the copy roofline",
                           "dash"), (row["span_us"] / 1e3, "the step's end", "dot")):
        fig.add_vline(x=x, line=dict(color="black", dash=dash, width=1))
        fig.add_scatter(x=[None], y=[None], mode="lines", name=f"{text}: {x:.2f} ms",
                        line=dict(color="black", dash=dash, width=1))
    fig.update_layout(barmode="overlay", xaxis=dict(title="ms from the step's first kernel"),
                      yaxis=dict(autorange="reversed"))
    excess = row["span_us"] - row["roofline_us"]
    detail = f"step {row['span_us'] / 1e3:.2f} ms"
    if row["roofline_us"] > 0:
        detail += f", {row['span_us'] / row['roofline_us']:.2f}x its bytes at the copy roofline"
    detail += (f": of the {excess / 1e3:.2f} ms beyond, {row['gap_us'] / 1e3:.2f} ms between "
               "kernels, the rest inside them" if excess > 0 else
               f", {row['gap_us'] / 1e3:.2f} ms between kernels")
    return style(fig, title, provenance, detail, height=height)
