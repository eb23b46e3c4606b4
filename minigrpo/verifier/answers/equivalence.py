"""Stage 2 of the loop, verify: decide whether a predicted answer equals the gold answer.

In: two extracted answers as strings. Out: True or False, the same every time. This is the
unguarded reference: it can take long on hostile input, so callers use `math_reward`, which runs
it in a killable worker with a deadline. It knows values, not responses (see `extract`).

The rules, in order:
- spelled the same by `normalize.canonical` -> equal;
- either side not understood (`parse` raises) -> not equal (fail closed);
- an approximation is checked, then stands for what it approximates (`_approximated`): a number followed
  by \\approx and a written number must be that number to half a unit in the rounding's last digit,
  "\\frac13 \\approx 0.33" ~ 1/3 (0.0033 <= 0.005), "\\pi \\approx 3.14" ~ \\pi; "5 \\approx 100" and
  "\\frac13 \\approx 0.9" are wrong, and equal nothing but themselves written the same. A name on the left
  is assigned the rounding, "x \\approx 5" ~ "x = 5" ~ 5; anything else approximated ("2x \\approx 5",
  "\\frac13 \\approx \\frac{33}{100}") is not understood. Departure from Math-Verify, which reads the left
  side alone: "x = 1/3 \\approx 1.3" is 1/3 there;
- an equation between numbers is a computation, and stands for its result: "2 \\cdot 6 = 12" ~ 12;
- a name on one side only is dropped: "x = 5" ~ "5", "(p, q) = (3, 2)" ~ "(3, 2)"; assignments to
  two or more names facing a tuple are a point, in the order written: "x = 1, y = 2" ~ "(1, 2)"
  (and "p=5,q=2;p=7,q=2", whose names come round again, is two solutions: `parse`);
- numbers: exact rational equality for integers, decimals and fractions (3 = 3.0 = 6/2, but
  1000001 != 1000000 and 2^-98 != 2^-99); other closed forms (2\\sqrt2 = \\sqrt8, e^{i\\pi} = -1)
  exactly where sympy reduces their difference, else by evaluation with a 1e-40 margin relative to
  their size and to the smallest number in them (`closed_forms`): \\pi + 10^{-50} != \\pi;
- a decimal for a gold that is not a terminating decimal (1/3, \\sqrt2, \\pi) needs at least
  7 significant digits and must lie within one unit of its last digit: the only tolerance. A
  decimal gold facing an irrational prediction is read the same way (the gold is the rounding);
- expressions with variables: the same variables; exactly for rational functions with rational
  coefficients, else equal values at 4 sample points drawn from a generator seeded with a hash of
  the pair (`closed_forms`: reproducible, but no fixed public set of points). The branch rule:
  variables are real and roots take their principal value, so \\sqrt{x^2} is |x|, not x; the
  values must agree wherever either side is real (\\sqrt{1/n} ~ 1/\\sqrt{n}: both real for n > 0 only);
- equations and inequalities: the same relation, sides moved to one side and equal up to a
  constant factor (positive for inequalities): y = 2x + 3 ~ 3 + 2x = y, but x = 2 !~ y = 2;
- tuples in order, sets and bare lists in any order (repeats ignored) with the same size, so a
  one-element set or bracketed list is its element: \\{5\\} ~ [5] ~ (5) ~ 5, as Math-Verify 0.9.0
  judges them too (a departure from hendrycks MATH's string match, where \\{5\\} != 5);
  intervals with the same open/closed ends (an inequality on one variable against an interval
  counts as one; one in |x| as the intervals of x it allows: 1 <= |z| <= 2 ~ [-2, -1] \\cup [1, 2]),
  matrices elementwise, a column vector as a tuple.
A hedge ("3 or 5", \\pm 3, a list of two or more values for a single gold, an interval for a
number) never equals a single value.
"""

from __future__ import annotations

import re

import sympy

