"""Fits the decode-launch model (kvlab.predict) to the H200's recordings and measures its error:
`python benchmarks/predict_fit.py`.

Writes benchmarks/results/cpu/predict.json: the fitted constants, the inputs measured rather
than fitted (kappa from ncu's counters, the copy roofline on each SM count), the held-out
errors and error bands (kvlab.predict.validate), the recorded ranges, and the L2 model's replay
of the paper's H20 launches (kvlab.predict.paper); then docs/predict.md from it
(kvlab.predict.report), whose H20 predictions kvlab.predict.decode_launch makes from the file
just written. CPU only: a second for the fit and the held-out checks, about ten for the
replays.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.bench.env import run_info, write_json  # noqa: E402
from kvlab.predict import fit, paper, recorded, report, validate  # noqa: E402
from kvlab.results import load_result, results_dir  # noqa: E402

JSON = ROOT / "benchmarks" / "results" / "cpu" / "predict.json"  # where kvlab.predict reads it
DOCS = ROOT / "docs" / "predict.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    if results_dir().resolve() != JSON.parents[1].resolve():
        parser.error(f"kvlab reads its results from {results_dir()}, not {JSON.parents[1]}: "
                     "run this from a checkout without kvlab/results_data/")
    found = recorded.recorded(recorded.FITTED)
    if not found:
        parser.error("no attention recordings under benchmarks/results/h200/")
    by_sms, kappa = fit.rooflines_by_sms(), fit.kappa_from_counters()
    all_samples = fit.samples(found, by_sms)
    errors = validate.errors(all_samples, kappa)
    result = {
        "benchmark": "predict_fit", **run_info(),
        "command": " ".join(["python benchmarks/predict_fit.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "recordings": {name: {k: load_result(recorded.MACHINE, name).get(k)
                              for k in ("date", "gpu", "git_revision")}
                       for name in recorded.FITTED + fit.COUNTERS},
        "launches": len(all_samples),
        "kappa": kappa, "rooflines_by_sms": by_sms,
        "fit": {family: f.as_dict() for family, f in fit.fit(all_samples, kappa).items()},
        "errors": errors, "bands": validate.bands(errors),
        "one_model_out_by_model": validate.by_model(all_samples, kappa),
        "ranges": recorded.ranges(found),
    }
    write_json(str(JSON), result, indent=1)  # decode_launch, for the H20, reads the fit here
    result["h20_replay"] = paper.replays()
    result["h200_prefetch_speedups"] = paper.recorded_speedups()
    write_json(str(JSON), result, indent=1)
    DOCS.write_text(report.markdown(result))
    print(DOCS.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
