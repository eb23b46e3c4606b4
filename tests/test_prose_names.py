"""Names the prose points at exist: every `name.py` that the package's docstrings and comments, the
README and docs/ mention is a file of the repository (a path, `verifier/answers/parse.py`, must be the
end of a real path), and every backticked `module.name` whose module is one of the package's is
something that module defines or imports (`minigrpo.name`: something the package hands out). Prose
left behind by a move is what this catches; docs/walkthrough.md's own test holds its quoted code to
the same rule, line by line."""

import ast
import functools
import glob
import os
import re

import minigrpo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Files of other projects the prose names on purpose: verl's trainer code, which the objectives match.
ELSEWHERE = {"core_algos.py"}
# `module.name` whose name is a file's extension (`metrics.jsonl`, `trace.html`), not an attribute.
EXTENSIONS = {"py", "html", "jsonl", "md", "jinja", "json", "png", "txt", "safetensors", "pt", "yaml"}


@functools.cache
def repository_files() -> list[str]:
    """Every .py file's path from the repository's root, with '/' between folders."""
    paths = glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
    return [os.path.relpath(path, ROOT).replace(os.sep, "/") for path in paths]


@functools.cache
def package_prose() -> dict[str, str]:
    """file -> its prose: a module's docstrings and comments; the README's and docs/' whole text."""
    prose = {}
    for path in glob.glob(os.path.join(ROOT, "minigrpo", "**", "*.py"), recursive=True):
        source = open(path, encoding="utf-8").read()
        parts = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                parts.append(ast.get_docstring(node, clean=False) or "")
        parts += [line[line.index("#") :] for line in source.splitlines() if "#" in line]
        prose[os.path.relpath(path, ROOT)] = "\n".join(parts)
    for path in [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
        prose[os.path.relpath(path, ROOT)] = open(path, encoding="utf-8").read()
    return prose


@functools.cache
def module_definitions() -> dict[str, set[str]]:
    """A module's short name (a file's, or a folder's for its door) -> the names its files define or
    import, over every module of the package of that short name."""
    names = {}
    for path in glob.glob(os.path.join(ROOT, "minigrpo", "**", "*.py"), recursive=True):
        short = os.path.basename(path)[: -len(".py")]
        if short == "__init__":
            short = os.path.basename(os.path.dirname(path))
        bound = names.setdefault(short, set())
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                bound.add(node.name)
            elif isinstance(node, ast.Assign):
                bound |= {target.id for target in node.targets if isinstance(target, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bound.add(node.target.id)
            elif isinstance(node, ast.ImportFrom):
                bound |= {alias.asname or alias.name for alias in node.names}
    return names


def missing_files(prose: dict[str, str], files: list[str]) -> list[str]:
    """`where: name.py` for each file the prose names that no repository path ends with."""
    missing = []
    for where, text in prose.items():
        for match in re.finditer(r"(?<![\w/.-])([A-Za-z_][\w/]*\.py)\b", text):
            named = match.group(1)
            ends = any(path == named or path.endswith("/" + named) for path in files)
            if not ends and os.path.basename(named) not in ELSEWHERE:
                missing.append(f"{where}: {named}")
    return sorted(set(missing))


def missing_names(prose: dict[str, str], definitions: dict[str, set[str]]) -> list[str]:
    """`where: module.name` for each backticked module.name, of a module of the package, that it does
    not define or import."""
    missing = []
    for where, text in prose.items():
        for match in re.finditer(r"`([a-z_]+)\.([A-Za-z_]\w*)(?:\(\))?`", text):
            module, name = match.groups()
            if name in EXTENSIONS:
                continue
            if module == "minigrpo":  # the package's names are imported on first use (its __getattr__)
                known = hasattr(minigrpo, name)
            else:
                known = module not in definitions or name in definitions[module]
            if not known:
                missing.append(f"{where}: {module}.{name}")
    return sorted(set(missing))


def test_every_file_the_prose_names_exists():
    assert missing_files(package_prose(), repository_files()) == []


def test_every_module_name_the_prose_names_is_defined_there():
    assert missing_names(package_prose(), module_definitions()) == []


def test_a_stale_name_is_caught():
    """The checks can fail: a file moved away, and a function renamed."""
    prose = {"run/x.py": "see `trainer.no_such_method` and verifier/sandbox.py, and run/trainer.py"}
    files = repository_files()
    assert missing_files(prose, files) == ["run/x.py: verifier/sandbox.py"]
    assert missing_names(prose, module_definitions()) == ["run/x.py: trainer.no_such_method"]
