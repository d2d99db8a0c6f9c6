"""Backfills the component versions of results recorded before results recorded them:
`python benchmarks/manifest.py [--check] [--redo]`.

For each file of benchmarks/results/ without "components", every component's version
(kvlab.components) computed from its files as they were at the file's `git_revision` (`git
cat-file` of `<revision>:<path>`; a file absent there makes the component None: it did not exist,
so it has changed since), written into the file after the git keys with "components_source":
"reconstructed from git at git_revision". A file with no `git_revision` gets "components": null
(its revision is not recorded, so neither is its code). Each file keeps its formatting (its
indent, its key order): the diff only adds keys. A revision that git does not hold is an error.
`--redo` reconstructs again the files reconstructed before, for a table of components changed
since (their versions were of the old table's files).
NOTE: a file recorded on a tree with uncommitted changes (`git_dirty`) gets its revision's
versions: the changes themselves are lost, and `kvlab.results.label` says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.components import COMPONENTS, digest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SOURCE = "reconstructed from git at git_revision"
AFTER = ("git_source", "git_dirty", "git_revision", "date")  # the new keys follow the first found
INDENTS = (2, 1, 4, None)


class GitFiles:
    """Files' bytes at a git revision, from one `git cat-file --batch` process."""

    def __init__(self, root: Path):
        self.root = root
        self.process = subprocess.Popen(["git", "-C", str(root), "cat-file", "--batch"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def has_commit(self, revision: str) -> bool:
        return subprocess.run(["git", "-C", str(self.root), "cat-file", "-e",
                               f"{revision}^{{commit}}"], capture_output=True).returncode == 0

    def read(self, revision: str, path: str) -> bytes | None:
        """The bytes of `path` at `revision`; None where it is absent there."""
        self.process.stdin.write(f"{revision}:{path}\n".encode())
        self.process.stdin.flush()
        header = self.process.stdout.readline().split()
        if header[-1] == b"missing":
            return None
        data = self.process.stdout.read(int(header[2]) + 1)  # the bytes and a newline
        return data[:-1]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def reconstructed(git: GitFiles, revision: str) -> dict[str, str | None]:
    """Every component's version at `revision`. Raises ValueError naming `revision` where git
    does not hold it."""
    if not git.has_commit(revision):
        raise ValueError(f"git_revision={revision!r}: not a commit of this repository")
    return {name: digest((path, git.read(revision, path)) for path in paths)
            for name, paths in COMPONENTS.items()}


def formatting(text: str, result: dict) -> tuple[int | None, str]:
    """(indent, ending) with which `json.dumps` writes `text` back byte for byte. Raises
    ValueError where none does: the file would not keep its formatting."""
    for indent in INDENTS:
        body = json.dumps(result, indent=indent)
        for ending in ("\n", ""):
            if body + ending == text:
                return indent, ending
    raise ValueError(f"{text[:40]!r}...: json.dumps writes it back with no indent of {INDENTS}")


def with_components(result: dict, versions: dict | None) -> dict:
    """`result` with "components" (and, where `versions` is not None, "components_source")
    after the first key of AFTER it has, its other keys in their order."""
    anchor = next(k for k in (*AFTER, next(iter(result))) if k in result)
    added = {"components": versions} | ({"components_source": SOURCE} if versions else {})
    out = {}
    for key, value in result.items():
        out[key] = value
        if key == anchor:
            out.update(added)
    return out


def backfill(path: Path, git: GitFiles, write: bool, redo: bool = False) -> bool:
    """Add the components to the result at `path` where it lacks them, or (`redo`) where they
    were reconstructed before, writing it if `write`; whether it did (or would)."""
    text = path.read_text()
    result = json.loads(text)
    again = redo and result.get("components_source") == SOURCE
    if "components" in result and not again:
        return False
    indent, ending = formatting(text, result)
    result = {k: v for k, v in result.items() if k not in ("components", "components_source")}
    revision = result.get("git_revision")
    versions = reconstructed(git, revision) if revision else None
    if write:
        path.write_text(json.dumps(with_components(result, versions), indent=indent) + ending)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail if a result lacks its components")
    parser.add_argument("--redo", action="store_true",
                        help="reconstruct again the components reconstructed before")
    args = parser.parse_args(argv)
    git = GitFiles(ROOT)
    try:
        lacking = [p for p in sorted(RESULTS.glob("*/*.json"))
                   if backfill(p, git, write=not args.check, redo=args.redo)]
    finally:
        git.close()
    for path in lacking:
        done = "lacks" if args.check else "reconstructed" if args.redo else "backfilled"
        print(f"{done} {path.relative_to(RESULTS)}")
    return 1 if args.check and lacking else 0


if __name__ == "__main__":
    sys.exit(main())