from .arithmetic import make_set
from .closed_forms import (
    PRECISION,
    close,
    evaluate,
    extra_digits,
    functions_match,
    numbers_match,
    values_at_samples,
)
from .normalize import canonical
from .parse import parse
from .values import Approximation, Interval, Parsed, Relation, Set, Text, Tuple, Union, Unsupported

MAX_ANSWER_CHARS = 20_000  # longer answers are compared as plain strings only
MIN_SIGNIFICANT_DIGITS = 7  # a decimal approximation of a non-terminating gold needs this many
_NAME_OPS = ("=", "in")
# each inequality operator read from the other side: a < b is b > a
_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PLAIN_NUMBER = re.compile(r"[\d\s.,]*\d[\d\s.,]*")  # digits, separators and spaces only


def answers_match(pred: str, gold: str) -> bool:
    """Whether the extracted answer `pred` equals `gold` by the rules in the module docstring."""
    if not (isinstance(pred, str) and isinstance(gold, str)):
        return False
    # the same number(s), written the same:
    if pred.strip() == gold.strip() and _PLAIN_NUMBER.fullmatch(pred):
        return True  # equal before anything costly (normalising long runs of digits is slow)
    if max(len(pred), len(gold)) > MAX_ANSWER_CHARS:
        return False
    p = canonical(pred)
    g = canonical(gold)
    if not g or not p:
        return False
    if p == g:
        return True
    try:
        gold_value = parse(g)
        pred_value = parse(p)
    except Unsupported:
        return False
    try:
        return bool(values_match(pred_value, gold_value))
    except Exception:  # a sympy operation that refuses these values: not shown equal
        return False


def values_match(pred: Parsed, gold: Parsed) -> bool:
    p = _settled(pred.value)
    g = _settled(gold.value)
    if p is None or g is None:
        return False  # a wrong rounding: a wrong answer, whatever it is compared with
    return _match(p, g, (pred.decimals, gold.decimals))


def _match(p, g, decimals) -> bool:
    p = _result(p)
    g = _result(g)
    if isinstance(p, Relation) != isinstance(g, Relation):
        p = _drop_name(p)
        g = _drop_name(g)
    if isinstance(p, Tuple) != isinstance(g, Tuple):
        p = _as_point(p)
        g = _as_point(g)
    if isinstance(p, Text) or isinstance(g, Text):
        return isinstance(p, Text) and isinstance(g, Text) and p.words == g.words
    if _interval_like(p, g) or _interval_like(g, p):
        return _intervals_match(_as_intervals(p), _as_intervals(g), decimals)
    if isinstance(p, Set) or isinstance(g, Set):
        return _unordered_match(_items(p), _items(g), decimals)
    if isinstance(p, Relation) or isinstance(g, Relation):
        return isinstance(p, Relation) and isinstance(g, Relation) and _relations_match(p, g)
    if isinstance(p, Tuple) or isinstance(g, Tuple):
        p_items = _sequence(p)
        g_items = _sequence(g)
        return p_items is not None and g_items is not None and _ordered_match(p_items, g_items, decimals)
    return _scalars_match(p, g, decimals)


# -- approximations -----------------------------------------------------------------------------
def _settled(value):
    """The value with each approximation replaced by what it stands for (`_approximated`); None when
    one of them is wrong."""
    if isinstance(value, Approximation):
        return _approximated(value)
    parts = _parts(value)
    if parts is None:
        return value  # a number, an expression, a matrix or words: no approximation inside
    settled = [_settled(part) for part in parts]
    if any(part is None for part in settled):
        return None
    if isinstance(value, Relation):
        return Relation(value.op, *settled)
    if isinstance(value, Interval):
        return Interval(*settled, value.left_closed, value.right_closed)
    if isinstance(value, Tuple):
        return Tuple(tuple(settled), value.brackets)
    if isinstance(value, Union):
        return Union(tuple(settled))
    return make_set(settled)  # two items may now be one: 1/3 and 1/3 \approx 0.33


