"""kvlab's floors: every module imports from its own floor or the floors below it, never from one
above (imports inside functions count too). Read with ast: nothing is imported. Imports made by
importlib from a name in a string are not read."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvlab"

# The floors, bottom to top: each room (a module or subpackage directly under kvlab/) on one.
FLOORS = [
    ("checks", "arith", "components"),  # the leaves: import nothing of kvlab
    ("config", "results", "timing", "workload", "gpus", "device"),
    ("cache", "reference"),  # the paged cache, and the oracle that reads it
    ("kernels",),
    ("model",),  # the decoder layer
    ("offload", "profile", "sim"),
    ("engine", "predict"),
    ("bench", "viz"),
    ("panels",),
    ("__init__", "__main__"),  # the package's face (its lazy names reach every room); the CLI
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS, start=1) for room in rooms}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    """kvlab.cache.block_pool -> "cache"; kvlab -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def rooms() -> set[str]:
    return {room(module_name(path)) for path in PACKAGE.rglob("*.py")}


def face() -> dict[str, str]:
    """The module that `kvlab.NAME` reaches, for each NAME of kvlab/__init__.py that is not a
    room: the names it imports, and those of its lazy table. The names it defines itself (its
    version) reach no room."""
    reach = {}
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.ImportFrom):
            reach.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_LAZY":
            reach.update({name: module
                          for name, (module, _) in ast.literal_eval(node.value).items()})
    return reach


def through_package(name: str, all_rooms: set[str], names: dict[str, str]) -> str | None:
    """The module that `kvlab.NAME` (or `from kvlab import NAME`) reaches, or None."""
    if name in all_rooms:
        return f"kvlab.{name}"
    return names.get(name)


def imports(path: Path, all_rooms: set[str], names: dict[str, str]):
    """(line, module) for each kvlab module that the file imports, wherever the import stands.
    A bare `import kvlab` reaches what the file then reads through it (`kvlab.LLM`)."""
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    bare = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "kvlab" and alias.asname is None:
                    bare = True
                elif alias.name.split(".")[0] == "kvlab":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *filter(None, [base])])
            if base == "kvlab":
                for alias in node.names:
                    module = through_package(alias.name, all_rooms, names)
                    if module:
                        yield node.lineno, module
            elif base.split(".")[0] == "kvlab":
                yield node.lineno, base
    if bare:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "kvlab"):
                module = through_package(node.attr, all_rooms, names)
                if module:
                    yield node.lineno, module


def climbs() -> list[str]:
    """Every import from a floor above the importing module's, as 'file:line imports module'."""
    all_rooms, names, found = rooms(), face(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = room(module_name(path))
        for line, module in imports(path, all_rooms, names):
            there = room(module)
            if FLOOR[there] > FLOOR[here]:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}: {here} is on "
                             f"floor {FLOOR[here]}, {there} on floor {FLOOR[there]}")
    return found


def test_every_room_stands_on_one_floor():
    placed = [name for floor in FLOORS for name in floor]
    assert len(placed) == len(set(placed)), "a room on two floors"
    assert set(placed) == rooms(), (f"rooms on no floor: {sorted(rooms() - set(placed))}; "
                                    f"floors naming no room: {sorted(set(placed) - rooms())}")


def test_no_module_imports_from_a_floor_above_its_own():
    found = climbs()
    assert not found, "imports that climb:\n" + "\n".join(found)
