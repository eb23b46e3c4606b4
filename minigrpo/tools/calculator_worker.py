"""Stage 1 of the loop, rollout: the calculator tool's worker process and its arithmetic, under a
deterministic budget (`python -m minigrpo.tools.calculator_worker`, started by calculator_pool.py).

In: an expression a completion wrote (`347*56`, `\\sum_{k=1}^{10} k^2`). Out: its exact value as text, or
a CalculatorError saying why there is none. It reads through the verifier's parser (verifier/answers/parse.py,
never eval) and knows nothing of tokens, rows or the runner: calculator_pool.py starts this module as its
worker processes, which `serve` one expression per line, and registry.py registers the result as the
"calculator".

The budget, so that an answer is a function of the call alone (and of no timer, nor of what the worker
computed before: sympy's cache is emptied before each call):
  - the parser's own checks: powers, factorials and binomial coefficients estimated before they are
    computed, exact numbers up to 400,000 bits (verifier/answers/arithmetic.py);
  - the work of all the exact arithmetic of a call (the parser's, and that of the terms of its sums),
    each operation estimated before it is computed, at most MAX_EXACT_WORK word products
    (verifier/answers/costs.py: a product of m and n words costs m*n, a fraction reduced more, a root of a
    600-digit number a great deal);
  - sums and products are evaluated here, not by sympy, one term at a time, their cost bounded before
    any term is computed and their partial results measured as they grow, within MAX_PARTIAL_BITS. A
    term that is a ratio of polynomials in the index with rational coefficients (`k`, `k^2+1`,
    `\\frac{1}{k(k+1)}`) is computed with Python's exact integers and fractions: its cost is word
    operations (multiply-adds times the words of the numbers they multiply, see `_polynomial_work`), at
    most MAX_WORK in all, so a sum of ten thousand small terms is cheap and one of a billion is refused.
    Any other term (`\\sqrt{k}`, `\\sin k`) goes through the parser's checked arithmetic and sympy, and
    its operations are counted, at most MAX_OPERATIONS in all (a term of `\\sqrt{k}+1` costs two; a
    nested sum's terms count once per outer term). Reading a term costs SETUP_WORK each time a sum
    starts; a sum's inner sums start once per term, which is counted before its first term;
  - no function (sin, exp, log) is evaluated on a number over MAX_ARGUMENT_DIGITS digits, and no root
    taken of an exact number over the parser's MAX_ARGUMENT_BITS (verifier/answers/arithmetic.py);
  - the answer: exact up to MAX_RESULT_CHARS characters, else 15 significant digits.
"""

from __future__ import annotations

import json
import math
import re
import resource
import signal
import sys
from fractions import Fraction
from functools import reduce

import sympy
from sympy.core.cache import clear_cache

from ..verifier import Unsupported, bounded_work
from ..verifier import checked_add as add
from ..verifier import checked_binomial as binomial
from ..verifier import checked_double_factorial as double_factorial
from ..verifier import checked_factorial as factorial
from ..verifier import checked_mul as mul
from ..verifier import checked_power as power
from ..verifier import parse_math as parse
from .calculator_pool import CPU_LIMIT, MEMORY_LIMIT_BYTES, CalculatorError

MAX_EXPRESSION_CHARS = 200  # the calculator reads expressions up to this long
MAX_RESULT_CHARS = 60  # an exact result longer than this is given to 15 significant digits
MAX_OPERATIONS = 500  # in all the terms of its sums and products that sympy computes (see `_operations`)
MAX_WORK = 2_000_000  # word operations in all its sums' and products' polynomial terms (`_polynomial_work`)
MAX_EXACT_WORK = 300_000_000  # word products of all its exact arithmetic (verifier/answers/costs.py)
MAX_PARTIAL_BITS = 10_000  # bits of the exact numbers in a sum's or product's partial result (~3,000 digits)
FRACTION_WORK = 20  # a fraction added to a partial result, in word operations (`_polynomial_work`)
SETUP_WORK = 10_000  # reading a term (sympy's together and Poly), in word operations, each time a sum starts
MAX_EXPANDED_DEGREE = 16  # a power of a sum in the index, (k+1)^{16}, is expanded up to this degree
MAX_DEGREE = 100  # a polynomial term's powers of the index, at most (beyond it sympy computes the term)
MAX_ARGUMENT_DIGITS = 300  # digits of a number inside a function (sin, exp, log) evaluated to 15 digits
# "1 2", "1 .5", "1..2", "1.2.3": the parser would multiply; not a one-digit subscript or power (\log_2 8)
_SIDE_BY_SIDE = re.compile(r"(?<![_^])\d\s+\.?\d|\.\d*\.")
WARM_UP = ["1+1", "0.5", "\\sqrt{2}", "\\sum_{k=1}^{3} \\sin k"]  # sympy's first of each, before "ready"
_BIG_OPERATOR = re.compile(r"\\(?:sum|prod)(?![A-Za-z])")


