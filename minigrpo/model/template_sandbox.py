"""The sandbox a checkpoint's chat template runs in: chat_template.py compiles and renders templates here.

jinja2's immutable sandbox, configured as transformers' apply_chat_template configures it: trim_blocks and
lstrip_blocks, the loop controls and {% generation %} blocks, `raise_exception`, `strftime_now`, a `dict`
and a `namespace` that change nothing the sandbox keeps, and `tojson` as json.dumps (jinja2's own escapes
HTML characters). A template comes with a downloaded checkpoint and is untrusted input, so, beyond
transformers, each render runs on a `Budget`: the loop iterations and calls it makes, the characters it
writes, the size of a string, list or integer it builds, and a clock set far above what a template that
ends needs. It knows the template language, not conversations.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from contextvars import ContextVar
from datetime import datetime

import jinja2
import jinja2.meta
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

# jinja2 before 3.1.6 lets a template escape the sandbox (GHSA-cpwx-vrp4-4pq7: |attr('format') reads
# os.environ); transformers refuses it too, and setup.py requires it
MIN_JINJA2 = (3, 1, 6)

# One render's budget. A real template makes some ten steps per message (Qwen3's) and writes its conversation
# once or twice, so these leave room for tens of thousands of messages, and stop within seconds a template
# that would never end.
MAX_STEPS = 1_000_000  # loop iterations and calls (every chunk written beyond the source's comes of one)
MAX_CHARS = 4_000_000  # characters written, and the length of any string or list the template builds
MAX_INT_BITS = 100_000  # the largest integer * or ** may build (Python's big integers take seconds)
# the clock: far above what the budget's steps take, it stops a template whose every step is slow; it is
# read every CLOCK_EVERY steps, so a template that ends never depends on the machine's speed
MAX_SECONDS = 10.0
CLOCK_EVERY = 1024


class Refused(Exception):
    """raise_exception(...) in a template: the conversation is one it does not accept."""


class OverBudget(Exception):
    """A render spent its budget; the message says on what (a template that may never end)."""


class Budget:
    """What one render has spent (steps, characters written) and the {% generation %} spans it wrote."""

    def __init__(self):
        self.steps = 0
        self.written = 0  # characters written so far
        self.deadline = time.monotonic() + MAX_SECONDS
        self.spans = []  # (start, end) of the text each {% generation %} block wrote, in order

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            steps = f"more than {MAX_STEPS:,} loop iterations and calls"
            raise OverBudget(f"made {steps} on one conversation: it may never end")
        if self.steps % CLOCK_EVERY == 0 and time.monotonic() > self.deadline:
            raise OverBudget(f"ran longer than {MAX_SECONDS:g} s on one conversation: it may never end")

    def write(self, chunk: str) -> None:
        self.written += len(chunk)
        if self.written > MAX_CHARS:
            raise OverBudget(f"wrote more than {MAX_CHARS:,} characters for one conversation")


_BUDGET: ContextVar[Budget] = ContextVar("chat_template_budget")


def bounded(value):
    """`value`, refused if it is a string, list or mapping longer than MAX_CHARS."""
    if isinstance(value, (str, list, tuple, dict)) and len(value) > MAX_CHARS:
        raise OverBudget(f"built a {type(value).__name__} of {len(value):,} items, more than {MAX_CHARS:,}")
    return value


def _check_product(operator: str, left, right) -> None:
    """Refuse, before it is computed, a `left * right` or `left ** right` too large to build in time."""
    if operator == "*":
        for sequence, times in ((left, right), (right, left)):
            if isinstance(sequence, (str, list, tuple)) and isinstance(times, int):
                if len(sequence) * times > MAX_CHARS:
                    raise OverBudget(f"repeats a {type(sequence).__name__} to more than {MAX_CHARS:,} items")
        bits = left.bit_length() + right.bit_length() if _both_ints(left, right) else 0
    elif _both_ints(left, right) and right > 0 and abs(left) > 1:  # **: at least this many bits
        bits = (abs(left).bit_length() - 1) * right + 1
    else:
        bits = 0
    if bits > MAX_INT_BITS:
        raise OverBudget(f"computes an integer of more than {MAX_INT_BITS:,} bits with {operator}")


def _both_ints(left, right) -> bool:
    return isinstance(left, int) and isinstance(right, int)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox that charges the render's budget for each call, loop iteration and product."""

    intercepted_binops = frozenset({"*", "**"})

    def call(__self, __context, __obj, *args, **kwargs):  # jinja2's argument names
        _BUDGET.get().step()
        if isinstance(__obj, LoopContext) and args:  # loop(children) of a recursive for: iterations too
            args = (__self.iterations(args[0]), *args[1:])
        return bounded(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context, operator, left, right):
        _check_product(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def iterations(self, iterable):
        """`iterable`'s items, each charged as a step: what every {% for %} loops over."""
        budget = _BUDGET.get()
        for item in iterable:
            budget.step()
            yield item


# the filter compile_template puts on every {% for %}'s items; a name no template can spell (a space),
# and a context argument, which keeps jinja2 from calling it when it compiles a loop over constants
ITERATIONS = "charged iterations"


@jinja2.pass_context
def _charged_iterations(context, iterable):
    return context.environment.iterations(iterable)


class _Namespace(Namespace):
    """jinja2's namespace(), as transformers': no attribute whose name starts with an underscore (CPython's
    internals); and its values bounded as a value a template builds."""

    def __init__(*args, **kwargs):  # jinja2's signature, so that namespace(self=...) still works
        self, args = args[0], args[1:]
        attributes = dict(*args, **kwargs)
        for name in attributes:
            _check_attribute(name)
        Namespace.__init__(self, attributes)

    def __setitem__(self, name, value):
        _check_attribute(name)
        Namespace.__setitem__(self, name, bounded(value))


def _check_attribute(name) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace cannot store {name!r}: its name starts with '_'")


class _Dict:
    """transformers' `dict`: dict(...) and dict.fromkeys(...), nothing more; the dict type's own methods
    (dict.update(a_dict, ...)) would change a value the immutable sandbox keeps as it is."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _GenerationBlocks(Extension):
    """{% generation %}...{% endgeneration %}, which TRL's training templates put around what the assistant
    writes: the text as it is, its (start, end) in the render's text recorded in the budget's spans, as
    transformers' AssistantTracker records them (a block inside a macro or a set block is placed where
    the text written so far ends, as there)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    def _generation(self, caller) -> str:
        text = caller()
        budget = _BUDGET.get()
        budget.spans.append((budget.written, budget.written + len(text)))
        return text


