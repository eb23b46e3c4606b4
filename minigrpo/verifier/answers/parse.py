"""Stage 2 of the loop, verify: read a normalised answer into a mathematical value.

In: a string from `normalize.canonical`. Out: `Parsed(value, decimals)`, where the value is a sympy
expression or matrix, or one of the structures in `values` (Tuple, Set, Interval, Union, Relation,
Approximation, Text), and `decimals` records how precisely each decimal literal was written. Anything
this cannot read with certainty raises Unsupported: enumerations ("1, 2, \\ldots"), integrals,
derivatives, limits other than a constant's, unknown commands, anything but a written number after
\\approx, sizes past the caps below or in `arithmetic`. The caller then treats the answer
as not understood, which never makes it correct. "3 or 5" and "3, 5" both read as a set of two
values, which never equals one value.

A hand-written recursive-descent parser rather than sympy's LaTeX parser: that one needs
antlr4 or lark (more dependencies), and it cannot check sizes before it computes. This file is
the whole grammar, in two parts: first the atoms (`_Atoms`: numbers, with their decimals recorded,
or a repeating decimal, 0.\\overline{3}, exactly; letters, Greek names and constants; \\frac,
\\sqrt, \\binom, \\sum, the limit of a constant, functions; brackets, sets, absolute values,
rounding and matrices), whose tables and `_Atoms.command` are the whole LaTeX vocabulary (any other
command raises Unsupported); then the tokenizer and the precedence grammar (`_Parser`), loosest
binding first, which calls the atoms at its bottom and which they call back for what they enclose.
It knows notation, not equivalence: comparing two values is `equivalence`'s job.

Departures from Math-Verify (latex2sympy2_extended), where the notation has one school reading:
  - n!! is the double factorial, n (n - 2) (n - 4) ..., so 5!! = 15; Math-Verify reads each ! as a
    factorial, 5!! = (5!)! = 120!; three marks, n!!!, are refused (the triple factorial, or (n!!)!). A
    double factorial of a variable has no value at the sample points' fractions, so (2n)!! is never
    shown equal to 2^n n! (not equal: fail closed);
  - \\sqrt[n]{x} of a negative number x and an odd n is the real root, \\sqrt[3]{-8} = -2; Math-Verify
    takes sympy's principal root, 1 + i\\sqrt{3}, which a power (-8)^{1/3} still is here. A root of an
    expression with a variable keeps the principal branch (see `closed_forms`), as there.
"""

from __future__ import annotations

import re

import sympy

from .arithmetic import (
    PM,
    add,
    as_interval_or_set,
    binomial,
    checked_argument,
    checked_literal,
    contains_pm,
    div,
    double_factorial,
    factorial,
    infinite,
    make_set,
    mul,
    power,
    root,
    scalar,
)
from .values import REAL_LINE, Approximation, Interval, Parsed, Relation, Set, Text, Tuple, Union, Unsupported

# -- the atoms: what sits at the bottom of the grammar ----------------------------------------
MAX_ITEMS = 10_000  # elements of a list, set, tuple or matrix, as written
MAX_NUMBER_CHARS = 4_000  # longest number literal read
MAX_REPEATING_DIGITS = 100  # longest repeating block read: 0.\overline{...} with more digits is refused

_FUNCTIONS = {
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "sec": sympy.sec,
    "csc": sympy.csc,
    "cot": sympy.cot,
    "arcsin": sympy.asin,
    "arccos": sympy.acos,
    "arctan": sympy.atan,
    "sinh": sympy.sinh,
    "cosh": sympy.cosh,
    "tanh": sympy.tanh,
    "ln": sympy.log,
    "log": sympy.log,
    "exp": sympy.exp,
}
_INVERSES = {sympy.sin: sympy.asin, sympy.cos: sympy.acos, sympy.tan: sympy.atan}
_CONSTANTS = {"pi": sympy.pi, "infty": sympy.oo, "infinity": sympy.oo, "inf": sympy.oo, "oo": sympy.oo}
_GREEK = frozenset(
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
    "rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega".split()
)
_HEDGES = frozenset("either maybe possibly approximately about".split())
_ENUMERATIONS = frozenset(r"\ldots \cdots \dots \vdots \ddots".split())
_MATRICES = frozenset("pmatrix bmatrix Bmatrix vmatrix Vmatrix matrix smallmatrix array".split())
_REPEAT_MARKS = (r"\overline", r"\bar", r"\dot")  # over the repeating digits of a decimal
_DIGITS = re.compile(r"[0-9]+")


