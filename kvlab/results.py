"""Recorded benchmark results shipped with kvlab: `benchmarks/results/<machine>/<name>.json`.

The wheel ships that folder as `kvlab/results_data/`; a source checkout reads it in place. The
simulated backend shows these numbers, always labelled with where and when they were recorded, at
which revision, and which of the components they measured have changed since (`changed_since`,
from the versions a result records: `kvlab.components`). Pure Python and json: no torch, no pandas.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from kvlab.checks import is_int, is_real
from kvlab.components import BENCHMARKS, COMPONENTS, versions

__all__ = [
    "ATTENTION",
    "changed_since",
    "label",
    "load_recorded",
    "load_result",
    "load_results",
    "load_shown",
    "manifest",
    "nearest_point",
    "nearest_rows",
    "recorded_models",
    "results_dir",
    "speedups",
]

# The recorded decode-attention benchmark: (machine, result names), merged by `load_results`:
# block 16 with SDPA and kernel="auto", blocks 32 and 128, and a plain read of each point's bytes
# (from a run of gqa, SDPA and the read alone, whose own gqa and SDPA rows `nearest_rows` leaves
# to the first result's). (The evict-last twins of every prefetch setting, block 16, are the
# separate result "attention_evict_last".)
ATTENTION = ("h200", ("attention", "attention_block_sizes", "attention_read"))
# KVPR: the grid (kvpr_opt, kvpr_llama: row schedule, resident weights) and the column schedule
# in 4 GPU batches with resident and offloaded weights (kvpr_schedules). The ablations (kvpr_eager,
# kvpr_chunks4) stay out of the dashboard: they repeat points of the grid under other settings.
KVPR = ("h200", ("kvpr_opt", "kvpr_llama", "kvpr_schedules"))
# Whole models decoding (bench e2e), prompts of 512 tokens and 256 new ones: Llama and Qwen2.5
E2E = ("h200", ("e2e", "e2e_qwen7b", "e2e_qwen14b"))
# A row's identity; "family" and "auto_mode" are set on kernel="auto" rows only (the family auto
# ran; tuned at the point, reused from another shape of its bucket, or the recorded choice);
# "sms" on rows timed with `--sms` only (the SMs of the green context; absent: the whole GPU).
ROW_KEY = ("model", "batch", "context", "kernel", "family", "auto_mode", "block_size", "sms",
           "prefetch")
PACKAGED_DIR = Path(__file__).resolve().parent / "results_data"
CHECKOUT_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
PATH_COMPONENT = re.compile(r"[A-Za-z0-9_.-]+")
MAX_NAME_LEN = 128  # of `machine` and `name`: "<name>.json" stays a short file name
# The lists of entries `load_results` merges: each must be a list of objects where present
MERGED = ("rows", "timelines")
# What a result records of the code it measured, kept per result by `load_results` ("sources")
PROVENANCE = ("benchmark", "git_revision", "git_dirty", "components")
# `label`'s length where its names of components changed fit: a 500 px chart's subtitle line
# (kvlab.viz.layout.NOTE_LINE_CHARS, 72) less a prefix such as "H200 "
LABEL_CHARS = 66
# What `load_result`'s `keys` can ask a value to be: type -> (test, what it must be)
VALUE_TYPES = {float: (is_real, "a finite number"), int: (is_int, "an integer"),
               str: (lambda v: isinstance(v, str), "a string"),
               dict: (lambda v: isinstance(v, dict), "an object"),
               object: (lambda v: True, "any value")}


def results_dir() -> Path:
    """The folder of recorded results: the packaged `kvlab/results_data/` if it exists, else the
    source checkout's `benchmarks/results/`."""
    return PACKAGED_DIR if PACKAGED_DIR.is_dir() else CHECKOUT_DIR


def _available() -> list[str]:
    root = results_dir()
    return (
        sorted(f"{p.parent.name}/{p.stem}" for p in root.glob("*/*.json")) if root.is_dir() else []
    )


