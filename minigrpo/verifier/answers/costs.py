"""Stage 2 of the loop, verify: the work of `arithmetic`'s exact operations, and a bound on it for a caller
that needs one (the calculator tool, whose answers must not depend on a timer).

In: the operands of an operation, before it is computed. Out: an upper estimate of its work in word
products (one 64-bit word times another, as in schoolbook multiplication), counted against the bound in
force (`bounded_work`) and refused (Unsupported) past it. Outside `bounded_work` nothing is counted: the
verifier is bounded by its workers' deadline instead. It knows the sizes of numbers, not what they mean.

The estimates, for CPython's integers and sympy's rationals (`words`: a number's size in 64-bit words):
  - a sum of two integers, one pass over their words; a product, the product of their sizes;
  - a quotient, or an operation on fractions or on expressions holding them, GCD_WEIGHT times the
    product of the sizes: sympy reduces every fraction it makes by a greatest common divisor (Lehmer's
    algorithm, quadratic in the size);
  - a power, the square of its result's size (the last squaring dominates repeated squaring);
  - a root of an exact number, ROOT_WEIGHT times the square of its size: sympy looks for perfect powers
    in it, by trial division and an integer root for each prime exponent up to its bit length;
  - a factorial or a binomial coefficient, its steps (a product by a small number, for a binomial also
    a division) times the size its result grows to, STEP_WEIGHT times over; a binomial of a fraction
    takes its steps on fractions, reduced at each one (FRACTION_STEP_WEIGHT), and one of anything but a
    natural number ends with a fraction reduced (`reduction_work`).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import sympy

from .values import Unsupported

GCD_WEIGHT = 6  # a greatest common divisor of m and n words, in products of m by n words
ROOT_WEIGHT = 150_000  # a root's search for perfect powers, in products of its words by its words
STEP_WEIGHT = 10  # a step of a factorial or binomial loop, per word of its running product
FRACTION_STEP_WEIGHT = 40  # the same step on a fraction, reduced by a gcd with a small number


@dataclass
class _Meter:
    limit: int  # word products the operations inside `bounded_work` may take in all
    spent: int = 0


_meter: contextvars.ContextVar[_Meter | None] = contextvars.ContextVar("exact_work", default=None)


@contextlib.contextmanager
def bounded_work(limit: int):
    """Within it, an exact operation that would take the work done so far past `limit` word products is
    refused (Unsupported) before it is computed."""
    token = _meter.set(_Meter(limit))
    try:
        yield
    finally:
        _meter.reset(token)


def spend(estimate, *operands) -> None:
    """Count `estimate(*operands)` word products against the bound in force, if any (the estimate is not
    even computed without one), and refuse the operation past it."""
    meter = _meter.get()
    if meter is None:
        return
    meter.spent += estimate(*operands)
    if meter.spent > meter.limit:
        raise Unsupported(f"more than {meter.limit:,} word products of exact arithmetic")


def words(n: int) -> int:
    """The 64-bit words of an integer (at least one)."""
    return 1 + abs(n).bit_length() // 64


def size(value) -> int:
    """The words of the exact numbers in a sympy value: its rationals' numerators and denominators."""
    numbers = [value] if isinstance(value, sympy.Rational) else value.atoms(sympy.Rational)
    return max(1, sum(words(number.p) + (words(number.q) if number.q != 1 else 0) for number in numbers))


def _integers(a, b) -> bool:
    return isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer)


def sum_work(a, b) -> int:
    """a + b (or a - b): one pass for integers, else a reduced fraction."""
    if _integers(a, b):
        return size(a) + size(b)
    return GCD_WEIGHT * size(a) * size(b)


def product_work(a, b) -> int:
    """a * b: a product of their sizes for integers, else also the gcds of a reduced fraction."""
    work = size(a) * size(b)
    return work if _integers(a, b) else GCD_WEIGHT * work


def quotient_work(a, b) -> int:
    """a / b: a fraction reduced, even of two integers."""
    return GCD_WEIGHT * size(a) * size(b)


def power_work(result_bits: float) -> int:
    """A power whose result has (at most) `result_bits` bits, by repeated squaring."""
    return (1 + int(result_bits) // 64) ** 2


def root_work(value) -> int:
    """A root of the exact number `value` (of its numerator and denominator)."""
    return ROOT_WEIGHT * size(value) ** 2


def reduction_work(bits: float) -> int:
    """A fraction of (at most) `bits` bits reduced by a gcd of its numerator and denominator."""
    return GCD_WEIGHT * (1 + int(bits) // 64) ** 2


def loop_work(steps: int, result_bits: float, on_fractions: bool) -> int:
    """A factorial's or binomial coefficient's loop of `steps`, its running product growing to
    `result_bits` bits."""
    weight = FRACTION_STEP_WEIGHT if on_fractions else STEP_WEIGHT
    return weight * steps * (1 + int(result_bits) // 64)
