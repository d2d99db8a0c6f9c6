"""Command line: `python -m kvlab bench <name> [options] [--json PATH]`."""

import argparse
import importlib
import json
import sys

BENCHMARKS = {"cache": "kvlab.bench.cache", "attention": "kvlab.bench.attention",
              "kvpr": "kvlab.bench.kvpr"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m kvlab")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="run a benchmark headless and print its report")
    names = bench.add_subparsers(dest="name", required=True)
    for name, module_name in BENCHMARKS.items():
        sub = names.add_parser(name, help=f"see {module_name}")
        sub.add_argument("--json", metavar="PATH", help="also write the full result as JSON")
        sub.set_defaults(module=module_name)
        # NOTE: the options are added lazily only for the chosen benchmark (heavy imports).
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(args.module)
    sub = argparse.ArgumentParser(prog=f"python -m kvlab bench {args.name}")
    module.add_arguments(sub)
    options = sub.parse_args(rest)
    options.command = "python -m kvlab " + " ".join(argv)  # for results written as they run

    result = module.run(options)
    result["command"] = options.command
    print(module.report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