# --- the arithmetic, under the budget --------------------------------------------------------------
def evaluate(expression: str) -> str:
    """The value of `expression`, computed in this process under the budget: 19432, 7/2, or
    1.41421356237310 for sqrt(2). Raises CalculatorError for a call it refuses."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise CalculatorError("empty expression")
    if _SIDE_BY_SIDE.search(text):
        raise CalculatorError("two numbers side by side: write an operator between them")
    clear_cache()  # what sympy kept from earlier calls: their work would make this one's cheaper
    try:
        with bounded_work(MAX_EXACT_WORK):
            return _written(_Evaluation().text(text, {}))
    except (Unsupported, RecursionError) as error:
        raise CalculatorError(_reason(str(error))) from None
    except MemoryError:
        raise CalculatorError("result too large") from None


def _reason(reason: str) -> str:
    """The parser's reason, as a short observation."""
    if "division by zero" in reason:
        return "division by zero"
    if "of a number of more than" in reason or "word products" in reason:  # a huge root, the exact work
        return reason
    if "too large" in reason:
        return "result too large"
    return f"not an arithmetic expression ({reason[:60]})"


class _Evaluation:
    """One expression's value, the cost of its sums and products counted against MAX_OPERATIONS (terms
    sympy computes) and MAX_WORK (polynomial terms)."""

    def __init__(self):
        self.operations = 0  # in the terms sympy computed so far
        self.work = 0  # word operations of the polynomial terms computed so far

    def text(self, text: str, indices: dict) -> sympy.Expr:
        """The value of `text`, in which the sums' `indices` (symbol -> its value now) may appear."""
        lazy, uppers = _lazy_big_operators(text)
        value = parse(lazy).value
        if not isinstance(value, sympy.Expr):
            raise CalculatorError("not an arithmetic expression")
        return self.value(value, uppers, indices)

    def value(self, value: sympy.Expr, uppers: dict, indices: dict) -> sympy.Expr:
        """`value` with its sums and products evaluated and `indices` put in, through the parser's checked
        arithmetic; what holds neither the parser has evaluated already."""
        if value in indices:
            return indices[value]
        if isinstance(value, (sympy.Sum, sympy.Product)):
            return self.big_operator(value, uppers, indices)
        if not value.has(sympy.Sum, sympy.Product, *indices):
            return value
        args = [self.value(arg, uppers, indices) for arg in value.args]
        return _CHECKED.get(value.func, value.func)(*args)

    def big_operator(self, node: sympy.Expr, uppers: dict, indices: dict) -> sympy.Expr:
        """A sum or product, one term at a time: its operations counted before any is computed, its size
        measured as each term comes in. The exact (rational) part of each term is added (multiplied) in
        at once, so that a partial result is measured as it is; the rest (sqrt(k), sin(k)) is combined
        at the end, in one sympy call, and measured as the sum of its terms' sizes."""
        *inner, (index, lower, placeholder) = node.limits  # sympy merges a sum of a sum into one node
        body = type(node)(node.function, *inner) if inner else node.function
        first = self.value(lower, uppers, indices)
        last = self.text(uppers[placeholder], indices)
        if not (first.is_Integer and last.is_Integer):
            raise CalculatorError("a sum or product needs whole numbers as its bounds")
        terms = max(int(last) - int(first) + 1, 0)
        # reading this sum's term, now, and its inner sums' terms once per term, sure to follow
        self.count_work(SETUP_WORK, ahead=terms * _inner_big_operators(body) * SETUP_WORK)
        is_sum = isinstance(node, sympy.Sum)
        polynomials = _as_polynomials(body.xreplace(indices), index)
        if polynomials is not None:
            return self.polynomial_terms(*polynomials, int(first), int(last), is_sum)
        self.operations += terms * _operations(body, index)
        if self.operations > MAX_OPERATIONS:
            raise CalculatorError(f"more than {MAX_OPERATIONS} operations in sums and products")
        exact = sympy.Integer(0 if is_sum else 1)  # the exact part so far
        others = []  # the terms' other parts
        others_bits = 0  # their sizes, added up
        for k in range(int(first), int(last) + 1):
            term = self.value(body, uppers, {**indices, index: sympy.Integer(k)})
            number, other = term.as_coeff_Add() if is_sum else term.as_coeff_Mul()
            exact = add(exact, number) if is_sum else mul(exact, number)
            if other != (0 if is_sum else 1):  # a term with no other part adds nothing to measure
                others.append(other)
                others_bits += _bits(other)
            if _bits(exact) + others_bits > MAX_PARTIAL_BITS:
                raise CalculatorError("result too large")
        return sympy.Add(exact, *others) if is_sum else sympy.Mul(exact, *others)

    def count_work(self, work: int, ahead: int = 0) -> None:
        """Count `work` word operations; refuse the call if they, with `ahead` more sure to follow, pass
        MAX_WORK."""
        self.work += work
        if self.work + ahead > MAX_WORK:
            raise CalculatorError(f"more than {MAX_WORK:,} word operations in sums and products")

    def polynomial_terms(
        self, numerator: list[Fraction], denominator: list[Fraction], first: int, last: int, is_sum: bool
    ) -> sympy.Rational:
        """A sum or product of numerator(k) / denominator(k) for k from first to last (coefficients highest
        degree first), in exact Python integers and fractions: its work counted before any term, its
        partial result measured as it grows."""
        self.count_work(_polynomial_work(numerator, denominator, first, last))
        scale = _common_denominator(numerator + denominator)
        above = [int(c * scale) for c in numerator]  # numerator(k) * scale, in integers
        below = [int(c * scale) for c in denominator]
        if len(below) == 1:  # a constant denominator: whole numbers throughout, one division at the end
            power = 1 if is_sum else max(last - first + 1, 0)
            _check_partial(power * abs(below[0]).bit_length())  # the divisor, measured before it is computed
            result = _integer_terms(above, first, last, is_sum)
            return sympy.Rational(result, below[0] ** power)
        result = Fraction(0 if is_sum else 1)
        for k in range(first, last + 1):
            under = _horner(below, k)
            if under == 0:
                raise CalculatorError("division by zero")
            term = Fraction(_horner(above, k), under)
            result = result + term if is_sum else result * term
            _check_partial(result.numerator.bit_length() + result.denominator.bit_length())
        return sympy.Rational(result.numerator, result.denominator)


