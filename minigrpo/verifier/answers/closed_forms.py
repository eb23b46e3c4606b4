"""Stage 2 of the loop, verify: whether two sympy values are equal, for `equivalence`.

In: two numbers without variables (closed forms) or two expressions with variables, as sympy
objects. Out: True or False, the same every time. Exact algebra decides first; evaluation at a
precision fit for the numbers involved decides the rest. It knows sympy values, not strings.

Closed forms: a difference sympy reduces to 0 is equal, one it reduces to a non-zero rational is
not (\\pi + 10^{-50} != \\pi). Anything else is evaluated, at PRECISION digits plus as many as the
smallest constant subexpression needs (45 more for 10^{-45} or \\sin(10^{-45})), and equal within a
margin of 10^-MARGIN_DIGITS relative both to the values and to that smallest number: so
\\sqrt{2 + 10^{-45}} != \\sqrt2. Only a near-identity of 40 digits among numbers of ordinary size
could pass for an equality.

Expressions with variables: a rational function with rational coefficients is decided exactly (its
difference cancels to 0 or not: x^3 + (x - 3/7)(x + 11/13)(x - 17/5) != x^3). Anything else is
compared at SAMPLE_POINTS points drawn per call from a generator seeded with a SHA-256 hash of the
two expressions: a pair always gets the same points (a call is reproducible), but there is no one
public set of points an answer could be fitted to (\\sin(455\\pi x) != 0). Each coordinate is a
rational n/q with a random 9-digit q and 0.5 <= |n/q| < 3; variable k is negative at the points
whose bit k % 2 is set, so the first two variables meet every combination of signs.

The branch rule: variables are real, and roots, fractional powers and logarithms take their
principal values, so \\sqrt{x^2} is |x|, not x. Two expressions must agree wherever either is real:
a point where one is real and the other is not is a difference (\\sqrt{x^2} against x at x < 0,
\\ln(x^2) against 2\\ln x). A point where neither is real lies outside both real domains; it is
skipped when a root or logarithm makes the branch matter (\\sqrt{1/n} ~ 1/\\sqrt{n}, equal for n > 0)
and compared as complex numbers otherwise (e^{ix} ~ \\cos x + i\\sin x). A point where either side
is undefined is skipped; at least 2 points must be compared.
"""

from __future__ import annotations

import hashlib
import math
import random

import sympy

# values within 10^-40 of each other, relative to their size and smallest number, are equal
MARGIN_DIGITS = 40
PRECISION = 60  # digits used to evaluate, beyond those the smallest number in the values needs
MAX_EXTRA_DIGITS = 1000  # a value with a number below 10^-1000 in it is not evaluated: not equal
SAMPLE_POINTS = 4  # points at which expressions with variables are compared
MIN_COMPARED = 2  # points that must be compared (not skipped) for expressions to be equal
SAMPLE_DENOMINATORS = (10**8, 10**9)  # each coordinate's denominator is drawn from this range
SIZE_DIGITS = 15  # digits used to find the size of a constant subexpression


# -- closed forms -------------------------------------------------------------------------------
def numbers_match(p, g) -> bool:
    """Two closed forms: exactly when sympy reduces their difference, else by value."""
    difference = p - g
    if difference == 0:
        return True
    if difference.is_Rational:
        return False  # exactly apart, however little
    extra = extra_digits(p, g)
    if extra is None:
        return False
    p_value = evaluate(p, PRECISION + extra)
    g_value = evaluate(g, PRECISION + extra)
    return p_value is not None and g_value is not None and close(p_value, g_value, extra)


def extra_digits(*values):
    """Digits beyond PRECISION that the smallest constant subexpression of `values` needs (45 for
    10^{-45}, 0 when none is below 1); None past MAX_EXTRA_DIGITS."""
    exponents = [
        _log10_size(node)
        for value in values
        for node in sympy.preorder_traversal(value)
        if isinstance(node, sympy.Expr) and node.is_number
    ]
    smallest = min((e for e in exponents if e is not None), default=0.0)
    extra = max(0, math.ceil(-smallest))
    return extra if extra <= MAX_EXTRA_DIGITS else None


def _log10_size(node):
    """log10 of |node| for a non-zero constant; None for 0 or what does not evaluate to a number."""
    if node.is_Rational:
        return None if node == 0 else math.log10(abs(node.p)) - math.log10(node.q)
    size = sympy.N(abs(node), SIZE_DIGITS)
    if not (isinstance(size, sympy.Float) and size.is_finite) or size == 0:
        return None
    return float(sympy.log(size, 10))


