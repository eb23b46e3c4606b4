"""The arithmetic step checker: which `expression = number` steps it finds, their offsets, exact
correctness, relevance to the problem's numbers, and bounds on hostile text."""

import operator
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minigrpo.tasks.synthetic import generate
from minigrpo.verifier import STEP_REWARDS, check_steps
from minigrpo.verifier.steps import MAX_SCAN_CHARS, MAX_STEPS

EXAMPLES = settings.default.max_examples / 100  # 1 under conftest's "ci" profile, 10 under "explore"


def written(completion: str, problem: str = "") -> list[str]:
    """Each step as written in `completion`."""
    return [completion[step.start : step.end] for step in check_steps(completion, problem)]


# -- the synthetic tasks' own solutions -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["arithmetic", "linear", "fractions", "countdown"])
@pytest.mark.parametrize("difficulty", [2, 3])
def test_worked_solutions_are_correct_and_relevant(kind, difficulty):
    for problem in generate(kind, 50, difficulty=difficulty):
        steps = check_steps(problem.solution, problem.question)
        # every ;-separated part with an operator is one step, the final ####answer none
        # (linear: "3x=20-5=15" and "x=15/3=5" are one step each)
        assert len(steps) == problem.solution.count(";"), problem.solution
        for step in steps:
            assert (step.correct, step.relevant, step.reward) == (True, True, 1.0), (problem, step)


def test_synthetic_steps_read_as_expected():
    steps = check_steps("23*6=138;47+138=185;####185", "47+23*6\n")
    assert [(s.expression, s.claimed) for s in steps] == [("23*6", 138), ("47+138", 185)]
    linear = check_steps("11x=-106-15=-121;x=-121/11=-11;####-11", "11x+15=-106")
    assert [(s.expression, s.claimed, s.reward) for s in linear] == [
        ("-106-15", -121, 1.0),
        ("-121/11", -11, 1.0),  # 121 is the earlier result -121: relevance compares magnitudes
    ]
    (fraction,) = check_steps("1/6-2/2=-5/6;####-5/6", "1/6-2/2")
    assert (fraction.claimed, fraction.correct) == (Fraction(-5, 6), True)


# -- correctness, relevance, rewards --------------------------------------------------------------------
def test_a_wrong_step_is_found_wrong():
    steps = check_steps("65*7=445;445+12=457;####457", "65*7+12")
    assert [(s.correct, s.relevant, s.reward) for s in steps] == [(False, True, -1.0), (True, True, 1.0)]
    assert steps[0].claimed == 445  # a later step may build on a wrong result: it is judged on its own


def test_relevance_needs_every_operand_from_the_problem_or_an_earlier_step():
    (step,) = check_steps("1+1=2", "34+16*5\n")
    assert (step.correct, step.relevant, step.reward) == (True, False, STEP_REWARDS["irrelevant"])
    steps = check_steps("16*5=80;34+80=114;####114", "34+16*5\n")
    assert [(s.correct, s.relevant, s.reward) for s in steps] == [(True, True, 1.0)] * 2
    assert not check_steps("34+81=115", "34+16*5\n")[0].relevant  # 81 comes from nowhere
    assert check_steps("0.2*50=10", "20% of 50")[0].relevant  # p% is also the number p/100
    assert check_steps(r"\frac{3}{4} \cdot 8 = 6", "What is 3/4 of 8?")[0].relevant


def test_wrong_dominates_irrelevant():
    (step,) = check_steps("2+2=5", "")
    assert (step.correct, step.relevant, step.reward) == (False, False, STEP_REWARDS["wrong"])


def test_rewards():
    assert STEP_REWARDS == {"correct": 1.0, "irrelevant": 0.0, "wrong": -1.0}


# -- formats ----------------------------------------------------------------------------------------------
def test_gsm8k_annotation_is_one_step():
    solution = (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
    )
    question = (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
    )
    steps = check_steps(solution, question)
    assert written(solution) == ["48/2=24", "48+24=72"]
    assert all(s.correct for s in steps)
    assert [s.relevant for s in steps] == [False, True]  # "half" is a word, not the number 2