_CHECKED = {  # the operations a sum's body is built of, as the parser performs them: sizes checked first
    sympy.Add: lambda *terms: reduce(add, terms),
    sympy.Mul: lambda *factors: reduce(mul, factors),
    sympy.Pow: power,
    sympy.binomial: binomial,
    sympy.factorial: factorial,
    sympy.factorial2: double_factorial,
}


def _lazy_big_operators(text: str) -> tuple[str, dict]:
    """`text` with the upper bound of each sum and product replaced by a placeholder N_{i}, and the bound
    (as written) of each placeholder. The parser evaluates a sum at once, by sympy and with no budget,
    unless a bound holds a variable: with the placeholder it leaves the sum to `_Evaluation`."""
    pieces = []
    uppers = {}
    done = 0  # text[:done] is in pieces
    for match in _BIG_OPERATOR.finditer(text):
        lower = _argument(text, match.end(), "_")
        upper = _argument(text, lower[1], "^")
        if _BIG_OPERATOR.search(text, lower[0], upper[1]):
            raise CalculatorError("a sum or product in the bounds of another")
        uppers[sympy.Symbol(f"N_{len(uppers)}")] = text[upper[0] : upper[1]]
        pieces += [text[done : upper[0]], f"{{N_{{{len(uppers) - 1}}}}}"]
        done = upper[1]
    return "".join(pieces) + text[done:], uppers