def written_precision(text: str) -> tuple:
    """How precisely a number literal is written: (significant digits, the unit of its last digit).
    '0.330' -> (3, 1/1000), '1.2e3' -> (2, 100), '100' -> (3, 1)."""
    mantissa, _, exponent = text.lower().partition("e")
    fraction = mantissa.partition(".")[2]
    digits = len(mantissa.replace(".", "").lstrip("0")) or 1
    return digits, sympy.Integer(10) ** (int(exponent or 0) - len(fraction))


def _logarithm(arg, base):
    """log_base(arg): exact where arg is a whole power of base (\\log_2 8 = 3, \\log_2 \\frac18 = -3),
    else log(arg) / log(base)."""
    quotient = div(sympy.log(arg), sympy.log(base))  # refuses base 1: division by zero
    if isinstance(arg, sympy.Rational) and isinstance(base, sympy.Rational) and arg > 0 and base > 0:
        exact = sympy.log(arg, base)  # a power of base taken out: 3, or 1 + log(5)/log(2) for log_2 10
        if exact.is_Rational:
            return exact
    return quotient


class _Atoms:
    """The token cursor and the atom readers of `parse._Parser`, never used alone: for what an atom
    encloses they call back into its grammar (sequence, sum, term, power, exponent, starts_atom)."""

    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0
        self.decimals = {}
        self.abs_depth = 0  # inside |...|, a '|' closes instead of opening

    # -- token access -------------------------------------------------------------------------
    def peek(self, offset=0):
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else ("end", "")

    def next(self):
        token = self.peek()
        self.pos += 1
        return token

    def at(self, *texts) -> bool:
        return self.peek()[1] in texts

    def expect(self, text):
        if self.next()[1] != text:
            raise Unsupported(f"expected {text!r}")

    # -- atoms --------------------------------------------------------------------------------
    def atom(self):
        kind, text = self.peek()
        if kind == "num":
            self.next()
            if self.at(*_REPEAT_MARKS):
                return self.repeating_decimal(text)
            return self.mixed_number(self.number(text))
        if kind == "word":
            return self.word()
        if kind == "cmd":
            return self.command()
        if text in ("(", "["):
            return self.brackets()
        if text == "{":
            return self.group()
        if text == "|":
            return self.absolute("|", "|")
        raise Unsupported(f"unexpected {text!r}" if text else "answer ends too early")

    def number(self, text: str):
        if len(text) > MAX_NUMBER_CHARS:
            raise Unsupported("number literal too long")
        mantissa, _, exponent = text.lower().partition("e")
        if len(exponent) > 6:
            raise Unsupported("exponent too large")
        value = checked_literal(mantissa, int(exponent or 0))
        if "." in mantissa or exponent:
            self.decimals[value] = self.decimals[-value] = written_precision(text)
        return value

    def repeating_decimal(self, text: str):
        """0.\\overline{3} = 1/3, 0.1\\overline{6} = 1/6, 1.\\overline{142857} = 8/7, 0.\\dot{3} = 1/3:
        exactly, as a rational (not a rounded decimal, so not recorded in `decimals`). Only after a plain
        decimal, and only at its end: 0.\\overline{3}4 and 0.\\dot{1}4\\dot{2} are refused."""
        if "." not in text or "e" in text.lower() or len(text) > MAX_NUMBER_CHARS:
            raise Unsupported("a repeating block after a number that is not a plain decimal")
        block = self.repeating_block()
        if self.peek()[0] == "num" or self.at(*_REPEAT_MARKS):
            raise Unsupported("digits after a repeating block")
        fraction_digits = len(text.partition(".")[2])
        # 0.1\overline{6} = 0.1 + 6 / (9 * 10): the block over as many 9s, shifted past the fixed digits
        repeating = sympy.Rational(int(block), (10 ** len(block) - 1) * 10**fraction_digits)
        return add(checked_literal(text, 0), repeating)

    def repeating_block(self) -> str:
        """The digits under \\overline{...} or \\bar{...}, or the one under \\dot{.}; the braces may be left
        out around one digit."""
        mark = self.next()[1]
        braced = self.at("{")
        if braced:
            self.next()
        kind, digits = self.next()
        if braced:
            self.expect("}")
        if kind != "num" or not _DIGITS.fullmatch(digits):
            raise Unsupported("a repeating block of something other than digits")
        if len(digits) > (MAX_REPEATING_DIGITS if braced and mark != r"\dot" else 1):
            raise Unsupported("repeating block too long")
        return digits

    def mixed_number(self, whole):
        """4\\frac{2}{3} is 4 + 2/3 when both parts are written as integers."""
        if not (whole.is_Integer and self.at(r"\frac")):
            return whole
        start = self.pos
        fraction = self.atom()
        consumed = self.tokens[start + 1 : self.pos]
        if all(kind == "num" and "." not in t or t in "{}" for kind, t in consumed):
            return whole + fraction
        return mul(whole, fraction)

    def word(self):
        text = self.next()[1]
        if text in _HEDGES:
            raise Unsupported(f"hedged answer ({text!r})")
        if text in _CONSTANTS:
            return _CONSTANTS[text]
        if text in _FUNCTIONS or text == "sqrt":
            return self.function(text)
        if len(text) > 1:  # 'xy' in a formula: a product of single-letter variables
            self.tokens[self.pos : self.pos] = [("word", c) for c in text]
            return self.letter()
        self.pos -= 1
        return self.letter()

    def letter(self):
        kind, text = self.next()
        if kind != "word":
            raise Unsupported(f"expected a variable, got {text!r}")
        if len(text) > 1:
            self.tokens.insert(self.pos, ("word", text[1:]))
            text = text[0]
        if text == "e":
            return sympy.E
        if text == "i":
            return sympy.I
        return self.subscripted(text)

    def subscripted(self, name: str):
        if not self.at("_"):
            return sympy.Symbol(name)
        self.next()
        if self.at("{"):
            start = self.pos
            self.skip_group()
            subscript = "".join(t for _, t in self.tokens[start + 1 : self.pos - 1])
        else:
            subscript = self.next()[1]
        return sympy.Symbol(f"{name}_{subscript}")

    def skip_group(self):
        depth = 0
        while True:
            text = self.next()[1]
            if text == "":
                raise Unsupported("unclosed group")
            depth += (text == "{") - (text == "}")
            if depth == 0:
                return

    def group(self):
        self.expect("{")
        items = self.sequence()
        self.expect("}")
        if len(items) != 1:
            return make_set(items)
        return items[0]

    def argument(self):
        """A LaTeX macro argument: {group}, or a single digit, letter or command (\\frac12)."""
        kind, text = self.peek()
        if text == "{":
            return self.group()
        if kind in ("num", "word") and len(text) > 1:
            self.tokens[self.pos : self.pos + 1] = [(kind, text[0]), (kind, text[1:])]
        if kind == "num":
            self.next()
            return self.number(text[0])
        return self.atom()

    def brackets(self):
        """(a), (a, b), [a, b), (a, b, c): a group, a tuple or an interval, by count and brackets."""
        opener = self.next()[1]
        items = self.sequence()
        closer = self.next()[1]
        if closer not in (")", "]"):
            raise Unsupported("unclosed bracket")
        if len(items) == 1 and opener + closer in ("()", "[]"):
            return items[0]
        if len(items) == 2 and (opener + closer != "()" or infinite(items)):
            return Interval(items[0], items[1], opener == "[", closer == "]")
        return Tuple(tuple(items), opener + closer)

    def absolute(self, opener, closer):
        self.expect(opener)
        self.abs_depth += 1
        value = self.sum()
        self.abs_depth -= 1
        self.expect(closer)
        return sympy.Abs(scalar(value))

    def command(self):
        text = self.peek()[1]
        name = text[1:]
        if text in _ENUMERATIONS:
            raise Unsupported("an enumeration with dots")
        if name in _FUNCTIONS or name == "sqrt":
            self.next()
            return self.function(name)
        self.next()
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        if name in _GREEK:
            return self.subscripted(name)
        if name == "frac":
            return div(self.argument(), self.argument())
        if name in ("sum", "prod"):
            return self.big_operator(name)
        if name == "lim":
            return self.limit()
        if name == "binom":
            n = self.argument()
            k = self.argument()
            return binomial(n, k)
        if name == "mathbb":
            if self.argument() != sympy.Symbol("R"):
                raise Unsupported("only \\mathbb{R} is understood")
            return REAL_LINE
        if name in ("emptyset", "varnothing"):
            return Set(())
        if text == r"\{":
            return self.set_literal()
        if name in ("lfloor", "lceil"):
            return self.rounding(name)
        if name in ("lvert", "vert"):
            self.pos -= 1
            return self.absolute(text, r"\rvert" if name == "lvert" else r"\vert")
        if name == "begin":
            return self.matrix()
        raise Unsupported(f"unknown command {text}")

    def big_operator(self, name: str):
        """\\sum_{k=a}^{b} body and \\prod: evaluated when nothing but k is a variable."""
        self.expect("_")
        lower = self.argument()
        if not (isinstance(lower, Relation) and lower.op == "=" and isinstance(lower.lhs, sympy.Symbol)):
            raise Unsupported("a sum or product needs an index: \\sum_{k=a}^{b}")
        self.expect("^")
        upper = self.argument()
        operator = sympy.Sum if name == "sum" else sympy.Product
        value = operator(scalar(self.term()), (lower.lhs, scalar(lower.rhs), scalar(upper)))
        return value if value.free_symbols else value.doit()

    def limit(self):
        """\\lim_{x \\to a} c is c when c has no x in it. Any other limit is not evaluated (Unsupported),
        nor one followed by + or -, where its body may go on: \\lim_{x \\to 0} 5 + x."""
        self.expect("_")
        self.expect("{")
        variable = self.atom()
        if not (isinstance(variable, sympy.Symbol) and self.at(r"\to", r"\rightarrow")):
            raise Unsupported("a limit needs a variable and a point: \\lim_{x \\to a}")
        self.next()
        scalar(self.sum())  # the point: read, to be sure it is one; a constant's limit does not depend on it
        self.expect("}")
        body = scalar(self.term())
        if variable in body.free_symbols or self.at("+", "-", r"\pm", r"\mp"):
            raise Unsupported("a limit is evaluated only when its body is a constant")
        return body

    def function(self, name: str):
        """\\sin x, \\sin(x), \\sin^2 x, \\sin^{-1} x, \\log_2 8, \\sqrt{x}, \\sqrt[3]{x}."""
        if name == "sqrt":
            index = 2
            if self.at("["):
                self.next()
                index = self.sum()
                self.expect("]")
            return root(self.argument(), index)
        fn = _FUNCTIONS[name]
        base = None
        exponent = None
        if name == "log" and self.at("_"):
            self.next()
            base = self.argument()
        if self.at("^"):
            self.next()
            exponent = self.exponent()
            if exponent == -1 and fn in _INVERSES:
                fn = _INVERSES[fn]
                exponent = None
        arg = checked_argument(self.function_argument(), name)
        if base is not None:
            checked_argument(base, "log")
        value = fn(arg) if base is None else _logarithm(arg, base)
        return value if exponent is None else power(value, exponent)

    def function_argument(self):
        if self.at("("):
            return scalar(self.brackets())
        if self.at("{"):
            return self.group()
        value = self.power()
        while self.starts_atom() and self.peek()[0] in ("num", "word"):
            value = mul(value, self.power())
        return value

    def set_literal(self):
        items = [] if self.at(r"\}") else self.sequence()
        self.expect(r"\}")
        return make_set(items)

    def rounding(self, name):
        value = self.sum()
        self.expect(r"\rfloor" if name == "lfloor" else r"\rceil")
        return (sympy.floor if name == "lfloor" else sympy.ceiling)(scalar(value))

    def matrix(self):
        self.expect("{")
        env = self.next()[1]
        self.expect("}")
        if env not in _MATRICES:
            raise Unsupported(f"unknown environment {env}")
        if env == "array" and self.at("{"):
            self.skip_group()
        rows = []
        row = []
        while True:
            row.append(scalar(self.sum()))
            if self.at("&"):
                self.next()
                continue
            rows.append(row)
            row = []
            if self.at("\\\\"):
                self.next()
            if self.at(r"\end"):
                break
            if not rows[-1] or self.peek()[0] == "end":
                raise Unsupported("malformed matrix")
        self.next()
        self.skip_group()
        if not rows or len({len(r) for r in rows}) != 1 or sum(map(len, rows)) > MAX_ITEMS:
            raise Unsupported("ragged or oversized matrix")
        return sympy.ImmutableMatrix(rows)


