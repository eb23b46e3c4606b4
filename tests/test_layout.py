"""The package's structure, as README's layout table describes it: one folder per part of the loop, each
entered through its `__init__.py` (nothing outside a folder imports one of its inner modules), the
settings and helpers beneath every stage at the top, one direction of imports between folders and no
import cycle between modules (type-only imports count). Imports are read from the source with ast, so
nothing of the package is run. `python tests/test_layout.py` prints each room's floor.

A room is a folder (model/, rollout/, ...) or a module at the top of the package (config.py, ...). A
room stands one floor above the highest room it imports; the settings stand on the ground floor."""

import ast
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Outside the package, the code a user reads and runs: it too enters a folder through its door.
READERS = ("examples",)


def modules(root: str = ROOT) -> dict[str, str]:
    """Each module's dotted name -> its path (minigrpo.config, minigrpo.run.trainer, minigrpo.run, ...)."""
    found = {}
    for folder, _, files in os.walk(os.path.join(root, "minigrpo")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def room(module: str) -> str:
    """A module's room: its folder (minigrpo.run for minigrpo.run.trainer), or itself at the top."""
    return ".".join(module.split(".")[:2])


def is_folder(name: str, known: set[str]) -> bool:
    return any(other.startswith(name + ".") for other in known)


def imports(module: str, path: str, known: set[str], root: str = ROOT) -> set[str]:
    """The package's modules `module` imports anywhere in its source (under TYPE_CHECKING too). `from
    .rollout import generate` imports the folder's door, minigrpo.rollout; `from . import checkpoint`
    imports the module minigrpo.run.checkpoint."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(
                    parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                target = node.module or ""
            public = exported(target, known, root)
            inner = [f"{target}.{alias.name}" for alias in node.names if alias.name not in public]
            own_modules = target == package and all(name in known for name in inner)
            # `from . import sandbox` inside a folder imports that module, not the folder's door
            names = inner if own_modules else [target] + inner
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        out |= {name for name in names if name in known}
    return out - {module}


def exported(package: str, known: set[str], root: str = ROOT) -> set[str]:
    """The names a folder's __init__ lists in __all__: `from .update import token_logprobs` takes the
    function its door exports, not a module of that name behind it."""
    init = os.path.join(root, *package.split("."), "__init__.py")
    if package not in known or not os.path.isfile(init):
        return set()
    for node in ast.parse(open(init, encoding="utf-8").read()).body:
        names_all = any(getattr(t, "id", "") == "__all__" for t in getattr(node, "targets", []))
        if names_all and isinstance(node.value, ast.List):  # (the package's own is computed: no list)
            return set(ast.literal_eval(node.value))
    return set()


def module_graph(root: str = ROOT) -> dict[str, set[str]]:
    """module -> the modules it imports. The package's lazy front door (minigrpo/__init__.py) names
    every room on first use and imports none, so it is left out."""
    found = modules(root)
    known = set(found)
    return {m: imports(m, p, known, root) - {"minigrpo"} for m, p in found.items() if m != "minigrpo"}


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """room -> the rooms it imports (itself left out)."""
    rooms = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update({room(t) for t in targets} - {room(module)})
    return rooms


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each node's floor: 1 for one that imports none, else one above the highest it imports; a cycle
    is an AssertionError naming it."""
    floor = {}

    def place(name: str, path: tuple[str, ...]) -> int:
        assert name not in path, "import cycle: " + " -> ".join(path + (name,))
        if name not in floor:
            floor[name] = 1 + max((place(t, path + (name,)) for t in graph[name]), default=0)
        return floor[name]

    for name in graph:
        place(name, ())
    return floor


def reaching_in(root: str = ROOT) -> list[str]:
    """Every import of a folder's inner module from outside that folder: from another room of the
    package, or from the examples."""
    found = modules(root)
    known = set(found)
    readers = dict(found)
    for folder in READERS:
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if name.endswith(".py"):
                readers[f"{folder}.{name[:-3]}"] = os.path.join(root, folder, name)
    out = []
    for module, path in readers.items():
        for target in sorted(imports(module, path, known, root)):
            outside = [
                f for f in enclosing_folders(target, known) if module != f and not module.startswith(f + ".")
            ]
            if outside:
                out.append(f"{module} imports {target}")
    return out


def enclosing_folders(module: str, known: set[str]) -> list[str]:
    """The folders below the package that `module` sits inside, outermost first: minigrpo.verifier and
    minigrpo.verifier.answers for minigrpo.verifier.answers.parse (a wing is a folder with a door too)."""
    parts = module.split(".")
    prefixes = [".".join(parts[:i]) for i in range(2, len(parts))]
    return [prefix for prefix in prefixes if is_folder(prefix, known)]


def test_the_settings_stand_on_the_ground_floor():
    graph = room_graph(module_graph())
    assert not graph["minigrpo.config"]
    assert floors(graph)["minigrpo.config"] == 1


def test_no_import_cycle_between_modules_or_between_rooms():
    """floors() raises on a cycle; rooms in one direction means no folder imports one that imports it."""
    graph = module_graph()
    floors(graph)
    floors(room_graph(graph))


def test_nothing_outside_a_folder_imports_its_inner_modules():
    assert reaching_in() == []


def test_every_folder_lists_its_public_names_and_defines_them():
    """Each folder's door has an __all__ (a list, read by exported()), and every name in it is defined
    or imported there (or, for the verifier's sympy-backed names, loaded on first use)."""
    found = modules()
    for folder in sorted(m for m in found if is_folder(m, set(found)) and m != "minigrpo"):
        listed = exported(folder, set(found))
        assert listed, f"{folder}/__init__.py has no __all__ list"
        tree = ast.parse(open(found[folder], encoding="utf-8").read())
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                bound |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.ClassDef | ast.FunctionDef):
                bound.add(node.name)
            elif isinstance(node, ast.Assign):
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Dict):  # the math wing's ON_FIRST_USE
                bound |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        if "__getattr__" in bound:  # a door that hands on its inner doors' names loaded on first use
            for inner in sorted(m for m in found if m.startswith(folder + ".") and is_folder(m, set(found))):
                for node in ast.walk(ast.parse(open(found[inner], encoding="utf-8").read())):
                    if isinstance(node, ast.Dict):
                        bound |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        assert listed <= bound, f"{folder}: __all__ names {sorted(listed - bound)}, which it does not define"


