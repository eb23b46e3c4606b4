"""Stage 2 of the loop, verify: arithmetic on parsed values, refused when the result would be huge.

Every operation `parse` performs goes through these functions. Powers, factorials and binomial
coefficients are refused from an estimate of their size before anything is computed (9^{9^{9^9}},
(10^{100000})!, and (7x)^{10^7}, whose 7^{10^7} sympy computes at once), exact rationals past MAX_BITS
after; operations on tuples, sets, intervals or relations are refused. Each operation's work is
estimated before it is computed and counted against the bound a caller may set (`costs.bounded_work`).
"""

from __future__ import annotations

import math

import sympy

from .costs import (
    loop_work,
    power_work,
    product_work,
    quotient_work,
    reduction_work,
    root_work,
    spend,
    sum_work,
)
from .values import Approximation, Interval, Relation, Set, Tuple, Union, Unsupported

MAX_BITS = 400_000  # exact rationals larger than this (about 120,000 digits) are not computed
MAX_FACTORIAL = 1_000  # n! is computed for n up to this
# A root (x^{1/2}, x^{2/3}) or a function (log, sin) of an exact number is taken for numbers up to this
# many bits (about 600 digits): sympy looks for the perfect powers in it, by trial division, at a cost
# that grows faster than the number's length (seconds at 3,000 digits; for log, on some hash seeds only)
MAX_ARGUMENT_BITS = 2_000
MAX_DISTINCT = 100  # distinct elements of a set (matching them is quadratic)
PM = sympy.Dummy("pm")  # stands for the sign of a ± until the value is split in two


def scalar(value):
    if isinstance(value, int):
        return sympy.Integer(value)
    if not isinstance(value, sympy.Basic):
        raise Unsupported("arithmetic on a tuple, set, interval or relation")
    return value


def checked_literal(mantissa: str, exponent: int):
    bits = (len(mantissa) + abs(exponent)) * 3.33
    if bits > MAX_BITS:
        raise Unsupported("number too large")
    spend(power_work, bits)
    return sympy.Rational(mantissa) * sympy.Integer(10) ** exponent


def _checked(value):
    if isinstance(value, sympy.Rational) and value.p.bit_length() + value.q.bit_length() > MAX_BITS:
        raise Unsupported("number too large")
    return value


def add(a, b):
    a = scalar(a)
    b = scalar(b)
    spend(sum_work, a, b)
    return _checked(a + b)


def mul(a, b):
    a = scalar(a)
    b = scalar(b)
    if isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase) and a.shape[1] != b.shape[0]:
        raise Unsupported("matrix shapes do not match")
    spend(product_work, a, b)
    return _checked(a * b)


def div(a, b):
    a = scalar(a)
    b = scalar(b)
    if isinstance(b, sympy.MatrixBase):
        raise Unsupported("division by a matrix")
    if b == 0:
        raise Unsupported("division by zero")
    spend(quotient_work, a, b)
    return _checked(a / b)


def power(base, exponent):
    base = scalar(base)
    exponent = scalar(exponent)
    if isinstance(exponent, sympy.MatrixBase) or isinstance(base, sympy.MatrixBase):
        raise Unsupported("matrix powers")
    raised = _raised_part(base)
    if exponent.is_number:
        bits = _result_bits(raised, exponent)
        if bits > MAX_BITS:
            raise Unsupported("power too large")
        spend(power_work, bits)
    if base == 0 and exponent.is_number and exponent.is_negative:
        raise Unsupported("division by zero")
    if exponent.is_Rational and not exponent.is_Integer:
        checked_argument(raised, "a root")
        if isinstance(raised, sympy.Rational):
            spend(root_work, raised)
    return _checked(base**exponent)


def _raised_part(base):
    """The part of `base` that sympy raises to a number at once: the base itself if it is a number, else
    the numbers it is a product of ((7x)^{10^7} is 7^{10^7} x^{10^7}); 1 if none."""
    if base.is_number:
        return base
    return sympy.Mul(*[factor for factor in sympy.Mul.make_args(base) if factor.is_number])


def checked_argument(value, what: str):
    """`value`, refused when it is an exact number past MAX_ARGUMENT_BITS: `what` (a root, log) of it would
    cost sympy a search for its perfect powers."""
    if (
        isinstance(value, sympy.Rational)
        and max(value.p.bit_length(), value.q.bit_length()) > MAX_ARGUMENT_BITS
    ):
        raise Unsupported(
            f"{what} of a number of more than {MAX_ARGUMENT_BITS} bits, too large to take exactly"
        )
    return value


def _result_bits(base, exponent) -> float:
    """An upper estimate of the bits of base ** exponent: of its numerator and denominator, for a
    rational base and exponent; else of log2 |base ** exponent| (inf when it cannot be estimated cheaply)."""
    if not exponent.is_real:
        return 0.0 if not exponent.is_Rational else math.inf
    if exponent.is_Rational:
        e = abs(exponent)
        if e.q > 1000:
            return math.inf
        e = float(e) if e.p.bit_length() < 64 else math.inf
    else:
        e = abs(float(sympy.N(exponent, 15))) if len(exponent.free_symbols) == 0 else math.inf
    if base in (0, 1, -1) or e == 0:
        return 0.0
    if isinstance(base, sympy.Rational) and exponent.is_Rational:
        return e * (math.log2(abs(base.p)) + math.log2(base.q)) + 1  # exact, up to float rounding
    magnitude = _log2_abs(base)
    return e * max(abs(magnitude), 1.0)


