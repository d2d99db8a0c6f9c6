"""Every figure in the docs comes from the recorded results. Run

    python benchmarks/docgen.py            # rewrite every generated block in place
    python benchmarks/docgen.py --check    # list what is stale or unchecked; exit 1 if any

over README.md, benchmarks/README.md and docs/**/*.md. Three kinds of text hold a number:
- a generated block, `<!-- docgen: NAME -->...<!-- /docgen -->`, whose content is what
  `figures.blocks()[NAME]` makes now (a table on lines of its own, or a figure inside a sentence);
- a history block, `<!-- history -->` ... `<!-- /history -->` on lines of their own (a kernel's
  versions and dead ends), where every line holding a measured figure cites the git revision it was
  measured at;
- a fact of a paper, a spec or a target, listed with its source in `figures.facts.FACTS`.
A measured figure anywhere else (a ratio, a percentage, a time, a rate, "N of M") is an error, so
a figure typed into the prose cannot drift from the data.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from figures import blocks  # noqa: E402
from figures.facts import FACTS  # noqa: E402

BLOCK = re.compile(r"(<!-- docgen: ([\w.-]+) -->)(.*?)(<!-- /docgen -->)", re.DOTALL)
HISTORY = re.compile(r"^<!-- history -->\n(.*?)^<!-- /history -->$", re.DOTALL | re.MULTILINE)
# What is not prose: fenced code, inline code, comments, link targets and bare addresses.
NOT_PROSE = re.compile(r"```.*?```|`[^`\n]*`|<!--.*?-->|\]\([^)]*\)|https?://\S+", re.DOTALL)
NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNIT = r"(?:x|×|%|ms|µs|us|ns|s|GB/s|TB/s|GiB/s|tokens/s|points?)"
# A measured figure: a number or a range with a unit, "N of M", or a bare decimal ("16 x 1k" is
# a shape, not a ratio; "Table 5.2" and "arXiv 2504.06319" are names).
FIGURE = re.compile(
    rf"(?<![\w.@/-])(?:{NUMBER}(?:\s?(?:-|–|to)\s?{NUMBER})?\s?{UNIT}(?![\w/])(?!\s\d)"
    rf"|\d+ of \d+\b|(?<!Table )(?<!arXiv )\d+\.\d+(?![\w.]))")
REVISION = re.compile(r"\b[0-9a-f]{7,40}\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def doc_files() -> list[Path]:
    """The Markdown files whose figures are checked."""
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").rglob("*.md"))]


def render(made) -> str:
    """A block's content: a list of lines on lines of their own, a string inline."""
    return "\n" + "\n".join(made) + "\n" if isinstance(made, list) else made


def generate(text: str, made: dict) -> str:
    """`text` with every generated block's content replaced by what `made` holds for it."""
    return BLOCK.sub(lambda m: m[1] + made[m[2]] + m[4], text)


def unchecked_figures(text: str) -> list[str]:
    """The measured figures of `text` outside generated and history blocks that are no fact."""
    prose = NOT_PROSE.sub(" ", HISTORY.sub(" ", BLOCK.sub(" ", text)))
    found = (m[0] for m in FIGURE.finditer(prose))
    return [figure for figure in found if " ".join(figure.split()) not in FACTS]


def _is_commit(revision: str) -> bool:
    out = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"],
                         capture_output=True)
    return out.returncode == 0


def undated_history(text: str, check_git: bool = True) -> list[str]:
    """The lines of `text`'s history blocks that hold a measured figure but cite no revision (or,
    with `check_git`, one that is not a commit of this repository)."""
    bad = []
    for block in HISTORY.findall(text):
        for line in block.splitlines():
            if not FIGURE.search(NOT_PROSE.sub(" ", line)):
                continue
            revisions = REVISION.findall(line)
            if not revisions or (check_git and not any(map(_is_commit, revisions))):
                bad.append(line)
    return bad


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(path: Path, text: str) -> list[str]:
    """The relative links of `text` (a file at `path`) to a file or heading that does not exist."""
    bad = []
    for target in LINK.findall(NOT_PROSE.sub(lambda m: " " if m[0].startswith("`") else m[0],
                                             text)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            bad.append(target)
        elif fragment and linked.suffix == ".md" and fragment not in {
                anchor(h) for h in HEADING.findall(linked.read_text())}:
            bad.append(target)
    return bad


def problems(files=None, check_git: bool = True) -> list[str]:
    """Everything wrong with the docs, one message each: stale or unknown blocks, blocks no page
    shows, unchecked figures, undated history, broken relative links."""
    makers = blocks()
    made = {name: render(make()) for name, make in makers.items()}
    found, shown = [], set()
    for path in files or doc_files():
        text = path.read_text()
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for m in BLOCK.finditer(text):
            shown.add(m[2])
            if m[2] not in made:
                found.append(f"{where}: unknown block {m[2]!r}")
            elif m[3] != made[m[2]]:
                found.append(f"{where}: block {m[2]!r} is stale (python benchmarks/docgen.py)")
        found += [f"{where}: unchecked figure {f!r}" for f in unchecked_figures(text)]
        found += [f"{where}: history line without a revision: {line.strip()[:80]!r}"
                  for line in undated_history(text, check_git)]
        found += [f"{where}: broken link {target!r}" for target in broken_links(path, text)]
    if files is None:
        found += [f"block {name!r} is shown on no page" for name in sorted(set(made) - shown)]
    return found


def write() -> list[Path]:
    """Rewrite every generated block in place; returns the files that changed."""
    made = {name: render(make()) for name, make in blocks().items()}
    changed = []
    for path in doc_files():
        text = path.read_text()
        unknown = {m[2] for m in BLOCK.finditer(text)} - set(made)
        if unknown:
            raise ValueError(f"{path.relative_to(ROOT)}: unknown blocks {sorted(unknown)}")
        new = generate(text, made)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="list stale blocks and unchecked figures; exit 1 if any")
    args = parser.parse_args(argv)
    if not args.check:
        for path in write():
            print(f"wrote {path.relative_to(ROOT)}")
    found = problems()
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