def load_result(machine: str, name: str, keys: dict | None = None) -> dict:
    """The recorded result `<machine>/<name>.json`, e.g. `load_result("h200", "attention")`, as
    written by `python -m kvlab bench <name> --json` (keys gpu, date, rows, ...).

    keys: what the caller reads, checked here: `{key: what}`, `what` the tuple of keys every entry
        of the list `result[key]` must have (e.g. `{"rows": ("model", "batch")}`), or a type that
        `result[key]` must be: `float` (a finite number), `int`, `str`, `dict`, `object` (any).

    Raises ValueError naming `machine` and `name` and listing the recorded results when absent, or
    naming the one that is not a plain file name (letters, digits, '_', '-', '.'; not '.' or '..';
    at most MAX_NAME_LEN characters). Raises ValueError naming the file (and the key) when it
    cannot be read, is not JSON, not an object, its `rows` or `timelines` not lists of objects, or
    not of the shape `keys` asks for.
    """
    path = _result_path(machine, name)
    if not path.is_file():
        raise ValueError(
            f"machine={machine!r}, name={name!r}: no recorded result {path}; "
            f"recorded (machine/name): {_available()}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
    except OSError as error:
        raise ValueError(f"{path}: unreadable: {error.strerror or error}") from error
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path}: not a JSON recording: {error}") from error
    _check_shape(result, path, keys or {})
    return result


def _check_shape(result, path: Path, keys: dict) -> None:
    """ValueError naming `path` (and the key) unless `result` is an object, its MERGED lists are
    lists of objects, and it holds what `keys` asks for (see `load_result`)."""
    if not isinstance(result, dict):
        raise ValueError(f"{path}: holds a JSON {_kind(result)}: must hold an object (a result)")
    wanted = {key: () for key in MERGED if key in result} | keys
    for key, what in wanted.items():
        if key not in result:
            raise ValueError(f"{path}: no key {key!r}: must have the keys {list(wanted)}")
        value = result[key]
        if isinstance(what, tuple):
            if not isinstance(value, list):
                raise ValueError(f"{path}: {key!r} holds a JSON {_kind(value)}: must be an array "
                                 "of objects")
            for i, entry in enumerate(value):
                missing = [k for k in what if k not in entry] if isinstance(entry, dict) else None
                if missing is None or missing:
                    raise ValueError(
                        f"{path}: {key}[{i}] = {_cut(json.dumps(entry))}: must be an object with "
                        f"the keys {list(what)}" + (f"; missing {missing}" if missing else ""))
        elif not VALUE_TYPES[what][0](value):
            raise ValueError(f"{path}: {key}={_cut(json.dumps(value))}: must be "
                             f"{VALUE_TYPES[what][1]}")


def _kind(value) -> str:
    """The JSON name of `value`'s type: object, array, string, number, boolean, null."""
    for kind, types in (("boolean", bool), ("number", (int, float)), ("string", str),
                        ("array", list), ("object", dict)):
        if isinstance(value, types):
            return kind
    return "null"


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _result_path(machine: str, name: str) -> Path:
    """`<results_dir>/<machine>/<name>.json`, for plain names that stay inside the folder."""
    for param, value in (("machine", machine), ("name", name)):
        if not (isinstance(value, str) and PATH_COMPONENT.fullmatch(value)) or value in (
                ".", "..") or len(value) > MAX_NAME_LEN:
            raise ValueError(
                f"{param}={_cut(repr(value))}: must be a plain file name of letters, digits, '_', "
                f"'-' and '.' (not '.' or '..'), at most {MAX_NAME_LEN} characters"
            )
    root = results_dir().resolve()
    path = root / machine / f"{name}.json"
    if not path.resolve().is_relative_to(root):
        raise ValueError(
            f"machine={machine!r}, name={name!r}: {path} resolves outside the results folder {root}"
        )
    return path


def load_results(machine: str, names, keys: dict | None = None) -> dict:
    """Several recorded results of one machine as one: the first one's metadata (gpu, roofline,
    ...), the dates of all (`dates`, sorted: `label` names each; `source_dates`: each result's),
    what each records of its code (`sources`: name -> its PROVENANCE keys), and the rows of
    all, in order, each tagged `source` = its result's name (and so their `timelines`, where
    they have any). `label(merged, rows)` names the dates and revisions of those rows.
    `keys`: what each result must hold (`load_result`).

    NOTE: every run measures its own no-prefetch baseline, so a row can appear once per run.
    Compare times only within one source (`speedups`): tiny kernels vary more between runs
    than prefetch changes them. Names not recorded are skipped; raises ValueError (as
    `load_result`) when none is, for one unreadable or not of the shape asked for, or for `names`
    empty or not plain file names."""
    names = list(names)
    if not names:
        raise ValueError("names=[]: must name at least one result")
    recorded = [n for n in names if _result_path(machine, n).is_file()]
    loaded = {n: load_result(machine, n, keys) for n in recorded}
    if not loaded:
        return load_result(machine, names[0])
    merged = {**next(iter(loaded.values()))}
    merged["source_dates"] = {n: str(r.get("date", "unknown date"))[:10]
                              for n, r in loaded.items()}
    merged["dates"] = sorted(set(merged["source_dates"].values()))
    merged["sources"] = {n: {k: r.get(k) for k in PROVENANCE} for n, r in loaded.items()}
    for key in MERGED:
        entries = [{**e, "source": n} for n, result in loaded.items() for e in result.get(key, [])]
        if key == "rows" or entries:
            merged[key] = entries
    return merged


