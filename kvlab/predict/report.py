"""docs/predict.md, made from predict.json (benchmarks/predict_fit.py writes both; tests/predict
checks that the committed file is what `markdown` makes): the model's form and constants, its
held-out error per kernel family and prefetch setting, where it holds and where not, and the
paper's H20 figures beside the model's.

Every figure of the page sits in a generated block, `<!-- docgen: predict.NAME -->...`, whose
content is `figures(result)[NAME]` (a list of lines: a table on lines of its own; a str: a figure
inside a sentence); benchmarks/figures/predict.py serves the same to benchmarks/docgen.py, which
checks that no figure stands in the prose outside a block."""

from __future__ import annotations

from kvlab.config import MODELS
from kvlab.gpus import GPUS, REFERENCE
from kvlab.gpus import copy_roofline_gbps as spec_roofline_gbps
from kvlab.predict import paper
from kvlab.predict.validate import ALL, REGIONS
from kvlab.results import label as recorded_label

CHECKS = ("fitted", "one model out", *REGIONS)
CONSTANTS = {"launch_us": ("launch", "{:.2f} us"), "merge_us": ("merge", "{:.2f} us"),
             "efficiency": ("efficiency", "{:.3f}"), "lone_gelems": ("lone CTA", "{:.1f} G elem/s"),
             "sm_gelems": ("SM", "{:.1f} G elem/s"), "cta_tokens": ("CTA cost", "{:.0f} tokens"),
             "p": ("p", "{:.2f}"), "l2_tbps": ("L2", "{:.2f} TB/s")}


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _cell(summary: dict | None) -> str:
    return "-" if summary is None else f"{_pct(summary['median'])} / {_pct(summary['p90'])}"


def error_table(result: dict) -> list[str]:
    """Per family and prefetch setting: launches, then "median / 90th percentile" of the error
    fitted on all and held out (one model out; each region of kvlab.predict.validate.REGIONS)."""
    lines = ["| family | prefetch | launches | " + " | ".join(CHECKS) + " |",
             "|---|---|---|" + "---|" * len(CHECKS)]
    for family, rows in result["errors"].items():
        for label, checks in rows.items():
            lines.append(f"| {family} | {label} | {checks['fitted']['n']} | "
                         + " | ".join(_cell(checks[c]) for c in CHECKS) + " |")
    return lines


def constants_table(result: dict) -> list[str]:
    """The fitted constants per family, and each prefetch setting's (lift, tax)."""
    lines = ["| family | " + " | ".join(name for name, _ in CONSTANTS.values())
             + " | prefetch: lift, tax |", "|---|" + "---|" * (len(CONSTANTS) + 1)]
    for family, fit in result["fit"].items():
        cells = [fmt.format(fit[k]) if fit[k] else "-" for k, (_, fmt) in CONSTANTS.items()]
        prefetch = "; ".join(f"{label}: {lift:.2f}, {tax:.2f}"
                             for label, (lift, tax) in fit["prefetch"].items())
        lines.append(f"| {family} | " + " | ".join(cells) + f" | {prefetch} |")
    return lines


def _pair(value) -> str:
    return f"{value[0]:.2f} → {value[1]:.2f}" if isinstance(value, tuple | list) else (
        f"{value:.2f}x")


def _disagreement(row: dict) -> str:
    published, predicted = row["published"], row["predicted"]
    if predicted is None:
        return "-"
    if isinstance(published, tuple | list):
        return (f"{predicted[0] - published[0]:+.1f}, {predicted[1] - published[1]:+.1f} "
                "points")
    return f"ratio {predicted / published:.2f}"


def paper_rows(result: dict) -> list[dict]:
    return paper.rows(result["h20_replay"])


