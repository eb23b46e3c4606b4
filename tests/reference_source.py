"""Reference implementations' own functions, compiled from the files their projects ship, for equality tests.

verl_reference.py and trl_reference.py call verl's and TRL's code as it stands in their files, without
importing the packages around it (verl's imports ray and tensordict; TRL's grpo_trainer.py takes 15 s to
import on two cores). These helpers parse such a file, compile the functions named (or methods of one
class) under the file's own name and line numbers, so a traceback points into the reference, and run them
in a namespace that holds only the names they use: a name left out fails loudly (NameError), never quietly.
"""

import ast
import linecache


def register_source(filename, source):
    """Tracebacks and inspect show `source` for `filename`, a path inside a wheel that is never unpacked."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)


def compile_functions(source, filename, names, namespace, class_name=None):
    """The functions `names`, defined in `source` at top level (or in class `class_name`), run in `namespace`.

    Decorators stay as written (a @staticmethod comes back as a staticmethod object, for a class body).
    """
    tree = ast.parse(source, filename)
    body = tree.body
    if class_name is not None:
        classes = [node for node in body if isinstance(node, ast.ClassDef) and node.name == class_name]
        if not classes:
            raise LookupError(f"{filename} defines no class {class_name}")
        body = classes[0].body
    definitions = {
        node.name: node for node in body if isinstance(node, ast.FunctionDef) and node.name in names
    }
    missing = [name for name in names if name not in definitions]
    if missing:
        raise LookupError(f"{filename} defines no {', '.join(missing)} in {class_name or 'its top level'}")
    module = ast.Module(body=[definitions[name] for name in names], type_ignores=[])
    exec(compile(module, filename, "exec"), namespace)
    return {name: namespace[name] for name in names}


def field_defaults(source, class_name):
    """A dataclass's field names, and the defaults among them that are plain values.

    A field `x: T = 1` or `x: T = field(default=1, ...)` has the default 1; a default_factory, MISSING or
    any expression that is not a literal has no plain default and is left out of the second result.
    """
    classes = [
        node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == class_name
    ]
    if not classes:
        raise LookupError(f"no class {class_name} in the source given")
    names, defaults = [], {}
    for statement in classes[0].body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        name = statement.target.id
        names.append(name)
        value = statement.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
            value = next((keyword.value for keyword in value.keywords if keyword.arg == "default"), None)
        if value is None:
            continue
        try:
            defaults[name] = ast.literal_eval(value)
        except ValueError:
            continue  # MISSING, a call, a name: not a plain value
    return names, defaults