def load_recorded(machine: str, names, keys: dict | None = None) -> dict | None:
    """`load_results(machine, names, keys)`, or None where none of `names` is recorded: what a
    dashboard tab shows where it can. Raises ValueError as `load_results` does for a result that
    is unreadable or not of the shape `keys` asks for (naming its file), or for bad names."""
    names = list(names)
    if names and not any(_result_path(machine, n).is_file() for n in names):
        return None
    return load_results(machine, names, keys)


def load_shown(machine: str, names, keys: dict | None, unreadable: dict[str, str],
               view: str) -> dict | None:
    """`load_recorded(machine, names, keys)` for the dashboard's `view` of it: None where none of
    `names` is recorded, and None where one cannot be read, its ValueError's message (naming the
    file and why) then kept as `unreadable[view]`, for the view to show."""
    try:
        return load_recorded(machine, names, keys)
    except ValueError as error:
        unreadable[view] = str(error)
        return None


def speedups(rows) -> list[tuple[dict, float]]:
    """(row, ms of no prefetch / ms of the row) for every row that has a no-prefetch row of the
    same kernel, model, point and block size measured in the same run (`source`)."""
    same_run = tuple(k for k in ROW_KEY if k != "prefetch") + ("source",)
    baseline = {
        tuple(r.get(k) for k in same_run): r["ms"] for r in rows if r["prefetch"] == "none"
    }
    pairs = []
    for row in rows:
        none_ms = baseline.get(tuple(row.get(k) for k in same_run))
        if none_ms is not None:
            pairs.append((row, none_ms / row["ms"]))
    return pairs


def label(result: dict, rows=None, changes: bool = True) -> str:
    """Where, when and from which code `result` was recorded, e.g. "recorded on NVIDIA H200,
    2026-12-03 at bcfeff1; gqa, engine changed since" (the components of its benchmark whose
    code differs now: `changed_since`), "...; no revision recorded", "...; recorded on a tree
    with uncommitted changes". For results merged by `load_results`, every date and revision
    ("..., 2026-11-29 and 2026-12-01 at ..."), or with `rows` (some of its rows) those of the
    results those rows came from. `changes=False` leaves out what changed since (text that
    must not move with every edit of the code: the docs; `manifest` has the changes)."""
    where = result.get("gpu") or result.get("cpu") or "unknown machine"
    dates = result.get("dates") or [str(result.get("date", "unknown date"))[:10]]
    sources = _sources(result)
    if rows is not None and "source_dates" in result:
        names = {r["source"] for r in rows}
        dates = sorted({result["source_dates"][n] for n in names}) or dates
        sources = {n: p for n, p in sources.items() if n in names} or sources
    when = dates[0] if len(dates) == 1 else f"{', '.join(dates[:-1])} and {dates[-1]}"
    revisions = dict.fromkeys(p["git_revision"][:7] for p in sources.values()
                              if isinstance(p.get("git_revision"), str))
    at = f" at {', '.join(revisions)}" if revisions else ""
    head = "; ".join([f"recorded on {where}, {when}{at}", *_notes(sources)])
    changed = [c for c in COMPONENTS if changes
               and any(c in (changed_since(p) or ()) for p in sources.values())]
    return _with_changed(head, changed)


def _with_changed(head: str, changed: list[str]) -> str:
    """`head`, then the `changed` components: all their names where they fit in LABEL_CHARS,
    else the first few and how many more, else "code changed since"."""
    if not changed:
        return head
    for k in range(len(changed), 0, -1):
        names = ", ".join(changed[:k]) + (f" and {len(changed) - k} more" if k < len(changed)
                                          else "")
        if len(f"{head}; {names} changed since") <= LABEL_CHARS:
            return f"{head}; {names} changed since"
    return f"{head}; code changed since"


def _sources(result: dict) -> dict[str, dict]:
    """name -> what each result merged into `result` records of its code (one, named "", for a
    result not merged)."""
    return result.get("sources") or {"": {k: result.get(k) for k in PROVENANCE}}


def _notes(sources: dict[str, dict]) -> list[str]:
    """What `label` adds about the code of `sources` but the components changed since: revisions
    not recorded, uncommitted changes."""
    notes = []
    unknown = [n for n, p in sources.items() if changed_since(p) is None]
    if unknown:
        recorded = any(sources[n].get("git_revision") for n in unknown)
        # NOTE: not "not recorded": the dashboard says that of a point with no recording
        whose = f" for {', '.join(unknown)}" if len(unknown) < len(sources) else ""
        notes.append(f"no code versions recorded{whose}" if recorded else
                     f"no revision recorded{whose}")
    if any(p.get("git_dirty") for p in sources.values()):
        notes.append("recorded on a tree with uncommitted changes")
    return notes