def paper_table(rows: list[dict]) -> list[str]:
    """The paper's H20 figures (Table 5.2: baseline → prefetch; kernel speedups) beside the
    model's, with the difference."""
    lines = ["| metric | model | H20, published | H20, predicted | predicted - published | how |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        predicted = "not modelled" if r["predicted"] is None else _pair(r["predicted"])
        lines.append(f"| {r['metric']} | {r['model']} | {_pair(r['published'])} | {predicted} | "
                     f"{_disagreement(r)} | {r['how']} |")
    return lines


def _heads(model: str) -> str:
    m = MODELS[model]
    return f"{m.num_qo_heads}:{m.num_kv_heads}"


def _where(result: dict) -> list[str]:
    """Per family, a bullet on where the model holds and where not, from the error table."""
    lines = []
    for family, rows in result["errors"].items():
        checks = rows[ALL]
        regions = {r: checks[r]["p90"] for r in REGIONS if checks[r]}
        worst = max(regions, key=regions.get)
        best = min(rows, key=lambda label: rows[label]["one model out"]["p90"])
        poor = max(rows, key=lambda label: rows[label]["one model out"]["p90"])
        models = result["one_model_out_by_model"][family]
        hardest = max(models, key=lambda m: models[m]["p90"])
        easiest = min(models, key=lambda m: models[m]["p90"])
        lines.append(
            f"- `{family}`: held out one model at a time, half the launches within "
            f"{_pct(checks['one model out']['median'])} and nine in ten within "
            f"{_pct(checks['one model out']['p90'])}; best {best!r} "
            f"({_pct(rows[best]['one model out']['p90'])}), worst {poor!r} "
            f"({_pct(rows[poor]['one model out']['p90'])}). The hardest model to predict from "
            f"the others is {hardest} ({_heads(hardest)}: median "
            f"{_pct(models[hardest]['median'])}, 90th percentile {_pct(models[hardest]['p90'])}"
            f"), the easiest {easiest} ({_heads(easiest)}: {_pct(models[easiest]['median'])}, "
            f"{_pct(models[easiest]['p90'])}). Extrapolated, the worst region held out is "
            f"{worst} ({_pct(regions[worst])} at the 90th percentile).")
    return lines


def _range(values, fmt: str = "{:.2f}", unit: str = "") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def _recorded(result: dict) -> str:
    """The H200's measured vllm_v1 prefetch speedups by SM count, in words."""
    return ", ".join(f"{low:.2f}-{high:.2f}x (median {mid:.2f}x) on {sms} SMs"
                     for sms, (low, mid, high) in result["h200_prefetch_speedups"].items())


def _hit_figures(rows: list[dict]) -> dict:
    """How the replayed L2 hit rates compare with the paper's: the rise with prefetch (ours,
    the paper's) and how far ours lie from its figures without prefetch."""
    hits = [r for r in rows if r["metric"] == "L2 hit rate, %"]
    rise = [r["predicted"][1] - r["predicted"][0] for r in hits]
    paper_rise = [r["published"][1] - r["published"][0] for r in hits]
    gap = [r["predicted"][0] - r["published"][0] for r in hits]
    return {"hit-rise": f"{min(rise):.0f}-{max(rise):.0f} points",
            "hit-rise-paper": f"{min(paper_rise):.0f}-{max(paper_rise):.0f}",
            "hit-gap": f"{min(gap):+.1f} to {max(gap):+.1f} points"}


def figures(result: dict) -> dict:
    """Every figure of docs/predict.md by block name (without the "predict." prefix): a list of
    lines for a table, a str for a figure inside a sentence."""
    ref, h20 = GPUS[REFERENCE], GPUS[paper.GPU]
    rows = paper_rows(result)

    def column(metric, which, at=None):
        return [r[which] if at is None else r[which][at] for r in rows if r["metric"] == metric]

    by_sms = {int(k): v for k, v in result["rooflines_by_sms"].items()}
    fewest = min(by_sms)
    revisions = sorted({v["git_revision"][:7] for v in result["recordings"].values()
                        if v.get("git_revision")})

    def spec(gpu):
        return (f"{gpu.num_sms} SMs, {gpu.hbm_gbps / 1e3:.1f} TB/s, "
                f"{gpu.fp16_tflops:.0f} fp16 TFLOP/s")

    return {
        "source": f"`results/cpu/predict.json`, {recorded_label(result)}",
        "launches": f"{result['launches']:,}",
        "revisions": ", ".join(revisions),
        "constants": constants_table(result),
        "kappa": "; ".join(f"{v} {k['none']:.3f} without prefetch, {k['prefetch']:.3f} with"
                           for v, k in result["kappa"].items()),
        "rooflines": ", ".join(f"{s} SMs {g:,.0f} GB/s" for s, g in by_sms.items()),
        "errors": error_table(result),
        "where": _where(result),
        "gpus": f"the {h20.name}: {spec(h20)}; the {ref.name}: {spec(ref)}",
        "paper": paper_table(rows),
        "best": _range(column("kernel speedup, best point", "predicted"), unit="x"),
        "at-point": _range(column("kernel speedup", "predicted"), unit="x"),
        "claimed": _range(column("kernel speedup", "published"), unit="x"),
        "lift": _recorded(result),
        "h20-per-sm": f"{spec_roofline_gbps(h20)[0] / h20.num_sms:.0f} GB/s",
        "h200-per-sm": (f"{by_sms[ref.num_sms] / ref.num_sms:.0f} GB/s on all {ref.num_sms} SMs "
                        f"and {by_sms[fewest] / fewest:.0f} GB/s on {fewest}"),
        "paper-memory": _range(column("memory throughput, %", "published", 0), "{:.0f}", "%"),
        "model-memory": _range(column("memory throughput, %", "predicted", 0), "{:.0f}", "%"),
        "paper-stall": _range(column("long-scoreboard stall, cycles/inst", "published", 0),
                              "{:.1f}"),
        "flop-per-byte": (f"{h20.fp16_tflops / h20.hbm_gbps * 1e3:.0f} fp16 FLOP per byte of "
                          f"HBM, against the {ref.name}'s "
                          f"{ref.fp16_tflops / ref.hbm_gbps * 1e3:.0f}"),
        **_hit_figures(rows),
    }


def markdown(result: dict) -> str:
    """docs/predict.md for `result` (predict.json's contents)."""
    made = figures(result)

    def b(name: str) -> str:
        """The block `name` as the page holds it."""
        value = made[name]
        body = "\n" + "\n".join(value) + "\n" if isinstance(value, list) else value
        return f"<!-- docgen: predict.{name} -->{body}<!-- /docgen -->"

    ref, h20 = GPUS[REFERENCE], GPUS[paper.GPU]
    point = f"{paper.POINT[0]} x {paper.POINT[1] // 1024}k"
    return "\n".join([
        "# A performance model for any decode launch", "",
        "<!-- Made by benchmarks/predict_fit.py from benchmarks/results/cpu/predict.json: the "
        "prose is kvlab.predict.report.markdown, the figures its blocks (benchmarks/docgen.py "
        "checks them); tests/predict checks the page is what the code makes. Do not edit by "
        "hand. -->", "",
        "`kvlab.predict.decode_launch(model_or_shape, batch, context, family=..., prefetch=..., "
        "dtype=..., lengths=..., num_sms=..., gpu=...)` gives one decode-attention launch's "
        "time, GB/s and share of the copy roofline, labelled measured (the point is recorded: "
        "the recording's number), interpolated or extrapolated (naming the dimensions), with "
        "an error band: the family's held-out 90th percentile below. The figures on this page: "
        f"{b('source')} (`python benchmarks/predict_fit.py`, a few seconds on a CPU).", "",
        "## The model", "",
        "    time = launch + merge [split] + (t_hbm^p + t_l2^p + t_sm^p)^(1/p)", "",
        "t_hbm: DRAM bytes (K+V once, block tables, q and out, a split's partial outputs) over "
        "the copy roofline of the launch's SMs times an efficiency. t_l2 (vllm_v1): the K+V "
        "that a group's other query heads re-read, times kappa (the share L1 does not catch; "
        "ncu's L2 read bytes), over an L2 rate. t_sm: the busiest SM's tokens as the kernels "
        "plan the launch (kvlab.kernels.geometry: vLLM's v1/v2 rule, gqa's split and warps; "
        "waves of CTA slots) over its CTAs' rate. Prefetch multiplies the SMs' rates by a "
        "lift and the HBM and L2 rates by a tax. Fitted by least squares on log time to "
        f"{b('launches')} launches recorded on the {ref.name} (revisions {b('revisions')}; "
        "`kvlab/predict/closed_form.py`, `fit.py`):", "",
        b("constants"), "",
        "(An efficiency above 1: a read outruns a copy, which also writes, and the soft maximum "
        "adds to its largest term. Elements: of K and V, twice head_dim a token.) "
        f"Measured, not fitted: kappa {b('kappa')} (results/h200/counters*.json, "
        f"[counters and SM scaling](counters.md)), the copy roofline on {b('rooflines')} "
        "(attention.json, attention_sms.json). Another GPU's copy roofline, per-SM and L2 "
        f"rates are assumptions (kvlab.gpus: the {ref.name}'s measured share of its spec; SM "
        "rates scaled by the boost clock, the L2 rate by the L2's size (its slices) x clock; "
        "the same fraction of its SMs reaching the same share of its roofline).", "",
        "## Its error", "",
        "The error `|predicted / measured - 1|` over the recorded launches, \"median / 90th "
        "percentile\": fitted on all; one model out (fitted on the other three models' "
        "launches); and each region held out (fitted on every launch outside it: context >= "
        "16k of equal lengths, batch >= 64, green contexts of fewer SMs, mixed lengths, fp8 or "
        "bf16 caches). An answer's error band is its setting's one-model-out 90th percentile "
        "where interpolated, the largest region's where extrapolated.", "",
        b("errors"), "",
        "## Where it holds and where not", "",
        b("where"), "",
        "- Every recording is of head_dim 128 and one GPU: another head_dim, block size or GPU "
        "is extrapolated, its band untested.", "",
        f"## The paper's {h20.name} (arXiv 2504.06319), predicted", "",
        "The paper's baseline is vLLM's PagedAttention (the design of `vllm_v1`) with a bulk "
        "L2 prefetch of K and V one warp stride ahead; it states no batch or context, so the "
        f"model is asked at {point} (where the lab measures its Table 5.2, [counters and SM "
        "scaling](counters.md#table-52-on-the-h200)) and, for the speedup, at its best point of a "
        f"grid of batches 1-256 and contexts 1k-32k. The specifications: {b('gpus')}.", "",
        b("paper"), "",
        f"The model predicts {b('best')} at its best point ({b('at-point')} at {point}) where "
        f"the paper measured {b('claimed')}. It knows prefetch only from the {ref.name}: there "
        "`vllm_v1` already keeps HBM (MHA) or L2 (GQA) busy, the latency a prefetch hides is a "
        "small share of the time, and the lift measured, bulk K+V d=1 over none in one loop, "
        f"was {b('lift')} (attention_sms.json); the model gives no more. The {h20.name}'s SM "
        f"count does not explain the gap: to fill its HBM each of its SMs must move "
        f"{b('h20-per-sm')}, between the {ref.name}'s {b('h200-per-sm')}, where that lift was "
        "measured. What could explain it is the baseline: the paper's kernel ran at "
        f"{b('paper-memory')} of the {h20.name}'s memory throughput (ncu's: the busiest of "
        f"DRAM, L2 and L1), the model's `vllm_v1` at {b('model-memory')} of its DRAM bandwidth "
        "(with GQA, L2 re-reads bound it, not HBM); the paper's warps waited on long "
        f"scoreboards for {b('paper-stall')} cycles an instruction, the idle time a fill ahead "
        f"removes. The {h20.name}'s {b('flop-per-byte')}, may add to it: a kernel whose warps "
        "spend issue slots on address arithmetic and waits is nearer its compute limit there, "
        "as the paper's compute throughput, which prefetch doubled, suggests. The replayed L2 "
        f"hit rates rise with prefetch by {b('hit-rise')} (the paper's by "
        f"{b('hit-rise-paper')}); without prefetch they lie {b('hit-gap')} from its figures, "
        "read with the H200's fabric and pending-fill assumptions (kvlab.sim.l2).", ""])
