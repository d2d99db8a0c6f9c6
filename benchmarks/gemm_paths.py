"""Which of torch's BLAS paths runs a decode step's linears faster, and whether the residual can
ride in the down projection's GEMM: `python benchmarks/gemm_paths.py [--models llama3-8b ...]
[--rows 16 64 128] [--layers 8] [--runs 21] [--json PATH]` (a GPU).

For each model, each of the engine's four layer linears (`linears`: QKV, W_O, gate+up, down,
with their biases where the family has them) at each row count (the batch of a decode step)
runs in bf16 on `--layers` copies of its weight (each layer its own, as in a step: none of them
is in L2 from the one before), in each of its `variants`: `torch.nn.functional.linear` with
`torch.backends.cuda.preferred_blas_library` set to "cublas" or "cublaslt" before the warm-up
and the capture; and, for the down projection (without a bias), its residual added as the
engine adds it beyond layer_ops' rows ("+add": the GEMM, then an add kernel) or by the GEMM
itself ("+addmm_": the residual updated in place, beta 1), under each path. Each variant is
captured in one CUDA graph and the graphs are timed in turn (kvlab.timing.Timer: L2 flushed by
a read, median of --runs); each time is set against the bytes the variant must move (weights,
bias, input and output, and the residual it reads) at the copy roofline measured in the same
run. Each variant's output, run once outside the graphs on the inputs as they were before any
run, is compared with cuBLAS's of the same sum (F.linear's; "+add"'s for both residual forms).
Prints one JSON line per point and writes them all, with the run's provenance, to --json where
given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.config import MODELS  # noqa: E402

PATHS = ("cublas", "cublaslt")  # torch.backends.cuda.preferred_blas_library's choices
RESIDUAL = ("down",)  # the linear whose output the engine adds to the residual by a kernel of
# its own beyond layer_ops.LINEAR_ROWS rows (W_O's residual rides in add_norm)
DEFAULT_MODELS = ("llama3-8b", "qwen2.5-7b", "llama2-7b", "qwen2.5-14b")


def linears(name: str) -> dict[str, tuple[int, int, bool]]:
    """{linear: (in_features, out_features, has_bias)} of one layer of model `name`, read off
    the engine's own weights (kvlab.model.weights on the meta device: shapes, no data), stacked
    as the engine runs them: QKV, W_O, gate+up ("up" alone in a family without a gate: OPT),
    down."""
    import torch

    from kvlab.model.weights import LayerWeights, fuse

    w = LayerWeights.random(MODELS[name], 0, torch.bfloat16, "meta")
    fused = fuse(w)
    mlp_in = ("up", w.w_up, w.b_up) if fused.gate_up is None else ("gate_up", fused.gate_up, None)
    found = {"qkv": (fused.qkv, fused.b_qkv), "o": (w.attn.w_o, w.b_o),
             mlp_in[0]: mlp_in[1:], "down": (w.w_down, w.b_down)}
    return {key: (weight.shape[1], weight.shape[0], bias is not None)
            for key, (weight, bias) in found.items()}


def variants(linear: str, bias: bool) -> dict[str, tuple[str, str]]:
    """{variant: (BLAS path, form)} timed for `linear`: each path's "linear"
    (F.linear); for the down projection without a bias, also its "add" (F.linear, then
    residual + its output) and its "addmm_" (residual.addmm_: the GEMM adds it, beta 1)."""
    forms = ("linear", "add", "addmm_") if linear in RESIDUAL and not bias else ("linear",)
    return {path + ("" if form == "linear" else f"+{form}"): (path, form)
            for form in forms for path in PATHS}


def apply(torch, form: str, x, weight, bias, residual):
    """One layer's linear in `form` (`variants`)."""
    if form == "addmm_":
        return residual.addmm_(x, weight.t())
    y = torch.nn.functional.linear(x, weight, bias)
    return y if form == "linear" else residual + y


def linear_bytes(k: int, n: int, bias: bool, rows: int, layers: int,
                 residual: bool = False) -> int:
    """Bytes a bf16 linear reads and writes over `layers` copies: weight, bias, input, output,
    and with `residual` the residual it adds."""
    return layers * (n * k + (n if bias else 0) + rows * (n + k + (n if residual else 0))) * 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked: ValueError naming the option, the value and what is allowed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=[16, 64, 128])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise ValueError(f"--models {' '.join(unknown)}: not a preset; one of {sorted(MODELS)}")
    for option, values in (("--rows", args.rows), ("--layers", [args.layers]),
                           ("--runs", [args.runs])):
        if any(v < 1 for v in values):
            raise ValueError(f"{option} {' '.join(map(str, values))}: each must be >= 1")
    return args