def changed_since(result: dict) -> list[str] | None:
    """The components `result` measured whose code differs now from what it records
    (`result["components"]`: name -> version, `kvlab.components`), in COMPONENTS' order: those
    of its benchmark (`kvlab.components.BENCHMARKS`; every one it records where the benchmark
    is not known). A component it does not record, or records as None (absent then), counts as
    changed; one this install cannot read (a driver outside the wheel) does not. None where
    `result` records no components: unknown. For results merged by `load_results`, those of
    any of them (None where one records none)."""
    if "sources" in result:
        found = [changed_since(p) for p in result["sources"].values()]
        if any(f is None for f in found):
            return None
        return [c for c in COMPONENTS if any(c in f for f in found)]
    recorded = result.get("components")
    if not isinstance(recorded, dict):
        return None
    now = versions()
    names = BENCHMARKS.get(result.get("benchmark"), tuple(recorded))
    return [c for c in COMPONENTS
            if c in names and now.get(c) is not None and recorded.get(c) != now[c]]


def manifest() -> list[dict]:
    """One entry per recorded result, sorted by file: "file" ("h200/attention.json"),
    "benchmark", "date" (YYYY-MM-DD), "revision" (7 hex digits, None where not recorded),
    "dirty" (its tree had uncommitted changes; None where not recorded), "gpu" (or the CPU, for
    CPU benchmarks), "host" and "gpu_uuid" (None where not recorded), and "changed"
    (`changed_since`). Raises ValueError (as `load_result`) for a file that cannot be read."""
    entries = []
    for machine_name in _available():
        machine, name = machine_name.split("/")
        result = load_result(machine, name)
        revision = result.get("git_revision")
        entries.append({
            "file": f"{machine_name}.json", "benchmark": result.get("benchmark"),
            "date": str(result.get("date", ""))[:10] or None,
            "revision": revision[:7] if isinstance(revision, str) else None,
            "dirty": result.get("git_dirty"), "gpu": result.get("gpu") or result.get("cpu"),
            "host": result.get("host"), "gpu_uuid": result.get("gpu_uuid"),
            "changed": changed_since(result)})
    return entries


def recorded_models(result: dict) -> list[str]:
    """The models with rows in `result`, in recording order."""
    return list(dict.fromkeys(row["model"] for row in result["rows"]))


def nearest_point(result: dict, model: str, batch: int, context: int) -> tuple[int, int]:
    """The recorded `(batch, context)` of `model` nearest to the request on a log2 scale.

    Distance is Euclidean in (log2 batch, log2 context) over the points recorded for `model`
    (points the benchmark skipped are not candidates). On a full grid this is the nearest batch and
    the nearest context chosen independently: batch=100 -> 128, context=5000 -> 8192.
    NOTE: ties (e.g. batch=32, equally far from 16 and 64) go to the smaller batch, then the
    smaller context: the point with less K/V.

    Raises ValueError if `model` has no rows (listing the recorded models) or if `batch` or
    `context` is not a positive integer (a Python or numpy int).
    """
    for name, value in (("batch", batch), ("context", context)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    points = {(r["batch"], r["context"]) for r in result["rows"] if r["model"] == model}
    if not points:
        raise ValueError(
            f"model={model!r}: not recorded; recorded models: {recorded_models(result)}"
        )

    def distance(point):
        b, c = point
        # NOTE: differences of logs, not logs of ratios: a ratio of huge integers underflows
        d = math.hypot(math.log2(b) - math.log2(batch), math.log2(c) - math.log2(context))
        return (round(d, 9), b, c)

    return min(points, key=distance)


def nearest_rows(result: dict, model: str, batch: int, context: int) -> list[dict]:
    """The rows of `result` at `model`'s recorded point nearest to (`batch`, `context`) (see
    `nearest_point`), in recorded order: every kernel, prefetch setting and block size there,
    each once (a setting measured in several runs keeps its first row).

    Raises ValueError for an unrecorded `model` (listing the recorded ones).
    """
    b, c = nearest_point(result, model, batch, context)
    rows = {}
    for r in result["rows"]:
        if r["model"] == model and r["batch"] == b and r["context"] == c:
            rows.setdefault(tuple(r.get(k) for k in ROW_KEY), r)
    return list(rows.values())