def _argument(text: str, start: int, mark: str) -> tuple[int, int]:
    """Where the argument after `mark` ("_" or "^", from text[start], spaces around it allowed) begins and
    ends: a {group}, or one digit or letter, as the parser reads the bounds of `\\sum_{k=1}^9`."""
    found = re.compile(rf"\s*{re.escape(mark)}\s*").match(text, start)
    if found is None or found.end() == len(text):
        raise CalculatorError("write a sum as \\sum_{k=1}^{10} and a product as \\prod_{k=1}^{10}")
    begin = found.end()
    if text[begin] != "{":
        if not (text[begin].isascii() and text[begin].isalnum()):
            raise CalculatorError("write a sum as \\sum_{k=1}^{10} and a product as \\prod_{k=1}^{10}")
        return begin, begin + 1
    depth = 0
    i = begin
    while i < len(text):
        if text[i] == "\\":  # a command, or an escaped brace (\{ opens a set, not a group)
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return begin, i
    raise CalculatorError("not an arithmetic expression (unclosed group)")


def _as_polynomials(body: sympy.Expr, index: sympy.Symbol) -> tuple[list, list] | None:
    """The coefficients (highest degree first, as Fractions) of a numerator and a denominator whose ratio
    is `body`, when `body` is a ratio of polynomials in `index` with rational coefficients and no other
    symbol or function; else None. Degrees past the body's size are refused (x^{1000000} is a
    polynomial too, but no cheap one)."""
    if body.free_symbols - {index} or body.atoms(sympy.Function) or not body.is_rational_function(index):
        return None
    powers = body.atoms(sympy.Pow)
    if any(not power.exp.is_Integer for power in powers) or _degree_bound(body, index) > MAX_DEGREE:
        return None
    # a power of a sum in the index is expanded below, at a cost no word count sees: kept small
    compound = [power for power in powers if power.base.has(index) and power.base != index]
    if any(_degree_bound(power, index) > MAX_EXPANDED_DEGREE for power in compound):
        return None
    numerator, denominator = sympy.fraction(sympy.together(body))
    try:
        polynomials = [sympy.Poly(part, index, domain="QQ") for part in (numerator, denominator)]
    except sympy.PolynomialError:
        return None
    coefficients = []
    for polynomial in polynomials:
        coefficients.append([Fraction(int(c.numerator), int(c.denominator)) for c in polynomial.all_coeffs()])
    return coefficients[0], coefficients[1]


def _inner_big_operators(body: sympy.Expr) -> int:
    """The sums and products in `body` that lie in no other one of them: each starts once per term."""
    if isinstance(body, (sympy.Sum, sympy.Product)):
        return 1
    return sum(_inner_big_operators(arg) for arg in body.args)


def _degree_bound(expression: sympy.Expr, index: sympy.Symbol) -> int:
    """An upper bound of the degree in `index` of `expression` written out, read from its tree without
    expanding it: ((k+1)^{10}+1)^{10} is of degree 100 (expanding it is what would cost)."""
    if not expression.has(index):
        return 0
    if expression == index:
        return 1
    if isinstance(expression, sympy.Pow):
        return _degree_bound(expression.base, index) * abs(int(expression.exp))
    degrees = [_degree_bound(arg, index) for arg in expression.args]
    return sum(degrees) if isinstance(expression, sympy.Mul) else max(degrees, default=0)


def _polynomial_work(numerator: list[Fraction], denominator: list[Fraction], first: int, last: int) -> int:
    """Word operations of numerator(k) / denominator(k) for every k from first to last, by Horner's rule:
    per term, a multiply-add per coefficient, each on numbers of at most the coefficients' bits plus the
    degree times the index's bits, in 64-bit words; a term with a denominator that depends on k is
    also a fraction added in, at FRACTION_WORK more (the greatest common divisor it takes)."""
    terms = max(last - first + 1, 0)
    index_bits = max(abs(first), abs(last), 1).bit_length()
    coefficients = numerator + denominator
    coefficient_bits = max(c.numerator.bit_length() + c.denominator.bit_length() for c in coefficients)
    degree = max(len(numerator), len(denominator)) - 1
    words = 1 + (coefficient_bits + degree * index_bits) // 64
    per_term = len(coefficients) * words + (FRACTION_WORK if len(denominator) > 1 else 0)
    return terms * per_term