# -- the tokenizer and the grammar ------------------------------------------------------------
MAX_TOKENS = 20_000  # longer answers are not parsed (they can still match as identical strings)
MAX_NESTING = 40  # deepest bracket nesting parsed
_TOKEN = re.compile(
    r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+(?![A-Za-z]))?)|(?P<cmd>\\[A-Za-z]+|\\[{}|])|(?P<word>[A-Za-z]+)"
    r"|(?P<op><=|>=|!=|=<|=>|\*\*|\\\\|[-+*/^_=<>(){}\[\],;|!'&:])|(?P<space>\s+)"
)
_RELATIONS = {
    "=": "=",
    "<": "<",
    ">": ">",
    "<=": "<=",
    ">=": ">=",
    "!=": "!=",
    "=<": "<=",
    "=>": ">=",
    r"\le": "<=",
    r"\leq": "<=",
    r"\leqslant": "<=",
    r"\ge": ">=",
    r"\geq": ">=",
    r"\geqslant": ">=",
    r"\lt": "<",
    r"\gt": ">",
    r"\ne": "!=",
    r"\neq": "!=",
    r"\in": "in",
}
_SEPARATORS = (",", ";", "and", "or")  # "3 or 5" is a list of two values: it never equals one value
_TEXT = re.compile(r"[A-Za-z][A-Za-z' -]*")


