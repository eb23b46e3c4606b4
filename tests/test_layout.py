"""The package's structure, as README's layout table describes it: settings on the ground floor, every
module one floor above the highest it imports, at most six floors, no import cycle (type-only imports
count), the verifier behind its one door, and no module over 400 lines. Imports are read from the source
with ast, so nothing of the package is run. `python tests/test_layout.py` prints each module's floor."""

import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "minigrpo")
MAX_FLOORS = 6
MAX_LINES = 400


def room(module: str) -> str:
    """A module's room: the verifier and the tasks are one folder each; every other module is its own."""
    return ".".join(module.split(".")[:2])


def modules() -> dict[str, str]:
    """Each module's dotted name -> its path (minigrpo.trainer, minigrpo.verifier.code, ...)."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imported(module: str, path: str, known: set[str]) -> set[str]:
    """The package's modules `module` imports anywhere in its source (under TYPE_CHECKING too)."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            public = exported(target, known)
            names = [target] + [f"{target}.{alias.name}" for alias in node.names if alias.name not in public]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        out |= {name for name in names if name in known}
    return out


def exported(package: str, known: set[str]) -> set[str]:
    """The names a package's __init__ lists in __all__: `from .verifier import normalize` takes the
    function its door exports, not the module of that name behind it."""
    init = os.path.join(ROOT, *package.split("."), "__init__.py")
    if package not in known or not os.path.isfile(init):
        return set()
    for node in ast.parse(open(init, encoding="utf-8").read()).body:
        names_all = any(getattr(t, "id", "") == "__all__" for t in getattr(node, "targets", []))
        if names_all and isinstance(node.value, ast.List):  # (the package's own is computed: no list)
            return set(ast.literal_eval(node.value))
    return set()


def arrows() -> dict[str, set[str]]:
    """room -> the rooms it imports (itself left out)."""
    found = modules()
    graph = {}
    for module, path in found.items():
        if module == "minigrpo":
            continue  # the package's lazy front door names every room on first use, and imports none
        mine = graph.setdefault(room(module), set())
        mine |= {room(target) for target in imported(module, path, set(found))} - {room(module), "minigrpo"}
    return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 for a room that imports none, else one above the highest it imports; a
    cycle is an AssertionError naming it."""
    floor = {}

    def place(name: str, path: tuple[str, ...]) -> int:
        assert name not in path, "import cycle: " + " -> ".join(path + (name,))
        if name not in floor:
            floor[name] = 1 + max((place(t, path + (name,)) for t in graph[name]), default=0)
        return floor[name]

    for name in graph:
        place(name, ())
    return floor


def test_six_floors_with_the_settings_on_the_ground_and_no_cycle():
    floor = floors(arrows())
    assert floor["minigrpo.config"] == 1 and not arrows()["minigrpo.config"]
    assert max(floor.values()) <= MAX_FLOORS, sorted(floor.items(), key=lambda item: -item[1])


def test_nothing_outside_the_verifier_imports_one_of_its_modules():
    found = modules()
    reaching_in = []
    for module, path in found.items():
        if module.startswith("minigrpo.verifier"):
            continue
        inside = {t for t in imported(module, path, set(found)) if t.startswith("minigrpo.verifier.")}
        reaching_in += [f"{module} imports {t}" for t in sorted(inside)]
    assert not reaching_in


def test_no_module_is_over_400_lines():
    long = {}
    for path in modules().values():
        lines = len(open(path, encoding="utf-8").read().splitlines())
        if lines > MAX_LINES:
            long[os.path.relpath(path, ROOT)] = lines
    assert not long


def test_the_readme_table_names_every_module_on_its_floor():
    """README's layout table: a row per module (or folder), its floor as measured here."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    table = readme[readme.index("| floor | module | stage |") :].split("\n\n")[0].splitlines()[2:]
    listed = {}
    for row in table:
        floor, names = row.strip("|").split("|")[:2]
        for name in re.findall(r"`([a-z0-9_]+)(?:\.py|/)`", names):
            listed[f"minigrpo.{name}"] = int(floor)
    assert listed == floors(arrows())


def test_a_planted_cycle_and_a_seventh_floor_are_seen():
    """The checks above can fail: a cycle is named, and a chain of seven rooms stands on seven floors."""
    try:
        floors({"a": {"b"}, "b": {"a"}})
    except AssertionError as error:
        assert "a -> b -> a" in str(error)
    else:
        raise AssertionError("a cycle went unseen")
    chain = {f"m{i}": {f"m{i - 1}"} if i else set() for i in range(7)}
    assert max(floors(chain).values()) == 7


if __name__ == "__main__":
    floor = floors(arrows())
    for name, level in sorted(floor.items(), key=lambda item: (-item[1], item[0])):
        print(f"floor {level}  {name}")
    sys.exit(0)