def test_every_public_name_a_folder_imports_is_listed():
    """The other way round: a public name a door imports from its own modules (or defines) is in its
    __all__, so that exported() reads a door's public names whole and `import *` takes them all."""
    found = modules()
    for folder in sorted(m for m in found if is_folder(m, set(found)) and m != "minigrpo"):
        listed = exported(folder, set(found))
        bound = set()
        for node in ast.parse(open(found[folder], encoding="utf-8").read()).body:
            if isinstance(node, ast.ImportFrom) and node.level:
                bound |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.ClassDef | ast.FunctionDef):
                bound.add(node.name)
        public = {name for name in bound if not name.startswith("_")}
        assert public <= listed, f"{folder}: __all__ leaves out {sorted(public - listed)}"


def readme_table(root: str = ROOT) -> list[tuple[int | None, str]]:
    """README's layout table: (floor, path) for each row; a folder's first row carries its floor."""
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    table = readme[readme.index("| floor | path | stage |") :].split("\n\n")[0].splitlines()[2:]
    rows = []
    for row in table:
        floor, path = row.strip("|").split("|")[:2]
        rows.append((int(floor) if floor.strip() else None, re.search(r"`([a-z0-9_/.]+)`", path).group(1)))
    return rows


def test_the_readme_table_is_the_tree_with_its_floors():
    """Every file of the package is a row of the table, in its folder (the verifier's and the tasks'
    files are listed by their doors' docstrings: one row each); each room's floor is as measured."""
    found = modules()
    known = set(found)
    floor = floors(room_graph(module_graph()))
    listed = {}
    for level, path in readme_table():
        dotted = "minigrpo." + path.removesuffix("/").removesuffix(".py").replace("/", ".")
        if level is not None:
            assert floor[room(dotted)] == level, (
                f"README: {path} on floor {level}, measured {floor[room(dotted)]}"
            )
        listed[dotted] = path
    expected = {
        m for m in found if m != "minigrpo" and room(m) not in ("minigrpo.verifier", "minigrpo.tasks")
    }
    expected = {m for m in expected if not (is_folder(m, known) and m != room(m))}
    expected |= {"minigrpo.verifier", "minigrpo.tasks"}
    assert set(listed) == expected


def test_a_planted_inner_import_and_a_planted_cycle_fail_the_checks(tmp_path):
    """The checks above can fail: on a copy of the package, the trainer importing the engine by its
    inner path is named, as are the verifier's top reaching into a wing and the programs wing into its
    sandbox, and so is a cycle made by the settings importing the trainer."""
    shutil.copytree(os.path.join(ROOT, "minigrpo"), tmp_path / "minigrpo")
    os.makedirs(tmp_path / "examples")
    trainer = tmp_path / "minigrpo" / "run" / "trainer.py"
    source = trainer.read_text()
    trainer.write_text(source + "\nfrom ..rollout.engine import Engine  # noqa\n")
    assert reaching_in(str(tmp_path)) == ["minigrpo.run.trainer imports minigrpo.rollout.engine"]
    trainer.write_text(source)
    # inside the verifier: a wing is entered through its door too (the top's rewards.py, the sandbox)
    rewards = tmp_path / "minigrpo" / "verifier" / "rewards.py"
    rewards_source = rewards.read_text()
    rewards.write_text(rewards_source + "\nfrom .answers.parse import parse  # noqa\n")
    assert reaching_in(str(tmp_path)) == ["minigrpo.verifier.rewards imports minigrpo.verifier.answers.parse"]
    rewards.write_text(rewards_source)
    code = tmp_path / "minigrpo" / "verifier" / "programs" / "code.py"
    code.write_text(code.read_text() + "\nfrom .sandbox.mounts import mount  # noqa\n")
    assert reaching_in(str(tmp_path)) == [
        "minigrpo.verifier.programs.code imports minigrpo.verifier.programs.sandbox.mounts"
    ]
    config = tmp_path / "minigrpo" / "config.py"
    config.write_text(config.read_text() + "\nfrom .run import Trainer  # noqa\n")
    graph = module_graph(str(tmp_path))
    for planted in (graph, room_graph(graph)):
        try:
            floors(planted)
        except AssertionError as error:
            assert "import cycle" in str(error) and "minigrpo.config" in str(error)
        else:
            raise AssertionError("a cycle went unseen")


if __name__ == "__main__":
    floor = floors(room_graph(module_graph()))
    for name, level in sorted(floor.items(), key=lambda item: (-item[1], item[0])):
        print(f"floor {level}  {name}")
    sys.exit(0)