def _parts(value):
    """The values a structure holds, in order; None for anything else."""
    if isinstance(value, Relation):
        return [value.lhs, value.rhs]
    if isinstance(value, Interval):
        return [value.lo, value.hi]
    if isinstance(value, (Tuple, Set)):
        return list(value.items)
    if isinstance(value, Union):
        return list(value.parts)
    return None


def _approximated(approximation: Approximation):
    """'\\frac13 \\approx 0.33' -> 1/3: a number, when each rounding is within half a unit of its last
    digit of it; 'x \\approx 5' -> x = 5: a name is assigned its first rounding, and any later one is
    checked against that; None for a wrong rounding or for anything else approximated."""
    value = _settled(approximation.value)
    roundings = list(approximation.roundings)
    if value is not None and _is_name(value):
        rounded, _ = roundings.pop(0)
        settled = Relation("=", value, rounded)
        value = rounded
    elif isinstance(value, sympy.Expr) and _constant(value):
        settled = value
    else:
        return None
    return settled if all(_within(rounded, value, margin) for rounded, margin in roundings) else None


# -- names --------------------------------------------------------------------------------------
def _result(value):
    """'5 \\times 6 \\times 4 = 120' -> 120: an equation between numbers is a computation and its result."""
    if isinstance(value, Relation) and value.op == "=" and _constant(value.lhs) and _constant(value.rhs):
        return value.rhs
    return value


def _constant(value) -> bool:
    return isinstance(value, sympy.Basic) and not value.free_symbols


def _drop_name(value):
    """'x = 5' -> 5, '(p, q) = (3, 2)' -> (3, 2), 'x \\in [1, 2]' -> [1, 2]; anything else unchanged."""
    if isinstance(value, Relation) and value.op in _NAME_OPS and _is_name(value.lhs):
        return value.rhs
    return value


def _as_point(value):
    """'p = 5, q = 2' -> (5, 2): assignments to two or more distinct names, in the order written,
    facing a tuple; anything else unchanged."""
    if not isinstance(value, Set) or len(value.items) < 2:
        return value
    names = [
        item.lhs
        for item in value.items
        if isinstance(item, Relation) and item.op == "=" and isinstance(item.lhs, sympy.Symbol)
    ]
    if len(names) != len(value.items) or len(set(names)) != len(names):
        return value
    return Tuple(tuple(item.rhs for item in value.items), "()")


def _is_name(value) -> bool:
    """A variable, a tuple of them, or a product/ratio/absolute value of them: x, (p, q), AB, V_1/V_2,
    |AB|."""
    if isinstance(value, Tuple):
        return all(map(_is_name, value.items))
    if isinstance(value, sympy.Symbol):
        return True
    if isinstance(value, sympy.Pow):
        return _is_name(value.base) and value.exp in (1, -1)
    if isinstance(value, (sympy.Mul, sympy.Abs)):
        return all(map(_is_name, value.args))
    return False


# -- structures ---------------------------------------------------------------------------------
def _items(value) -> list:
    return list(value.items) if isinstance(value, Set) else [value]


def _unordered_match(p_items, g_items, decimals) -> bool:
    return _pair_off(p_items, g_items, lambda p, g: _match(p, g, decimals))


def _pair_off(p_items, g_items, same) -> bool:
    """Whether the two lists pair off one to one under `same`, in any order (same size, no reuse)."""
    if len(p_items) != len(g_items):
        return False
    unused = list(p_items)
    for g in g_items:
        hit = next((i for i, p in enumerate(unused) if same(p, g)), None)
        if hit is None:
            return False
        unused.pop(hit)
    return True


def _ordered_match(p_items, g_items, decimals) -> bool:
    return len(p_items) == len(g_items) and all(_match(p, g, decimals) for p, g in zip(p_items, g_items))


def _sequence(value):
    """Elements of a tuple or of a row/column vector; None for anything else."""
    if isinstance(value, Tuple):
        return list(value.items)
    if isinstance(value, sympy.MatrixBase) and 1 in value.shape:
        return list(value)
    return None