def parse(s: str) -> Parsed:
    """The value of a normalised answer; raises Unsupported when it cannot be read."""
    if _TEXT.fullmatch(s) and not _is_math_words(s):
        return Parsed(Text(" ".join(s.lower().replace("-", " ").split())))
    parser = _Parser(_tokenize(s))
    try:
        value = parser.answer()
    except Unsupported:
        raise
    except Exception as error:  # sympy refusing an operation (shapes, domains): not understood
        raise Unsupported(f"{type(error).__name__}: {error}") from None
    return Parsed(value, parser.decimals)


def _is_math_words(s: str) -> bool:
    """True when every word is a single letter or a function/constant name: 'x y', 'pi', 'sin x'."""
    words = s.replace("-", " ").split()
    return all(len(w) == 1 or w in _FUNCTIONS or w in _CONSTANTS or w == "sqrt" for w in words)


def _tokenize(s: str) -> list[tuple[str, str]]:
    tokens = []
    i = 0
    depth = 0
    deepest = 0
    while i < len(s):
        match = _TOKEN.match(s, i)
        if match is None:
            raise Unsupported(f"unexpected character {s[i]!r}")
        i = match.end()
        kind = match.lastgroup
        if kind == "space":
            continue
        text = match.group()
        depth += text in ("(", "[", "{", r"\{") or 0
        depth -= text in (")", "]", "}", r"\}") or 0
        deepest = max(deepest, depth)
        tokens.append((kind, text))
    if len(tokens) > MAX_TOKENS or deepest > MAX_NESTING:
        raise Unsupported("answer too long or too deeply nested")
    return tokens