def _raise_exception(message: str):
    raise Refused(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    """transformers' tojson: json.dumps with its keywords, no HTML escaping."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """jinja2's lipsum, refused where it would write more words than a render may."""
    if n * max > MAX_CHARS // 4:
        raise OverBudget(f"asks lipsum() for {n:,} paragraphs of up to {max:,} words")
    return generate_lorem_ipsum(n, html, min, max)


def check_jinja2_version() -> None:
    """Refuse, before any template is compiled, a jinja2 whose sandbox a template escapes."""
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", jinja2.__version__)
    installed = tuple(int(n or 0) for n in numbers.groups()) if numbers else (0,)
    if installed < MIN_JINJA2:
        needed = ".".join(map(str, MIN_JINJA2))
        raise ValueError(
            f"rendering a checkpoint's chat template needs jinja2>={needed} (older versions let a template "
            f"escape the sandbox), but jinja2 {jinja2.__version__} is installed: "
            f"pip install -U 'jinja2>={needed}'"
        )


def environment() -> _Sandbox:
    check_jinja2_version()
    extensions = [_GenerationBlocks, "jinja2.ext.loopcontrols"]
    sandbox = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=extensions)
    sandbox.filters["tojson"] = _tojson
    sandbox.globals["raise_exception"] = _raise_exception
    sandbox.globals["strftime_now"] = _strftime_now
    sandbox.globals["lipsum"] = _lipsum
    sandbox.globals["namespace"] = _Namespace
    sandbox.globals["dict"] = _Dict()
    sandbox.filters[ITERATIONS] = _charged_iterations
    return sandbox


def compile_template(source: str) -> tuple[jinja2.Template, frozenset[str]]:
    """The template of `source`, each of its loops charging the budget per item, and the variables it
    reads; jinja2's errors (TemplateSyntaxError, ...) and Python's (RecursionError, ...) pass through."""
    sandbox = environment()
    tree = sandbox.parse(source)
    variables = frozenset(jinja2.meta.find_undeclared_variables(tree))
    for loop in list(tree.find_all(nodes.For)):
        loop.iter = nodes.Filter(loop.iter, ITERATIONS, [], [], None, None, lineno=loop.lineno)
    return sandbox.from_string(tree), variables


def render(template: jinja2.Template, variables: dict, budget: Budget) -> str:
    """The template's text for `variables`, written chunk by chunk so that the budget stops it in time."""
    chunks = []
    with _spending(budget):
        for chunk in template.generate(**variables):
            budget.write(chunk)
            chunks.append(chunk)
    return "".join(chunks)


@contextlib.contextmanager
def _spending(budget: Budget):
    token = _BUDGET.set(budget)
    try:
        yield
    finally:
        _BUDGET.reset(token)