# -- expressions with variables -----------------------------------------------------------------
def functions_match(p, g) -> bool:
    """Two expressions with variables: exactly where algebra decides, else by the branch rule at
    seeded sample points. Different variables differ, but a side without any may equal one with
    some (\\sin^2 x + \\cos^2 x ~ 1)."""
    p_names = {s.name for s in p.free_symbols}
    g_names = {s.name for s in g.free_symbols}
    if p_names and g_names and p_names != g_names:
        return False
    difference = p - g
    if difference == 0:
        return True
    if difference.is_Rational:
        return False  # apart by a constant: \\sin x + 10^{-50} against \\sin x
    if _rational_function(difference):
        return sympy.cancel(difference) == 0
    extra = extra_digits(p, g)
    if extra is None:
        return False
    branches = has_branches(p) or has_branches(g)
    verdicts = [_agree(a, b, branches, extra) for a, b in values_at_samples(p, g, PRECISION + extra)]
    compared = [v for v in verdicts if v is not None]
    return len(compared) >= MIN_COMPARED and all(compared)


def _rational_function(expr) -> bool:
    """Whether expr is built of variables and rational numbers by +, * and integer powers alone."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow) and not node.exp.is_Integer:
            return False
        if not isinstance(node, (sympy.Symbol, sympy.Rational, sympy.Add, sympy.Mul, sympy.Pow)):
            return False
    return True


def _agree(a, b, branches: bool, extra: int):
    """True or False where this point decides, None where the branch rule skips it."""
    a_real = is_real(a, extra)
    b_real = is_real(b, extra)
    if a_real != b_real:
        return False  # real on one side only: \\sqrt{x^2} against x at x < 0
    if not a_real and branches:
        return None  # outside both real domains, where the branches chosen differ
    return close(a, b, extra)


def has_branches(expr) -> bool:
    """Whether a root, a fractional or symbolic power, or a logarithm makes the branch matter."""
    return expr.has(sympy.log) or any(not power.exp.is_integer for power in expr.atoms(sympy.Pow))


def values_at_samples(p, g, digits: int = PRECISION) -> list:
    """(p, g) evaluated at the seeded sample points; points where either is undefined skipped."""
    pairs = []
    for point in sample_points(p, g):
        p_value = evaluate(p.subs(point), digits)
        g_value = evaluate(g.subs(point), digits)
        if p_value is not None and g_value is not None:
            pairs.append((p_value, g_value))
    return pairs


def sample_points(p, g) -> list[dict]:
    """SAMPLE_POINTS assignments of the variables of p and g (variables of one name share a value),
    drawn from a generator seeded with a hash of the two expressions, in either order."""
    symbols = sorted(p.free_symbols | g.free_symbols, key=lambda s: s.name)
    names = sorted({s.name for s in symbols})
    generator = random.Random(_seed(p, g))
    points = []
    for j in range(SAMPLE_POINTS):
        by_name = {
            name: _coordinate(generator, negative=bool(j >> (k % 2) & 1)) for k, name in enumerate(names)
        }
        points.append({s: by_name[s.name] for s in symbols})
    return points


def _seed(p, g) -> bytes:
    texts = sorted([sympy.srepr(p), sympy.srepr(g)])
    return hashlib.sha256("\n".join(texts).encode()).digest()


def _coordinate(generator: random.Random, negative: bool):
    """A random rational n/q, 0.5 <= |n/q| < 3, with a 9-digit q."""
    q = generator.randrange(*SAMPLE_DENOMINATORS)
    n = generator.randrange(q // 2, 3 * q)
    return sympy.Rational(-n if negative else n, q)


# -- evaluation ---------------------------------------------------------------------------------
def evaluate(expr, digits: int = PRECISION):
    """expr as a complex number of `digits` digits, or None when it is not a finite number."""
    value = sympy.N(expr, digits)
    re, im = value.as_real_imag()
    if not all(isinstance(part, sympy.Number) and part.is_finite for part in (re, im)):
        return None
    return re + sympy.I * im if im != 0 else re


def margin(extra: int):
    """The relative margin for values whose smallest number needs `extra` digits: 10^-(40 + extra)."""
    return sympy.Float(10, PRECISION + extra) ** -(MARGIN_DIGITS + extra)


def close(a, b, extra: int = 0) -> bool:
    scale = max(abs(a), abs(b))
    return bool(scale == 0 or abs(a - b) <= margin(extra) * scale)


def is_real(value, extra: int = 0) -> bool:
    """Whether an evaluated value is real: its imaginary part is 0 or within the margin of its size."""
    imaginary = abs(sympy.im(value))
    return bool(imaginary == 0 or imaginary <= margin(extra) * abs(value))