def test_steps_in_prose():
    completion = "She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in all. Then 72 - 80 = -8."
    assert written(completion) == ["48 / 2 = 24", "48 + 24 = 72", "72 - 80 = -8"]
    assert written("**Step 1:** 3+4=7") == ["3+4=7"]  # markdown bold is not a power
    assert written("The result is -3+5=2.") == ["-3+5=2"]


def test_latex_forms():
    completion = r"We get $\frac{3}{4} \cdot 8 = 6$, then $3 \times 4 = 12$ and \(12 \div 4 = 3\)."
    steps = check_steps(completion, "3/4 of 8; 3, 4, 12")
    assert [s.expression for s in steps] == [r"\frac{3}{4} \cdot 8", r"3 \times 4", r"12 \div 4"]
    assert [s.claimed for s in steps] == [6, 12, 3]
    assert all(s.correct and s.relevant for s in steps)
    (fraction,) = check_steps(r"$\frac{1}{2} + \frac{1}{4} = \frac{3}{4}$", "1/2 and 1/4")
    assert (fraction.claimed, fraction.correct, fraction.relevant) == (Fraction(3, 4), True, True)
    assert not check_steps(r"\left(3+4\right) \times 2 = 15", "")[0].correct


def test_unicode_operators():
    completion = "3 × 4 = 12, 12 ÷ 4 = 3, 10 − 14 = −4 and 3·4=12"
    steps = check_steps(completion, "3 4 10 14")
    assert [s.claimed for s in steps] == [12, 3, -4, 12]
    assert all(s.correct and s.relevant for s in steps)


def test_numbers():
    steps = check_steps("1.5*4=6; 3-10=-7; (2+3)*4=20; 7/2=3.5; $1,200 + $300 = $1,500", "")
    assert [s.claimed for s in steps] == [6, -7, 20, Fraction(7, 2), 1500]
    assert all(s.correct for s in steps)
    assert [s.correct for s in check_steps("1/3+1/3=2/3; 1/3+1/3=0.67", "")] == [True, False]  # exact


def test_not_steps():
    assert check_steps("She had 12 apples and 5 pears, 17 in all (12 + 5).", "12 5") == []
    for text in ["x=5", "185=185", "-5=-5", "3x=9", "3x+2=8", "x + 3 = 7", "2x - 3*2 = 7", "f(2)+3=5"]:
        assert check_steps(text, "") == [], text  # no operator, or a variable on the left
    for text in ["2^3+1=9", "2**3=8", "2 dozen * 12 = 24", "3+4==7", "3+4 <= 7", "3(4+5)=27"]:
        assert check_steps(text, "") == [], text  # more on the left than + - * / of numbers
    for text in ["2+3=4+1", "2*3 = 24 / 4", "3*4=12cm", "50*2=100%", "5+1=3!", "####185"]:
        assert check_steps(text, "") == [], text  # the right side is more than a number


def test_chains():
    assert written("3x=14-5=9") == ["14-5=9"]
    assert written("2+3=5=5") == ["2+3=5"]
    assert written("x = 3 + 4 = 7") == ["3 + 4 = 7"]
    assert written("3+4 = 7 - 2 = 5") == ["7 - 2 = 5"]
    assert written("1+2=6/2=3") == ["1+2=6/2", "6/2=3"]  # a fraction in the middle: both links are steps


def test_offsets_and_order():
    completion = "First, 23*6 = 138.\nThen $47 + 138 = 185$; so x=185.\n#### 185"
    steps = check_steps(completion, "47+23*6")
    assert [completion[s.start : s.end] for s in steps] == ["23*6 = 138", "47 + 138 = 185"]
    assert [s.expression for s in steps] == ["23*6", "47 + 138"]
    assert steps[0].end <= steps[1].start
    assert all(completion[s.start : s.end].startswith(s.expression) for s in steps)


# -- bounds -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "completion",
    [
        "1+" * 500_000,
        "(" * 1_000_000,
        "9" * 10_000 + "+1=10",
        "1+1=" + "9" * 10_000,
        "(" * 5_000 + "1" + ")" * 5_000 + "+1=2",
        "1+1=2;" * 200_000,
        "\\frac{" * 200_000,
        "1/0=1",
    ],
    ids=["1+", "(((", "long-operand", "long-result", "deep", "many-steps", "frac", "divide-by-zero"],
)
def test_hostile_input_returns_fast(completion):
    start = time.process_time()  # CPU time: a busy machine's waits do not count, a quadratic scan would
    steps = check_steps(completion, completion)
    assert time.process_time() - start < 2.0
    assert len(steps) <= MAX_STEPS


