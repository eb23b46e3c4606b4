"""Stage 2 of the loop, reward: the atoms of an answer, the part of `parse` that knows LaTeX.

In: the tokens of a normalised answer. Out: the value of one atom (a number, with its decimals recorded, or a
repeating decimal, 0.\\overline{3}, exactly; a letter, Greek name or constant; \\frac, \\sqrt, \\binom, \\sum,
the limit of a constant, a function; a bracket, set, absolute value, rounding or matrix). The tables below and
`_Atoms.command` are the whole vocabulary: any other command raises Unsupported. It knows single atoms, not
precedence: what an atom encloses is read by `parse`'s grammar, which `_Atoms` calls back.
"""

from __future__ import annotations

import re

import sympy

from .arithmetic import (
    add,
    binomial,
    checked_argument,
    checked_literal,
    div,
    infinite,
    make_set,
    mul,
    power,
    root,
    scalar,
)
from .values import REAL_LINE, Interval, Relation, Set, Tuple, Unsupported

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