def _log2_abs(x) -> float:
    if isinstance(x, sympy.Rational):
        return x.p.bit_length() - x.q.bit_length()
    try:
        return math.log2(abs(complex(sympy.N(x, 15)))) if len(str(x)) < 200 else math.inf
    except (TypeError, ValueError, OverflowError):
        return math.inf


def factorial(n):
    """n!, for a whole number up to MAX_FACTORIAL; of an expression with a variable (a sum's index), left
    for when the variable has a value."""
    return _checked_factorial(scalar(n), sympy.factorial, "factorial")


def double_factorial(n):
    """n!! = n (n - 2) (n - 4) ... down to 2 or 1, for a whole number up to MAX_FACTORIAL; of an expression
    with a variable, left for when the variable has a value."""
    return _checked_factorial(scalar(n), sympy.factorial2, "double factorial")


def _checked_factorial(n, function, name: str):
    if not n.is_number:
        return function(n)
    if not (n.is_Integer and 0 <= n <= MAX_FACTORIAL):
        raise Unsupported(f"{name} of a non-integer or too large a number")
    spend(loop_work, int(n), int(n) * math.log2(max(int(n), 1)), False)
    return function(n)


def binomial(n, k):
    n = scalar(n)
    k = scalar(k)
    if n.is_Integer and k.is_Integer and 0 <= k <= n and n > 100_000:
        raise Unsupported("binomial too large")
    if not k.is_Integer or k <= 0:
        return sympy.binomial(n, k)
    if n.is_number and not isinstance(n, sympy.Rational):
        # sympy would expand the product of the k factors n - i, terms upon terms of powers of \pi; the
        # value, evaluated when asked for, is the same
        return sympy.binomial(n, k, evaluate=False)
    if isinstance(n, sympy.Rational):  # what sympy computes at once, in a loop of `steps` steps
        natural = n.is_Integer and n >= 0
        steps = int(max(min(k, n - k), 0)) if natural else int(k)
        bits = _binomial_bits(n, steps)
        if bits > MAX_BITS:
            raise Unsupported("binomial too large")
        spend(loop_work, steps, bits, not n.is_Integer)
        if not natural:
            spend(reduction_work, bits)
    return sympy.binomial(n, k)


def _binomial_bits(n: sympy.Rational, steps: int) -> float:
    """An upper estimate of the bits of binomial(n, k) as sympy computes it in `steps` steps: for a natural
    n, of the coefficient (at most steps * log2(e n / steps)); else of the product of the steps factors
    n - i (each (p - i q) / q) over steps!, numerator and denominator."""
    if steps <= 0:
        return 0.0
    if n.is_Integer and n >= 0:
        return steps * (int(n).bit_length() - steps.bit_length() + 3)
    factor = max(abs(n.p).bit_length(), (steps * n.q).bit_length()) + 1 + n.q.bit_length()
    return steps * (factor + steps.bit_length())


def root(value, index):
    """The index-th root of value: of a negative number and an odd index, the real root (\\sqrt[3]{-8} is
    -2, as in school mathematics; sympy's principal root, 1 + i\\sqrt{3}, is what a power (-8)^{1/3} is);
    else the principal root."""
    value = scalar(value)
    index = scalar(index)
    if not (index.is_Integer and 2 <= index <= 100):
        raise Unsupported("root index must be a small integer")
    if index.is_odd and value.is_number and value.is_extended_negative:
        return mul(-1, power(mul(-1, value), sympy.Rational(1, index)))
    return power(value, sympy.Rational(1, index))


def make_set(items) -> Set:
    distinct = tuple(dict.fromkeys(items))  # written twice is still one element
    if len(distinct) > MAX_DISTINCT:
        raise Unsupported("too many distinct elements")
    return Set(distinct)


def infinite(items) -> bool:
    return any(isinstance(x, sympy.Basic) and x in (sympy.oo, -sympy.oo) for x in items)


def as_interval_or_set(value):
    if isinstance(value, (Interval, Set)):
        return value
    if isinstance(value, Tuple) and len(value.items) == 2 and value.brackets == "()":
        return Interval(value.items[0], value.items[1], False, False)
    raise Unsupported("\\cup of something that is not an interval or a set")


def contains_pm(value) -> bool:
    if isinstance(value, sympy.Basic):
        return value.has(PM)
    if isinstance(value, (Tuple, Set)):
        return any(map(contains_pm, value.items))
    if isinstance(value, Interval):
        return contains_pm(value.lo) or contains_pm(value.hi)
    if isinstance(value, Relation):
        return contains_pm(value.lhs) or contains_pm(value.rhs)
    if isinstance(value, Union):
        return any(map(contains_pm, value.parts))
    if isinstance(value, Approximation):
        return contains_pm(value.value)
    return False