def _as_intervals(value):
    """A list of intervals for an interval, a union, an open pair or a one-variable inequality."""
    if isinstance(value, Interval):
        return [value]
    if isinstance(value, Union):
        parts = [_as_intervals(p) for p in value.parts]  # each part's intervals, or None
        if any(p is None for p in parts):
            return None
        return [interval for intervals in parts for interval in intervals]
    if isinstance(value, Tuple) and len(value.items) == 2 and value.brackets == "()":
        return [Interval(value.items[0], value.items[1], False, False)]
    return _inequality_intervals(value)


def _interval_like(a, b) -> bool:
    """Whether a is an interval, or an inequality compared with something that is not one."""
    if isinstance(a, (Interval, Union)):
        return True
    return _inequality_intervals(a) is not None and isinstance(b, (Tuple, Interval, Union))


def _inequality_intervals(value):
    """The intervals an inequality in one variable allows: 'x > 2' -> (2, oo); '1 <= |z| <= 2'
    -> [-2, -1] and [1, 2]; anything else (or an empty set) -> None."""
    bounds = _inequality_bounds(value)
    if bounds is None:
        return None
    var, interval = bounds
    if isinstance(var, sympy.Abs) and isinstance(var.args[0], sympy.Symbol):
        return _absolute_value_intervals(interval)
    return [interval]


def _absolute_value_intervals(bounds: Interval):
    """The z with |z| in `bounds`, z real: [-hi, -lo] and [lo, hi], one interval when lo <= 0."""
    lo = bounds.lo
    hi = bounds.hi
    if not (hi.is_extended_positive or (hi.is_zero and bounds.right_closed)):
        return None  # nothing, or a sign sympy cannot decide: not understood
    if lo.is_extended_negative or (lo.is_zero and bounds.left_closed):
        return [Interval(-hi, hi, bounds.right_closed, bounds.right_closed)]
    if not (lo.is_extended_positive or lo.is_zero):
        return None
    return [Interval(-hi, -lo, bounds.right_closed, bounds.left_closed), bounds]


def _inequality_bounds(value):
    """'x > 2' -> (x, (2, oo)); '1 <= f(x) < 3' (a chain) -> (f(x), [1, 3)); anything else -> None."""
    relations = value.items if isinstance(value, Set) else (value,)
    lo = -sympy.oo
    hi = sympy.oo
    lo_closed = False
    hi_closed = False
    names = set()
    for rel in relations:
        if not isinstance(rel, Relation) or rel.op not in ("<", "<=", ">", ">="):
            return None
        if not all(isinstance(side, sympy.Expr) for side in (rel.lhs, rel.rhs)):
            return None
        op = rel.op
        var = rel.lhs
        bound = rel.rhs
        if bound.free_symbols and not var.free_symbols:  # the bound on the left: 2 < x is read as x > 2
            op = _MIRRORED[op]
            var = rel.rhs
            bound = rel.lhs
        if not var.free_symbols or bound.free_symbols:
            return None
        names.add(var)
        if op in (">", ">="):
            lo = bound
            lo_closed = op == ">="
        else:
            hi = bound
            hi_closed = op == "<="
    if len(names) != 1:
        return None  # no relation, or bounds on different expressions
    return names.pop(), Interval(lo, hi, lo_closed, hi_closed)


def _intervals_match(p_parts, g_parts, decimals) -> bool:
    if p_parts is None or g_parts is None:
        return False
    return _pair_off(p_parts, g_parts, lambda p, g: _interval_match(p, g, decimals))


def _interval_match(p: Interval, g: Interval, decimals) -> bool:
    return (
        (p.left_closed, p.right_closed) == (g.left_closed, g.right_closed)
        and _match(p.lo, g.lo, decimals)
        and _match(p.hi, g.hi, decimals)
    )


# -- relations ----------------------------------------------------------------------------------
_FLIPPED = {"<": ">", "<=": ">="}


