"""Record a machine's results again on the code as it stands, each with the command it was made
with: `python benchmarks/rerecord.py`.

Every committed result of `results/<machine>/` made by `python -m kvlab bench ...` is a part,
named by its file. A part's command is the one its file records, with its output paths (--json,
--checkpoint) pointed into --out and no --resume (a new recording starts afresh). A finished
part's file records the command as it would run from the repository (`canonical`), not the paths
of the machine that ran it. `--list` prints the parts and their commands; `--run NAME ...` (or
`--run all`) runs them in turn, each under its own timeout, and writes `rerecord.json` into
--out: the machine, GPU, revision and date, and per part its command, exit status and seconds.
How long each part took when it last ran to its end is kept in TIMES (rerecord_times.json,
committed; `--add-times LOG ...` merges the runs' logs into it), and `--list` shows it; a part
stopped at the budget after longer than its known time is kept as taking at least that long
(`at_least`) until it runs to its end; a part whose shards all ran to their end on one
revision is kept as taking their sum, with their names. A device
call has a time limit: with `--budget SECONDS`, no part starts once the elapsed time plus the
part's seconds (from TIMES, or an earlier `rerecord.json` given as `--durations`) would pass
it, and a part still running at the budget's end is stopped (its checkpoint kept). The parts
not run are named, so that the next call takes them up.
`--gpu-checks FILE` hands the GPU tests' and sanitizers' summary (`gpu_checks.json`, which
benchmarks/device_run.sh leaves in $OUT) to every part, which records it as `gpu_checks`.
The H200's parts also gain what its recordings lacked (`AMEND`): FlashInfer's two decode paths in
the same loop as the other kernels (and its production length mix), HF's compiled and eager
static cache over two rounds, and the cross-kernel prefetch's batches up to 128 at 4k and 32k
tokens (where their caches fit). A machine may also take up a part it has no result for yet
from another machine's result (`ADOPT`: the H200 the H100's step traces, counters and lever
runs), with that part's time there standing in for --budget until it has its own.
`--plan` prints the device calls that re-record the machine's stale parts (`to_rerecord`),
packed by their times into the fewest calls within --budget (`plan`).
A part whose command names a file needs that file first: attention_vllm's --vllm-cubin is built
by benchmarks/vllm_cubin.sh.
A machine's parts run only on the GPU its results were recorded on (their "gpu", against
nvidia-smi's name here): a device that lends an H100 for an H200 call records nothing.
A part too long for one call runs as shards: `--run NAME@OPTION=V,V...` runs the part with
--models or --batches narrowed to some of its own values (every point's variants still in one
loop), into NAME@OPTION=V,V....json; once shards cover the part's values, `--merge NAME`
joins them in --out into NAME.json: their rows in the part's order, the first shard's
run-level fields (its roofline among them), every shard's date, host, clocks, roofline and
checks under "shards". Each row was timed, and set against the roofline, in its own shard's
run; shards that differ in SHARED (`shared`: the components their benchmark measures, not the
commit; the software; the kind of GPU) are refused. A shard can wait in the repository for the
rest of its part: `--take DIR` brings a call's --out (unpacked) into results/<machine>/, each
shard into benchmarks/shards/<machine>/ (HELD), the times into TIMES, and merges every part
its held shards then cover; `--plan` runs only the values held shards leave, while their code
is current.
The device returns few files from $OUT, and nothing a command left unpacked when the call's
limit stopped it: point --out elsewhere and give `--pack $OUT/rr.tgz`, which rewrites
rerecord.json and packs --out into that one file after every part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.bench.env import git_state  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TIMES = ROOT / "benchmarks" / "rerecord_times.json"  # {machine: {part: {"seconds", "gpu", ...}}}
LOG_HEADER = ("machine", "gpu", "revision", "date")  # what a run's log says of where it ran
PREFIX = ["python", "-m", "kvlab", "bench"]
# the benchmarks whose CLI takes --checkpoint (tests/test_rerecord.py checks it against the CLI)
CHECKPOINTED = ("attention", "e2e", "kvpr", "timeline")
CHECKPOINT = "_partial"  # a part's checkpoint is out/<part>_partial.json, beside its result
DROPPED = ("--json", "--checkpoint", "--resume")  # options a part sets itself, with their value
PART_TIMEOUT_S = 3600
PLAN_BUDGET_S = 540  # a device call's ten minutes, less its start and the files' return
FLASHINFER = ["flashinfer", "flashinfer_tc"]
FAIR_HF = {"--hf-compile": ["both"], "--rounds": ["2"]}  # (their default variants hold
# gqa+sync: kvlab's steps timed as HF's, each launched after the last one's tokens)
ALL_BATCHES = {"--batches": ["1", "16", "64", "128"]}  # the lever grid's (a cache that does
# not fit is left out by the benchmark, with the reason)
NCU_4K = {"--timeout": ["200"]}  # ncu over one batch-16 step at 4k tokens can run past 100 s on
# an H100, which leaves that point without counters
# {machine: {part: {option: values}}}: what a re-recording adds to the part's recorded command.
# An option of LIST_OPTIONS gets the values it lacks appended (the option added where absent);
# any other option is set to its value.
AMEND = {"h200": {
    "attention": {"--kernels": FLASHINFER},
    "attention_bf16": {"--kernels": FLASHINFER},
    "attention_fp8": {"--kernels": FLASHINFER},
    "attention_small": {"--kernels": FLASHINFER},
    "attention_vllm": {"--kernels": FLASHINFER},
    "attention_mixed": {"--kernels": FLASHINFER, "--lengths": ["production:32768"]},
    "e2e": FAIR_HF, "e2e_qwen7b": FAIR_HF, "e2e_qwen14b": FAIR_HF,
    "e2e_ahead_4k": ALL_BATCHES, "e2e_ahead_32k": ALL_BATCHES, "steptrace_4k_counters": NCU_4K},
    "h100": {"e2e_ahead_4k": ALL_BATCHES, "e2e_ahead_32k": ALL_BATCHES,
             "steptrace_4k_counters": NCU_4K, "e2e_hf": {"--variants": ["gqa+sync"]}}}
# {machine: {part: the machine whose result of that name gives its command}}: parts a machine
# has no result for yet
ADOPT = {"h200": dict.fromkeys(("steptrace", "steptrace_4k", "steptrace_32k", "steptrace_counters",
                                "steptrace_4k_counters", "steptrace_kv_counters", "e2e_ahead",
                                "e2e_ahead_kv", "e2e_ahead_kv_4k"), "h100")}
LIST_OPTIONS = ("--kernels", "--lengths", "--models", "--batches", "--contexts", "--points",
                "--variants")
SHARDABLE = ("models", "batches")  # what a part may be split by (`sharded`)
# what shards must share to be merged: the code they measured (its components, not the
# revision: shards held from calls at different commits join when their code is alike), its
# state, the GPU's kind and the software stack
SHARED = ("benchmark", "gpu", "git_dirty", "components", "versions", "torch_cuda")
MEASURED = ("rows", "skipped", "serving", "timelines")  # what every shard adds to a merge
SHARD_RUN = ("date", "host", "git_revision", "driver", "gpu_uuid", "clocks_start", "clocks_end",
             "roofline_copy_gbps", "gpu_checks")  # what a merged result keeps of every shard's run
HELD = ROOT / "benchmarks" / "shards"  # <machine>/: shards committed until their part is
# covered (outside results/, which the wheel ships and the lab reads)


def parts(machine: str) -> dict[str, list[str]]:
    """{file name (no .json): its recorded command, as argv} for the results of `machine` made
    by `python -m kvlab bench`, and the parts it adopts (`ADOPT`) with their source's command,
    each as AMEND amends it for `machine`. Raises ValueError for a machine with no results
    folder."""
    folder = RESULTS / machine
    if not folder.is_dir():
        machines = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
        raise ValueError(f"--machine {machine!r}: no results/{machine}/; one of {machines}")
    adopted = [RESULTS / source / f"{name}.json"
               for name, source in ADOPT.get(machine, {}).items()
               if not (folder / f"{name}.json").is_file()]
    found = {}
    for path in sorted([*folder.glob("*.json"), *adopted], key=lambda path: path.stem):
        argv = shlex.split(json.loads(path.read_text()).get("command") or "")
        if argv[:4] == PREFIX:
            found[path.stem] = amended(argv, AMEND.get(machine, {}).get(path.stem, {}))
    return found


def _values_span(argv: list[str], option: str) -> tuple[int, int]:
    """Where the values of `option`, which `argv` holds, begin and end in it."""
    at = end = argv.index(option) + 1
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return at, end


def amended(argv: list[str], changes: dict[str, list[str]]) -> list[str]:
    """`argv` with `changes` ({option: values}, as AMEND's) made: a list option's missing
    values appended to its own, any other option's value set; an absent option added at the
    end. Making the same changes again changes nothing."""
    argv = list(argv)
    for option, values in changes.items():
        if option not in argv:
            argv += [option, *values]
            continue
        at, end = _values_span(argv, option)
        kept = argv[at:end]
        new = (kept + [v for v in values if v not in kept] if option in LIST_OPTIONS
               else list(values))
        argv[at:end] = new
    return argv


def _without_outputs(argv: list[str]) -> list[str]:
    """`argv` with DROPPED's options and their values left out."""
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in DROPPED:
            skip = True
        elif not token.startswith(tuple(f"{o}=" for o in DROPPED)):
            kept.append(token)
    return kept


def canonical(machine: str, name: str, argv: list[str]) -> str:
    """The command a part's result records: as run from the repository, into its file there."""
    return shlex.join([*_without_outputs(argv), "--json",
                       f"benchmarks/results/{machine}/{name}.json"])


def command(name: str, argv: list[str], out: Path) -> list[str]:
    """`argv` (a recorded command) with DROPPED's options and their values left out, writing
    its result to out/<name>.json (and, where the benchmark takes it, its checkpoint beside)."""
    kept = _without_outputs(argv) + ["--json", str(out / f"{name}.json")]
    if argv[4] in CHECKPOINTED:
        kept += ["--checkpoint", str(out / f"{name}{CHECKPOINT}.json")]
    return [sys.executable, *kept[1:]]


def recorded_gpus(machine: str) -> set[str]:
    """The GPUs the results of `machine` were recorded on (their "gpu")."""
    return {gpu for path in (RESULTS / machine).glob("*.json")
            if (gpu := json.loads(path.read_text()).get("gpu"))}


def gpu_here() -> str | None:
    """The name of this machine's first GPU, as nvidia-smi gives it; None without one."""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = found.stdout.strip().splitlines() if found.returncode == 0 else []
    return names[0].strip() if names else None


def chosen(names: list[str], known: dict) -> dict[str, list[str]]:
    """{name: command} of the parts and shards (`sharded`) named, or of all parts for
    ["all"], in the order given. Raises ValueError for an unknown name or a bad shard."""
    if names == ["all"]:
        return dict(known)
    unknown = [n for n in names if n.partition("@")[0] not in known]
    if unknown:
        raise ValueError(f"--run {' '.join(unknown)}: no such part; one of {sorted(known)} "
                         "or all")
    return {name: known[name] if name in known else sharded(name, known)
            for name in dict.fromkeys(names)}


def option_values(argv: list[str], option: str) -> list[str] | None:
    """The values a recorded command takes for `option` (a SHARDABLE name), its benchmark's
    default where it does not say; None where the benchmark has no such list."""
    from kvlab.bench.cli import parser

    values = getattr(parser().parse_args(argv[3:]), option, None)
    return None if values is None else [str(v) for v in values]


def _without(argv: list[str], option: str) -> list[str]:
    """`argv` less `option` and its values."""
    if option not in argv:
        return list(argv)
    at, end = _values_span(argv, option)
    return argv[:at - 1] + argv[end:]


def shard_of(name: str) -> tuple[str, str, list[str]]:
    """(part, option, values) of a shard's name, "PART@OPTION=V,V...". Raises ValueError
    for a name of another form."""
    part, _, spec = name.partition("@")
    option, _, values = spec.partition("=")
    if option not in SHARDABLE or not all(values.split(",")):
        raise ValueError(f"--run {name}: a shard is PART@OPTION=V,V... with OPTION one of "
                         f"{', '.join(SHARDABLE)}")
    return part, option, values.split(",")


def sharded(name: str, known: dict) -> list[str]:
    """The command of the shard `name`: its part's command with --OPTION narrowed to the
    shard's values, some of the part's own, each named once. Raises ValueError otherwise."""
    part, option, values = shard_of(name)
    whole = option_values(known[part], option)
    if option == "batches" and "--points" in known[part]:  # (which overrides --batches)
        raise ValueError(f"--run {name}: {part} times --points; shard it by models")
    if whole is None or not set(values) <= set(whole) or len(set(values)) < len(values):
        raise ValueError(f"--run {name}: {part} runs --{option} "
                         f"{' '.join(whole) if whole else '(none)'}; a shard takes some of "
                         "them, each once")
    return [*_without(known[part], f"--{option}"), f"--{option}", *values]


def shown(path: Path) -> str:
    """A path under RESULTS or HELD as the repository names it."""
    top, name = (HELD, "shards") if path.is_relative_to(HELD) else (RESULTS, "results")
    return f"benchmarks/{name}/{path.relative_to(top)}"


def held(machine: str) -> dict[str, dict]:
    """{shard name: result} of the shards committed in benchmarks/shards/<machine>/ (HELD)
    whose code is current (`kvlab.results.changed_since` names nothing)."""
    from kvlab.results import changed_since

    found = {path.stem: json.loads(path.read_text())
             for path in sorted((HELD / machine).glob("*@*.json"))}
    return {name: result for name, result in found.items() if changed_since(result) == []}


def stale_held(machine: str) -> list[Path]:
    """The shards in benchmarks/shards/<machine>/ older than the code they measured: they can
    no longer join their part (`held` leaves them out)."""
    current = held(machine)
    return [path for path in sorted((HELD / machine).glob("*@*.json"))
            if path.stem not in current]


def held_cover(machine: str, known: dict[str, list[str]]) -> dict[str, tuple[str, list[str]]]:
    """{part: (option, values)}: the values of each part of `machine` that its `held` shards
    cover (those among the part's own), by the option that covers most where they split it by
    more than one."""
    by = {}
    for name in held(machine):
        part, option, values = shard_of(name)
        whole = (option_values(known[part], option) or []) if part in known else []
        by.setdefault(part, {}).setdefault(option, []).extend(v for v in values if v in whole)
    return {part: max(options.items(), key=lambda item: len(item[1]))
            for part, options in by.items() if any(options.values())}


def shared(result: dict) -> dict:
    """What of `result` a shard must share with its part's other shards (SHARED), its
    components only those its benchmark measures (`kvlab.components.BENCHMARKS`: a result
    records every component's version, and the others may change between calls)."""
    from kvlab.components import BENCHMARKS

    found = {key: result.get(key) for key in SHARED}
    if isinstance(found["components"], dict) and result.get("benchmark") in BENCHMARKS:
        found["components"] = {name: found["components"].get(name)
                               for name in BENCHMARKS[result["benchmark"]]}
    return found


def held_problems(machine: str) -> list[str]:
    """Why the shards in benchmarks/shards/<machine>/ could not join their parts, a line each
    (none: they can): a file that is no shard of a part of `machine`, recorded on a GPU its
    results were not or on a tree with uncommitted changes; a part's shards that split it by
    more than one option, take a value twice, differ in `shared`, or cover it whole (it should
    have been merged)."""
    known, gpus = parts(machine), recorded_gpus(machine)
    problems, by_part = [], {}
    for path in sorted((HELD / machine).glob("*.json")):
        result = json.loads(path.read_text())
        try:
            if path.stem.partition("@")[0] not in known or "@" not in path.stem:
                raise ValueError(f"no shard of a part of {machine}")
            sharded(path.stem, known)
        except ValueError as err:
            problems.append(f"{shown(path)}: {err}")
            continue
        if result.get("gpu") not in gpus or result.get("git_dirty") is not False:
            problems.append(f"{shown(path)}: recorded on {result.get('gpu')} with git_dirty "
                            f"{result.get('git_dirty')}; results/{machine}/ are of "
                            f"{', '.join(sorted(gpus))}, on committed trees")
        by_part.setdefault(path.stem.partition("@")[0], []).append((path.stem, result))
    for part, found in by_part.items():
        split = [shard_of(name) for name, _ in found]
        options = {option for _, option, _ in split}
        taken = [value for _, _, values in split for value in values]
        if len(options) > 1 or len(taken) > len(set(taken)):
            problems.append(f"{part}: its shards split it by {', '.join(sorted(options))} and "
                            f"take {' '.join(taken)}; one option, each value once")
        elif set(taken) >= set(option_values(known[part], options.pop()) or []):
            problems.append(f"{part}: its shards cover it; merge them (--merge {part})")
        if len({json.dumps(shared(result), sort_keys=True) for _, result in found}) > 1:
            problems.append(f"{part}: its shards differ in {', '.join(SHARED)} (`shared`)")
    return problems


def merge(machine: str, part: str, out: Path) -> Path:
    """Join the shards of `part` in `out`, and those `held` in benchmarks/shards/<machine>/
    (out's where both have one of the same name), into out/<part>.json (the module's docstring
    says how) and return its path; where out is results/<machine>/, the held shards joined are
    removed. Raises ValueError where the shards do not cover the part's values once each,
    split it by more than one option, or differ in SHARED."""
    known = parts(machine)
    if part not in known:
        raise ValueError(f"--merge {part}: no such part of {machine}")
    kept = {name: result for name, result in held(machine).items()
            if name.partition("@")[0] == part}
    found = kept | {path.stem: json.loads(path.read_text())
                    for path in out.glob(f"{part}@*.json") if not path.stem.endswith(CHECKPOINT)}
    if not found:
        raise ValueError(f"--merge {part}: no shard {part}@OPTION=V,... in {out} or held in "
                         f"{shown(HELD / machine)}/")
    split = {name: shard_of(name) for name in found}
    options = {option for _, option, _ in split.values()}
    if len(options) > 1:
        raise ValueError(f"--merge {part}: its shards split it by {', '.join(sorted(options))};"
                         " one option only")
    option = options.pop()
    whole = option_values(known[part], option)
    covered = [v for _, _, values in split.values() for v in values]
    if sorted(covered) != sorted(whole):
        raise ValueError(f"--merge {part}: its shards cover --{option} {' '.join(covered)}; "
                         f"the part's are {' '.join(whole)}, each once")
    alike = [shared(result) for result in found.values()]
    for key in SHARED:
        if len({json.dumps(a[key], sort_keys=True) for a in alike}) > 1:
            raise ValueError(f"--merge {part}: its shards differ in {key}")
    names = sorted(found, key=lambda name: whole.index(split[name][2][0]))
    models = option_values(known[part], "models") or []

    def order(item) -> tuple[int, int]:  # (the part's model order, then its batches')
        item = item if isinstance(item, dict) else {}
        return (models.index(item["model"]) if item.get("model") in models else -1,
                whole.index(str(item["batch"])) if option == "batches"
                and str(item.get("batch")) in whole else -1)

    merged = dict(found[names[0]])
    for key in MEASURED:
        if key in merged:
            merged[key] = sorted((item for name in names for item in found[name].get(key, [])),
                                 key=order)
    merged["command"] = canonical(machine, part, known[part])
    merged["shards"] = [{"name": name, **{k: found[name][k] for k in SHARD_RUN
                                          if k in found[name]}} for name in names]
    path = out / f"{part}.json"
    path.write_text(json.dumps(merged, indent=2) + "\n")
    if out.resolve() == (RESULTS / machine).resolve():
        for name in kept:
            (HELD / machine / f"{name}.json").unlink()
    return path


def take(machine: str, found: Path) -> list[str]:
    """Bring a device call's run (its --out folder, unpacked from rr.tgz) into the
    repository: each part's result into results/<machine>/ and each shard's into
    benchmarks/shards/<machine>/ (HELD), the run's times (its rerecord.json) into TIMES; then
    every part with a shard in the run whose held shards cover it is merged (`merge`; one
    that cannot be is named, not raised). A part's file, or a shard, replaces the held shards
    of its part that it takes the values of again, that split the part otherwise, or that
    differ from it in `shared`; held shards older than the code are removed; a shard of older
    code is not kept (it could not join its part). Checkpoints stay behind. Returns a line
    per thing done. Raises ValueError, before anything is moved, for a file that is no part or
    shard of `machine`, recorded on a GPU its results were not, or on a tree with uncommitted
    changes, and for a log of another machine."""
    from kvlab.results import changed_since

    known = parts(machine)
    gpus = recorded_gpus(machine)
    results = {}
    for path in sorted(found.glob("*.json")):
        if path.name == "rerecord.json" or path.stem.endswith(CHECKPOINT):
            continue
        name, result = path.stem, json.loads(path.read_text())
        if name.partition("@")[0] not in known:
            raise ValueError(f"--take {found}: {path.name} is no part of {machine}")
        if "@" in name:
            sharded(name, known)
        if result.get("gpu") not in gpus:
            raise ValueError(f"--take {found}: {path.name} was recorded on {result.get('gpu')}; "
                             f"results/{machine}/ on {', '.join(sorted(gpus))}")
        if result.get("git_dirty") is not False:
            raise ValueError(f"--take {found}: {path.name} records git_dirty "
                             f"{result.get('git_dirty')}: record it on a committed tree")
        results[name] = path, result
    log = found / "rerecord.json"
    log = json.loads(log.read_text()) if log.is_file() else None
    if log is not None and log.get("machine") != machine:
        raise ValueError(f"--take {found}: its rerecord.json is a run of {log.get('machine')}, "
                         f"not {machine}")
    lines = add_times([log]) if log is not None else []
    folder = HELD / machine
    gone, kept = stale_held(machine), set()
    for name, (path, result) in results.items():
        part, _, _ = name.partition("@")
        option, values = shard_of(name)[1:] if "@" in name else (None, [])
        if option and changed_since(result) != []:
            lines.append(f"{path}: not kept, older than the code it measured")
            continue
        for other in sorted(folder.glob(f"{part}@*.json")):
            _, its_option, its_values = shard_of(other.stem)
            if other.stem != name and (
                    option is None or its_option != option or set(its_values) & set(values)
                    or shared(json.loads(other.read_text())) != shared(result)):
                gone.append(other)
        target = folder / path.name if option else RESULTS / machine / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        kept.add(target)
        lines.append(f"{path} -> {shown(target)}")
    for path in dict.fromkeys(gone):
        if path.is_file() and path not in kept:
            path.unlink()
            lines.append(f"removed {shown(path)} (older code, or replaced by the run's)")
    cover = held_cover(machine, known)
    for part in sorted({name.partition("@")[0] for name in results if "@" in name}):
        option, values = cover.get(part, (None, []))
        if option and sorted(values) == sorted(option_values(known[part], option) or []):
            try:
                lines.append(f"merged {shown(merge(machine, part, RESULTS / machine))}")
            except ValueError as err:
                lines.append(f"not merged: {err}")
    return lines


def run(names: list[str], known: dict, out: Path, budget_s: float | None,
        durations: dict[str, float], env: dict, machine: str = "h200",
        runner=subprocess.run, after_part: Callable[[dict], None] | None = None) -> dict:
    """Run the parts in turn, each finished one's file given its `canonical` command; returns
    {"parts": [{"name", "command", "returncode", "seconds"}], "not_run": [names left for want
    of budget]}, which `after_part` (where given) is handed after every part that ran."""
    log = {"parts": [], "not_run": []}
    start = time.monotonic()
    for name in names:
        elapsed = time.monotonic() - start
        if budget_s is not None and elapsed + durations.get(name, 0.0) > budget_s:
            log["not_run"].append(name)
            continue
        argv = command(name, known[name], out)
        written = out / f"{name}.json"
        written.unlink(missing_ok=True)  # (an earlier run's, into the same --out)
        print(f"== {name}: {shlex.join(argv)}", file=sys.stderr, flush=True)
        began = time.monotonic()
        try:
            limit = PART_TIMEOUT_S if budget_s is None else min(PART_TIMEOUT_S,
                                                                  budget_s - elapsed)
            code = runner(argv, cwd=ROOT, env=env, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = None
        log["parts"].append({"name": name, "command": shlex.join(argv), "returncode": code,
                             "seconds": round(time.monotonic() - began, 1),
                             "wrote": written.is_file()})
        if ran_to_its_end(log["parts"][-1]):
            result = json.loads(written.read_text())
            result["command"] = canonical(machine, name, known[name])
            written.write_text(json.dumps(result, indent=2) + "\n")
        if after_part is not None:
            after_part(log)
    return log


def times(machine: str, path: Path | None = None) -> dict[str, dict]:
    """{part: {"seconds", "gpu", "revision", "dirty", "date"[, "at_least" | "shards"]}}: how
    long each part (or shard) of `machine` took when it last ran to its end, or at least
    (stopped at a budget), or as the sum of its shards' (`whole_from_shards`), by `path`
    (default the committed TIMES)."""
    path = TIMES if path is None else path
    return json.loads(path.read_text()).get(machine, {}) if path.is_file() else {}


def took(entry: dict) -> str:
    """A part's time as --list and --add-times print it: "84 s on <GPU> at 77585ce, <date>"
    ("at least 84 s ..." for a part stopped at the budget; "... (4 shards)" for a part timed as
    the sum of its shards')."""
    return (f"{'at least ' if entry.get('at_least') else ''}{entry['seconds']:.0f} s on "
            f"{entry['gpu']} at {entry['revision'][:7]}"
            f"{' + uncommitted changes' if entry.get('dirty') else ''}, {entry['date']}"
            + (f" ({len(entry['shards'])} shards)" if "shards" in entry else ""))


def ran_to_its_end(part: dict) -> bool:
    """Whether a part of a run's log ran to its end: it wrote its result and was not stopped
    at the budget (bench steptrace writes its result, then aborts at exit: a non-zero status
    with the file written counts)."""
    return part["returncode"] is not None and (part["returncode"] == 0 or part.get("wrote"))


def stopped_at_the_budget(part: dict) -> bool:
    """Whether a part of a run's log was stopped at the budget: its time is a lower bound."""
    return part["returncode"] is None and not part.get("wrote")


def whole_from_shards(machine: str, kept: dict[str, dict]) -> dict[str, dict]:
    """{part: its time as the sum of its shards'} for each part of `machine` whose shards in
    `kept` (a machine's TIMES) ran to their end on one revision and GPU and cover its values
    once each, taken newest first; where that is newer than the part's own time, or the part's
    is a lower bound. The entry names its shards."""
    found = {}
    for name, entry in kept.items():
        if "@" in name and not entry.get("at_least"):
            part, option, values = shard_of(name)
            found.setdefault((part, option), []).append((name, entry, values))
    known = parts(machine) if found else {}
    wholes = {}
    for (part, option), shards in found.items():
        if part not in known:
            continue
        shards.sort(key=lambda shard: shard[1]["date"], reverse=True)
        newest = shards[0][1]
        chosen, covered = [], []
        for name, entry, values in shards:
            if (entry["revision"], entry["gpu"]) == (newest["revision"], newest["gpu"]) and (
                    not set(values) & set(covered)):
                chosen.append(name)
                covered += values
        if sorted(covered) != sorted(option_values(known[part], option) or []):
            continue
        whole = {"seconds": round(sum(kept[name]["seconds"] for name in chosen), 1),
                 "gpu": newest["gpu"], "revision": newest["revision"],
                 "dirty": any(kept[name].get("dirty") for name in chosen),
                 "date": newest["date"], "shards": sorted(chosen)}
        own = kept.get(part, {})
        ran_whole = own and not own.get("at_least") and "shards" not in own
        if own != whole and not (ran_whole and own["date"] >= newest["date"]):
            wholes[part] = whole
    return wholes


def add_times(logs: list[dict], path: Path | None = None) -> list[str]:
    """Merge the parts of each run's log (rerecord.json) that ran to their end
    (`ran_to_its_end`) into `path` (default TIMES), each with where, when and on which code it
    ran; and those stopped at the budget after longer than the time kept for them, marked
    `at_least`. Returns a line per part merged. Raises ValueError for a log without
    LOG_HEADER's keys or a list of parts."""
    path = TIMES if path is None else path
    table = json.loads(path.read_text()) if path.is_file() else {}
    merged = []
    for log in logs:
        missing = [key for key in LOG_HEADER if not log.get(key)]
        if not isinstance(log.get("parts"), list):
            missing.append("parts")
        if missing:
            raise ValueError(f"a log lacks {', '.join(missing)}: not a rerecord.json of a run")
        kept = table.get(log["machine"], {})
        for part in log["parts"]:
            stopped = stopped_at_the_budget(part)
            if not (ran_to_its_end(part) or stopped and part["seconds"] > kept.get(
                    part["name"], {}).get("seconds", 0.0)):
                continue
            kept[part["name"]] = {
                "seconds": part["seconds"], "gpu": log["gpu"], "revision": log["revision"],
                "dirty": log.get("dirty", False), "date": log["date"],
                **({"at_least": True} if stopped else {})}
            table[log["machine"]] = kept
            merged.append(f"{log['machine']}/{part['name']}: {took(kept[part['name']])}")
        for whole, entry in whole_from_shards(log["machine"], kept).items():
            kept[whole] = entry
            merged.append(f"{log['machine']}/{whole}: {took(entry)}")
    path.write_text(json.dumps({m: dict(sorted(p.items())) for m, p in sorted(table.items())},
                               indent=2) + "\n")
    return merged


def to_rerecord(machine: str, known: dict[str, list[str]]) -> list[str]:
    """The parts of `machine` (`known`, as `parts` gives them) whose result is older than the
    code it measured (`kvlab.results.changed_since`: a component changed, or none recorded),
    or which it has no result for yet (adopted), in `known`'s order."""
    from kvlab.results import changed_since

    def current(name: str) -> bool:
        path = RESULTS / machine / f"{name}.json"
        return path.is_file() and changed_since(json.loads(path.read_text())) == []
    return [name for name in known if not current(name)]


def estimates(machine: str, names: list[str]) -> dict[str, tuple[float, str]]:
    """{part: (seconds, where that comes from)} for those of `names` timed on `machine` (its
    TIMES) or, failing that, on another machine (its time there stands in); a lower bound
    (`at_least`) as such. Parts timed nowhere are left out."""
    timed = json.loads(TIMES.read_text()) if TIMES.is_file() else {}
    found = {}
    for name in names:
        for where in [machine, *(m for m in timed if m != machine)]:
            entry = timed.get(where, {}).get(name)
            if entry:
                found[name] = (entry["seconds"], ("at least, " if entry.get("at_least") else "")
                               + ("here" if where == machine else f"{where}'s"))
                break
    return found


def plan(machine: str, known: dict[str, list[str]], names: list[str],
         budget_s: float) -> tuple[list[list[tuple]], list[str]]:
    """(calls, untimed): the parts `names` of `machine` (`known`, as `parts` gives them)
    packed into device calls of at most `budget_s` seconds each by their `estimates`, longest
    first, each into the first call it fits; a part longer than the budget as the fewest shards
    by --models (or else --batches) that each fit, its time shared evenly among its values.
    A part with shards held (`held_cover`) is planned as a shard of the values they leave, by
    their option, and not at all where they leave none (it awaits `--merge`). Each call is a
    list of (name, seconds, where from). `untimed`: the parts timed nowhere, in `names`'
    order."""
    found = estimates(machine, names)
    cover = held_cover(machine, known)
    items = []
    for name in names:
        if name not in found:
            continue
        seconds, source = found[name]
        option, done = cover.get(name, (None, []))
        option = option or next((o for o in SHARDABLE
                                 if len(option_values(known[name], o) or []) > 1
                                 and not (o == "batches" and "--points" in known[name])), None)
        values = option_values(known[name], option) if option else []
        left = [value for value in values if value not in done]
        if done and not left:
            continue
        if not done and (seconds <= budget_s or not values):
            items.append((name, seconds, source))
            continue
        size = max(1, math.floor(budget_s * len(values) / seconds))  # values a shard takes
        for at in range(0, len(left), size):
            share = left[at:at + size]
            items.append((f"{name}@{option}={','.join(share)}",
                          round(seconds * len(share) / len(values), 1), f"{source}, shared"))
    calls: list[list[tuple]] = []
    for item in sorted(items, key=lambda item: -item[1]):
        fits = next((call for call in calls if sum(i[1] for i in call) + item[1] <= budget_s),
                    None)
        if fits is None:
            calls.append(fits := [])
        fits.append(item)
    return calls, [name for name in names if name not in found]


def print_plan(machine: str, known: dict[str, list[str]], budget_s: float) -> None:
    """Print `plan` for the parts `to_rerecord` names: each call's parts as device_run.sh
    takes them (RERECORD_<MACHINE>), with their times and where those come from."""
    names = to_rerecord(machine, known)
    calls, untimed = plan(machine, known, names, budget_s)
    cover = held_cover(machine, known)
    print(f"{machine}: {len(names)} of {len(known)} parts to re-record (older than the code they "
          f"measured, or not recorded here yet); {len(calls)} calls of at most {budget_s:.0f} s "
          f"by their times, and {len(untimed)} parts timed nowhere")
    for name in names:
        if name in cover:
            option, values = cover[name]
            whole = option_values(known[name], option) or []
            print(f"{name}: shards held for --{option} {' '.join(v for v in whole if v in values)}"
                  + ("" if set(whole) - set(values) else
                     f"; they cover it: python benchmarks/rerecord.py --machine {machine} "
                     f"--merge {name} --out benchmarks/results/{machine}"))
    for path in stale_held(machine):
        print(f"{shown(path)}: older than the code it measured; remove it")
    for number, call in enumerate(calls, 1):
        total = sum(seconds for _, seconds, _ in call)
        over = " (one part over the budget: shard it further)" if total > budget_s else ""
        print(f"call {number}, ~{total:.0f} s{over}: RERECORD_{machine.upper()}="
              f"\"{' '.join(name for name, _, _ in call)}\"")
        for name, seconds, source in call:
            print(f"  {name}: {seconds:.0f} s ({source})")
    if untimed:
        print(f"timed nowhere, for the calls after: RERECORD_{machine.upper()}="
              f"\"{' '.join(untimed)}\" (--budget stops the part running at its end, kept as "
              "a lower bound, and names those not started, for the next call)")


def saver(out: Path, pack: Path | None) -> Callable[[dict], None]:
    """What keeps a run's log: writes it to out/rerecord.json and, with `pack`, packs out into
    that .tgz (written beside it, then renamed: a call stopped mid-write leaves the last one)."""
    def save(log: dict) -> None:
        (out / "rerecord.json").write_text(json.dumps(log, indent=2) + "\n")
        if pack is not None:
            partial = pack.with_name(pack.name + ".partial")
            with tarfile.open(partial, "w:gz") as tar:
                tar.add(out, arcname=out.name)
            os.replace(partial, pack)
    return save


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/rerecord.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="h200", help="the results folder (default h200)")
    parser.add_argument("--list", action="store_true", help="print the parts and commands")
    parser.add_argument("--run", nargs="+", metavar="NAME", help="parts to run, or all")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "rerecorded")))
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="start no part that would end past this (by --durations)")
    parser.add_argument("--durations", type=Path, metavar="JSON",
                        help="an earlier rerecord.json: each part's seconds, for --budget "
                             "(default: rerecord_times.json's)")
    parser.add_argument("--add-times", type=Path, nargs="+", metavar="LOG",
                        help="merge these runs' rerecord.json into rerecord_times.json")
    parser.add_argument("--gpu-checks", type=Path, metavar="JSON",
                        help="the GPU checks' summary every part records (KVLAB_GPU_CHECKS)")
    parser.add_argument("--merge", metavar="PART",
                        help="join the shards of PART (NAME@OPTION=V,...) in --out into one "
                             "result")
    parser.add_argument("--take", type=Path, metavar="DIR",
                        help="bring a run's --out folder into results/<machine>/ (shards into "
                             "benchmarks/shards/<machine>/, times into rerecord_times.json) "
                             "and merge the parts its shards cover")
    parser.add_argument("--pack", type=Path, metavar="TGZ",
                        help="after every part, pack --out into this file (e.g. $OUT/rr.tgz)")
    parser.add_argument("--plan", action="store_true",
                        help="print the device calls that re-record the machine's stale parts, "
                             f"each within --budget (default {PLAN_BUDGET_S} s)")
    args = parser.parse_args(argv)
    if args.add_times:
        try:
            lines = add_times([json.loads(path.read_text()) for path in args.add_times])
        except (OSError, ValueError) as err:
            parser.error(f"--add-times: {err}")
        print("\n".join(lines))
        return 0
    try:
        known = parts(args.machine)
        if args.merge:
            print(merge(args.machine, args.merge, args.out))
            return 0
        if args.take:
            print("\n".join(take(args.machine, args.take)))
            return 0
        selected = chosen(args.run, known) if args.run else {}
    except ValueError as err:
        parser.error(str(err))
    if args.plan:
        budget = PLAN_BUDGET_S if args.budget is None else args.budget
        if not budget > 0:
            parser.error(f"--budget {args.budget}: a plan's calls need a budget above 0 seconds")
        print_plan(args.machine, known, budget)
        return 0
    names = list(selected)
    timed = times(args.machine)
    adopted = ADOPT.get(args.machine, {})
    there = {source: times(source) for source in set(adopted.values())}
    elsewhere = {name: there[source][name] for name, source in adopted.items()
                 if name in known and name not in timed and name in there[source]}
    if args.list or not names:
        for name, recorded in known.items():
            when = (took(timed[name]) if name in timed else
                    f"not timed here; {took(elsewhere[name])}" if name in elsewhere else
                    "not timed yet")
            print(f"{name} ({when}): {shlex.join(command(name, recorded, args.out))}")
        return 0
    here, gpus = gpu_here(), recorded_gpus(args.machine)
    if here not in gpus:
        parser.error(f"--machine {args.machine}: its results were recorded on "
                     f"{', '.join(sorted(gpus))}; this machine's GPU is {here or 'none'}: "
                     "record them there")
    if args.pack is not None and (not args.pack.resolve().parent.is_dir() or args.pack.is_dir()
                                  or args.pack.resolve().is_relative_to(args.out.resolve())):
        parser.error(f"--pack {args.pack}: must be a file in a folder that exists, outside "
                     f"--out {args.out}")
    durations = ({p["name"]: p["seconds"] for p in json.loads(args.durations.read_text())[
        "parts"]} if args.durations else {name: t["seconds"]
                                         for name, t in (elsewhere | timed).items()})
    env = dict(os.environ)
    if args.gpu_checks is not None:
        env["KVLAB_GPU_CHECKS"] = args.gpu_checks.read_text().strip()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        code = git_state()
    except ValueError as err:
        parser.error(str(err))
    if code["git_revision"] is None:
        print("rerecord.py: no revision known (no checkout, no KVLAB_GIT_REVISION): this run's "
              "times cannot be kept (--add-times)", file=sys.stderr)
    header = {"machine": args.machine, "gpu": here, "revision": code["git_revision"],
              "dirty": code["git_dirty"], "date": time.strftime("%Y-%m-%d", time.gmtime())}
    save = saver(args.out, args.pack)
    log = {**header, **run(names, selected, args.out, args.budget, durations, env, args.machine,
                           after_part=lambda so_far: save({**header, **so_far}))}
    save(log)
    for p in log["parts"]:
        print(f"{p['name']}: {p['seconds']:.0f} s, exit {p['returncode']}")
    if log["not_run"]:
        print(f"not run (budget): {' '.join(log['not_run'])}")
    return 0 if all(p["returncode"] == 0 for p in log["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