def time_point(torch, timer, x, weights, biases, residuals,
               chosen: dict[str, tuple[str, str]]) -> tuple[dict[str, float], dict[str, float]]:
    """({variant: median ms of the graph of every layer's linear}, {variant: the largest
    difference of its output from cuBLAS's of the same sum ("+addmm_" from "cublas+add"), on
    the first layer, outside the graphs, from the residual as it was before any run: the
    "+addmm_" graphs add into theirs at every replay}) for the variants `chosen`
    (`variants`)."""
    residual = residuals[0].clone()
    graphs = {}
    for variant, (path, form) in chosen.items():
        torch.backends.cuda.preferred_blas_library(path)  # read when each GEMM is enqueued

        def step(form=form):
            for w, b, r in zip(weights, biases, residuals, strict=True):
                apply(torch, form, x, w, b, r)

        side = torch.cuda.Stream()  # warm-up off the capture stream, as torch's docs ask
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graphs[variant] = graph
    ms = timer.medians_ms({variant: graph.replay for variant, graph in graphs.items()})
    return ms, differences(torch, chosen, x, weights[0], biases[0], residual,
                           torch.backends.cuda.preferred_blas_library)


def differences(torch, chosen: dict[str, tuple[str, str]], x, weight, bias, residual,
                prefer) -> dict[str, float]:
    """{variant: the largest difference of its output from cuBLAS's of the same sum ("+addmm_"
    from "cublas+add")} for one layer, each variant run once with prefer(its path) (the BLAS
    preference's setter) on a copy of `residual`, which stays as it is."""
    outputs = {}
    for variant, (path, form) in chosen.items():
        prefer(path)
        outputs[variant] = apply(torch, form, x, weight, bias, residual.clone()).float()
    reference = {form: outputs[variant] for variant, (path, form) in chosen.items()
                 if path == PATHS[0] and form != "addmm_"}
    reference["addmm_"] = reference.get("add")
    return {variant: (outputs[variant] - reference[form]).abs().max().item()
            for variant, (_, form) in chosen.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from kvlab.bench.env import gpu_info, run_info, write_json
    from kvlab.timing import Timer, copy_roofline_gbps

    if not torch.cuda.is_available():
        raise SystemExit("gemm_paths.py times cuBLAS on a GPU: torch sees none here")
    device = torch.device("cuda")
    timer = Timer(device, num_runs=args.runs)
    roofline_gbps = copy_roofline_gbps(timer)
    preferred = torch.backends.cuda.preferred_blas_library()  # restored at the end
    result = {"benchmark": "gemm_paths", **run_info(), **gpu_info(),
              "command": "python benchmarks/gemm_paths.py " + " ".join(sys.argv[1:]),
              "layers": args.layers, "roofline_copy_gbps": roofline_gbps, "rows": []}
    try:
        for name in args.models:
            for linear, (k, n, bias) in linears(name).items():
                weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
                           for _ in range(args.layers)]
                biases = [torch.randn(n, device=device, dtype=torch.bfloat16) if bias else None
                          for _ in range(args.layers)]
                chosen = variants(linear, bias)
                for rows in args.rows:
                    x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
                    residuals = [torch.randn(rows, n, device=device, dtype=torch.bfloat16)
                                 for _ in range(args.layers)]
                    ms, diff = time_point(torch, timer, x, weights, biases, residuals, chosen)
                    floor_ms = {v: linear_bytes(k, n, bias, rows, args.layers, form != "linear")
                                / roofline_gbps / 1e6 for v, (_, form) in chosen.items()}
                    row = {"model": name, "linear": linear, "num_rows": rows, "k": k, "n": n,
                           "us_per_layer": {v: t * 1e3 / args.layers for v, t in ms.items()},
                           "over_bytes": {v: t / floor_ms[v] for v, t in ms.items()},
                           "max_abs_diff": diff}
                    print(json.dumps(row), flush=True)
                    result["rows"].append(row)
                del weights, biases
                torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.preferred_blas_library(preferred)
    if args.json is not None:
        write_json(args.json, result, indent=1)


if __name__ == "__main__":
    main()