def _solutions(items: list) -> list:
    """'p=5, q=2; p=7, q=2' -> [{p=5, q=2}, {p=7, q=2}]: a list of assignments in which the same two
    or more names come round again, in the same order, is a list of solutions, one per round (read
    as one set it would merge them: {p=5, q=2, p=7}). Any other list is returned as it is."""
    names = [
        item.lhs
        if isinstance(item, Relation) and item.op == "=" and isinstance(item.lhs, sympy.Symbol)
        else None
        for item in items
    ]
    size = len(dict.fromkeys(names))
    if None in names or size < 2 or len(items) == size or names != names[:size] * (len(items) // size):
        return items
    return [make_set(items[i : i + size]) for i in range(0, len(items), size)]


class _Parser(_Atoms):
    """Recursive descent, loosest binding first: list, relation, approximation, ratio, union, sum, product,
    power, atom."""

    # -- grammar ------------------------------------------------------------------------------
    def answer(self):
        items = _solutions(self.sequence())
        if self.pos != len(self.tokens):
            raise Unsupported(f"unexpected {self.peek()[1]!r}")
        return items[0] if len(items) == 1 else make_set(items)

    def sequence(self) -> list:
        """Items separated by commas, semicolons, 'and' or 'or'; a ± item counts as its two values."""
        items = self.split_pm(self.relation())
        while self.at(*_SEPARATORS):
            self.next()
            items += self.split_pm(self.relation())
            if len(items) > MAX_ITEMS:
                raise Unsupported("too many items")
        return items

    def split_pm(self, value) -> list:
        if isinstance(value, (sympy.Basic,)) and value.has(PM):
            return [value.subs(PM, 1), value.subs(PM, -1)]
        if contains_pm(value):
            raise Unsupported("± inside a structure")
        return [value]

    def relation(self):
        left = self.approximation()
        chain = []
        while self.peek()[1] in _RELATIONS:
            op = _RELATIONS[self.next()[1]]
            right = self.approximation()
            chain.append(Relation(op, left, right))
            left = right
        if not chain:
            return left
        return chain[0] if len(chain) == 1 else make_set(chain)

    def approximation(self):
        """a \\approx 0.33: the value a, with each rounding written after it, for `equivalence` to check
        ('x = 1/3 \\approx 0.33' is x = (1/3, rounded to 0.33))."""
        value = self.ratio()
        roundings = []
        while self.at(r"\approx"):
            self.next()
            roundings.append(self.stated_rounding())
        return Approximation(value, tuple(roundings)) if roundings else value

    def stated_rounding(self) -> tuple:
        """A written number (a sign and one literal: 0.33, -3, 1.2e3) and half a unit in its last digit."""
        start = self.pos
        value = self.ratio()
        written = self.tokens[start : self.pos]
        if written and written[0][1] in ("-", "+"):
            written = written[1:]
        if len(written) != 1 or written[0][0] != "num":
            raise Unsupported("only a written number can follow \\approx")
        _, unit = written_precision(written[0][1])
        return value, unit / 2

    def ratio(self):
        """a : b, read as the number a / b."""
        value = self.union()
        while self.at(":"):
            self.next()
            value = div(value, self.union())
        return value

    def union(self):
        parts = [self.sum()]
        while self.at(r"\cup"):
            self.next()
            parts.append(self.sum())
        if len(parts) == 1:
            return parts[0]
        return Union(tuple(as_interval_or_set(p) for p in parts))

    def sum(self):
        value = self.term()
        while self.at("+", "-", r"\pm", r"\mp"):
            op = self.next()[1]
            sign = {"+": 1, "-": -1, r"\pm": PM, r"\mp": -PM}[op]
            value = add(value, mul(sign, self.term()))
        return value

    def term(self):
        value = self.unary()
        while True:
            if self.at("*", r"\cdot", r"\times"):
                self.next()
                value = mul(value, self.unary())
            elif self.at("/", r"\div"):
                self.next()
                value = div(value, self.unary())
            elif self.starts_atom():
                value = mul(value, self.power())
            else:
                return value

    def unary(self):
        if self.at("-", "+", r"\pm", r"\mp"):
            op = self.next()[1]
            sign = {"+": 1, "-": -1, r"\pm": PM, r"\mp": -PM}[op]
            return mul(sign, self.unary())
        return self.power()

    def power(self):
        base = self.postfix()
        if self.at("^", "**"):
            self.next()
            return power(base, self.exponent())
        return base

    def exponent(self):
        if self.at("-", "+"):
            sign = -1 if self.next()[1] == "-" else 1
            return mul(sign, self.exponent())
        if self.at("{"):
            return self.group()
        kind, text = self.peek()
        if kind == "num":
            self.next()
            return self.number(text)
        return self.power() if kind != "word" else self.letter()

    def postfix(self):
        value = self.atom()
        while self.at("!", "'"):
            if self.next()[1] == "'":
                raise Unsupported("derivative marks")
            if not self.at("!"):
                value = factorial(value)
                continue
            self.next()  # n!!: the double factorial (see the departures above)
            if self.at("!"):
                raise Unsupported("three factorial marks")
            value = double_factorial(value)
        return value

    def starts_atom(self) -> bool:
        kind, text = self.peek()
        if kind in ("num",):
            return True
        if kind == "word":
            return text not in _SEPARATORS and text not in _HEDGES
        if kind == "cmd":
            return text not in _RELATIONS and text not in (
                r"\cdot",
                r"\times",
                r"\div",
                r"\pm",
                r"\mp",
                r"\cup",
                r"\approx",
                r"\}",
                r"\end",
                r"\rfloor",
                r"\rceil",
                r"\rvert",
            )
        if text == "|":
            return self.abs_depth == 0
        return text in ("(", "{")