def _integer_terms(coefficients: list[int], first: int, last: int, is_sum: bool) -> int:
    """The sum or product of the integer polynomial's values at first..last, measured as it grows."""
    result = 0 if is_sum else 1
    for k in range(first, last + 1):
        term = _horner(coefficients, k)
        if is_sum:
            result += term
        else:
            result *= term
            _check_partial(result.bit_length())
    _check_partial(result.bit_length())  # a sum's terms are measured by its work: only the total here
    return result


def _check_partial(bits: int) -> None:
    if bits > MAX_PARTIAL_BITS:
        raise CalculatorError("result too large")


def _common_denominator(coefficients: list[Fraction]) -> int:
    """The least common multiple of the coefficients' denominators."""
    return reduce(lambda a, b: a * b // math.gcd(a, b), (c.denominator for c in coefficients), 1)


def _horner(coefficients: list[int], k: int) -> int:
    value = 0
    for coefficient in coefficients:
        value = value * k + coefficient
    return value


def _operations(body: sympy.Expr, index: sympy.Symbol) -> int:
    """What a term of a sum or product costs: the operations (+, *, ^, a function) of its body that
    involve the index, and so are computed again for each term; at least one."""
    return max(1, sum(1 for node in sympy.preorder_traversal(body) if node.args and node.has(index)))


def _bits(value: sympy.Expr) -> int:
    """The size of the exact numbers in `value`: bits of each numerator and denominator, added up."""
    return sum(abs(number.p).bit_length() + number.q.bit_length() for number in value.atoms(sympy.Rational))


def _written(value: sympy.Expr) -> str:
    """The answer's text: exact if short, else 15 significant digits (a function of a huge number
    refused before it is evaluated)."""
    if not value.is_number or value.has(sympy.zoo, sympy.nan):
        raise CalculatorError("not an arithmetic expression")
    if value.is_real is False:
        raise CalculatorError("not a real number")
    if value.is_Rational and _bits(value) <= 4 * MAX_RESULT_CHARS:  # never str() a huge number
        exact = str(value)  # sympy writes 19432, and a fraction reduced, 7/2
        if len(exact) <= MAX_RESULT_CHARS:
            return exact
    for function in value.atoms(sympy.Function):
        if _bits(function) * 0.30103 > MAX_ARGUMENT_DIGITS:  # 0.30103 digits per bit
            raise CalculatorError(f"a number of more than {MAX_ARGUMENT_DIGITS} digits in {function.func}")
    approximation = sympy.N(value, 15)
    if not approximation.is_real:  # a value sympy could not tell real before evaluating it (\binom{\pi}{3})
        raise CalculatorError("not a real number")
    return str(approximation)


# --- a worker process -----------------------------------------------------------------------------
class _OutOfTime(BaseException):
    """Raised by the CPU timer; a BaseException, so that no `except Exception` in sympy swallows it."""


def _out_of_time(signum, frame):
    raise _OutOfTime


def _answer(expression: str) -> list:
    """What a worker sends back for `expression`: ["value", "19432"], ["error", "division by zero"], or
    ["timeout", ""] once the call has used CPU_LIMIT seconds of the worker's CPU time."""
    try:
        signal.setitimer(signal.ITIMER_PROF, CPU_LIMIT)
        try:
            return ["value", evaluate(expression)]
        except CalculatorError as error:
            return ["error", str(error)]
        except Exception as error:  # sympy failing on an odd input: still an answer, never a dead worker
            return ["error", f"{type(error).__name__}: {error}"[:200]]
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    except _OutOfTime:  # the timer fires once, wherever in here it lands
        return ["timeout", ""]


def serve() -> None:
    """A worker's loop: an expression per line of stdin, an answer per line of stdout, each as JSON."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which kills its workers
    signal.signal(signal.SIGPROF, _out_of_time)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ValueError, OSError):
        pass  # a lower hard limit is already in place
    for expression in WARM_UP:
        _answer(expression)
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        print(json.dumps(_answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    serve()
