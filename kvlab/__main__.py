"""Command line: `python -m kvlab bench <name> [--json PATH]`."""

import argparse
import importlib
import json
import sys

BENCHMARKS = {"cache": "kvlab.bench.cache"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="run a benchmark headless and print its report")
    bench.add_argument("name", choices=sorted(BENCHMARKS))
    bench.add_argument("--json", metavar="PATH", help="also write the full result as JSON")
    bench.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args(argv)

    module = importlib.import_module(BENCHMARKS[args.name])
    result = module.run(quick=args.quick)
    result["command"] = "python -m kvlab " + " ".join(sys.argv[1:] if argv is None else argv)
    print(module.report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