def test_limits_make_steps_wrong_or_no_step():
    assert [s.correct for s in check_steps("1/0=1; 2/(1-1)=0", "")] == [False, False]
    operands_too_long = "9" * 60 + "-" + "9" * 60 + "=0"
    assert [s.reward for s in check_steps(operands_too_long, "")] == [-1.0]
    assert check_steps("1+1=" + "9" * 60, "") == []  # a result too long has no Fraction to report
    assert [s.correct for s in check_steps("(" * 30 + "1" + ")" * 30 + "+1=2", "")] == [False]  # too deep
    assert len(check_steps("1+1=2;" * 1_000, "")) == MAX_STEPS
    assert check_steps("x" * MAX_SCAN_CHARS + "1+1=2", "") == []  # past the scan


# -- properties -------------------------------------------------------------------------------------------
OPERATORS = {
    "+": "+",
    "-": "-",
    "−": "-",
    "*": "*",
    "×": "*",
    r"\cdot": "*",
    "/": "/",
    "÷": "/",
    r"\div": "/",
}


ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def combined(left, right, written):
    """(text, exact value) of `left written right`, each side in parentheses or a \\frac's braces."""
    (left_text, a), (right_text, b) = left, right
    meaning = OPERATORS.get(written, "/")
    if meaning == "/" and b == 0:
        return f"({left_text})*({right_text})", Fraction(0)
    value = ARITHMETIC[meaning](a, b)
    if written == r"\frac":
        return rf"\frac{{{left_text}}}{{{right_text}}}", value
    return f"({left_text}) {written} ({right_text})", value


def as_written(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return rf"{'-' if value < 0 else ''}\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


NUMBER = st.integers(0, 999).map(lambda n: (str(n), Fraction(n)))
EXPRESSION = st.recursive(
    NUMBER,
    lambda inner: st.builds(combined, inner, inner, st.sampled_from([*OPERATORS, r"\frac"])),
    max_leaves=6,
)
COMPOUND = st.builds(combined, EXPRESSION, EXPRESSION, st.sampled_from([*OPERATORS, r"\frac"]))


@settings(max_examples=max(1, round(200 * EXAMPLES)), deadline=None)
@given(expression=COMPOUND, off_by=st.sampled_from([0, 0, 1, Fraction(1, 7)]))
def test_a_written_expression_is_checked_exactly(expression, off_by):
    text, value = expression
    (step,) = check_steps(f"so {text} = {as_written(value + off_by)}.", "")
    assert (step.expression, step.claimed, step.correct) == (text, value + off_by, off_by == 0)


NOISE = st.sampled_from(
    ["x", "3x", " ", ";", "\n", "$", "<<", ">>", "=", "(", "**", "^", "1,200", "-", "#### "]
)
STEPS = st.builds(  # right or (mostly) wrong
    lambda expression, equals, number: expression[0] + equals + number[0],
    COMPOUND,
    st.sampled_from(["=", " = ", "=-"]),
    NUMBER,
)
TEXT = st.lists(STEPS | NOISE, max_size=12).map("".join) | st.text(max_size=300)


@settings(
    max_examples=max(1, round(300 * EXAMPLES)), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(text=TEXT, problem=st.text(max_size=50))
def test_never_raises_and_offsets_are_ordered(text, problem):
    steps = check_steps(text, problem)
    for step in steps:
        assert 0 <= step.start < step.end <= len(text)
        assert text[step.start : step.end].startswith(step.expression)
        kind = "wrong" if not step.correct else "correct" if step.relevant else "irrelevant"
        assert step.reward == STEP_REWARDS[kind]
    for before, after in zip(steps, steps[1:]):
        assert before.start < after.start and before.end < after.end


def test_two_unary_minuses_make_a_plus():
    """`--3` is 3: the signs of a run of unary minuses cancel in pairs."""
    (step,) = check_steps("--3+5=8", "5 and 3")
    assert step.correct and step.claimed == 8