def _relations_match(p: Relation, g: Relation) -> bool:
    """Same relation, and (lhs - rhs) of one is a constant multiple of the other's."""
    p_op, p_side = _one_sided(p)
    g_op, g_side = _one_sided(g)
    if p_op != g_op or p_side is None or g_side is None:
        return False
    if p_side == g_side or (p_op in ("=", "!=") and p_side == -g_side):
        return True
    extra = extra_digits(p_side, g_side)
    ratios = _ratios_at_samples(p_side, g_side, extra) if extra is not None else []
    if not ratios or any(r == 0 for r in ratios):
        return False
    if p_op in (">", ">=") and not all(r.is_real and r > 0 for r in ratios):
        return False
    return all(close(r, ratios[0], extra) for r in ratios[1:])


def _one_sided(rel: Relation):
    """('>', lhs - rhs) for lhs > rhs; x < y becomes ('>', y - x); None for non-expressions."""
    lhs = rel.lhs
    rhs = rel.rhs
    if not all(isinstance(side, sympy.Expr) for side in (lhs, rhs)) or rel.op == "in":
        return rel.op, None
    if rel.op in _FLIPPED:
        return _FLIPPED[rel.op], rhs - lhs
    return rel.op, lhs - rhs


def _ratios_at_samples(p, g, extra: int) -> list:
    if _names(p) != _names(g):
        return []
    ratios = []
    for p_value, g_value in values_at_samples(p, g, PRECISION + extra):
        if g_value != 0:
            ratios.append(p_value / g_value)
    return ratios if len(ratios) >= 2 or not (p.free_symbols or g.free_symbols) else []


# -- scalars ------------------------------------------------------------------------------------
def _scalars_match(p, g, decimals) -> bool:
    """decimals: (pred's, gold's) map from each decimal literal's value to its written precision."""
    if not (isinstance(p, sympy.Basic) and isinstance(g, sympy.Basic)):
        return False
    if isinstance(p, sympy.MatrixBase) or isinstance(g, sympy.MatrixBase):
        return (
            isinstance(p, sympy.MatrixBase)
            and isinstance(g, sympy.MatrixBase)
            and p.shape == g.shape
            and all(_scalars_match(a, b, decimals) for a, b in zip(p, g))
        )
    if p == g:
        return True
    if _infinite(p) or _infinite(g):
        return False
    if p.free_symbols or g.free_symbols:
        return functions_match(p, g)
    pred_decimals, gold_decimals = decimals
    if p.is_Rational and g.is_Rational and (p not in pred_decimals or _terminates(g)):
        return False  # exact numbers, and not equal
    if p in pred_decimals and not _terminates(g):
        return _approximates(p, pred_decimals[p], g)
    if g in gold_decimals and not p.is_Rational:
        return _approximates(g, gold_decimals[g], p)  # the gold is itself a rounded irrational
    return numbers_match(p, g)


def _infinite(x) -> bool:
    return x.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)


def _terminates(g) -> bool:
    """Whether g is a rational with a terminating decimal expansion (denominator 2^a 5^b)."""
    if not g.is_Rational:
        return False
    q = g.q
    for prime in (2, 5):
        while q % prime == 0:
            q //= prime
    return q == 1


def _approximates(p, digits_and_ulp, g) -> bool:
    """A written decimal p for a non-terminating g: enough digits, within one unit of the last."""
    digits, ulp = digits_and_ulp
    return digits >= MIN_SIGNIFICANT_DIGITS and _within(p, g, ulp)


def _within(p, g, margin) -> bool:
    """Whether the written number p lies within `margin` of g: exactly when g is rational, else by
    g's value at PRECISION digits."""
    if g.is_Rational:
        return bool(abs(p - g) <= margin)
    g_value = evaluate(g)
    return g_value is not None and bool(abs(sympy.Float(p, PRECISION) - g_value) <= margin)


def _names(expr) -> set:
    return {s.name for s in expr.free_symbols}
