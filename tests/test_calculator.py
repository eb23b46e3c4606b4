"""The calculator tool: exact arithmetic under a deterministic budget, in worker processes that a call
running too long is stopped in, so that its answer depends on the call alone and no call can stall the
trainer or keep it from exiting. The budget's verdicts are checked in this process (`verdict`), where no
CPU timer races them: they hold on a machine of any speed."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import sympy
import sympy.core.cache
from helpers import ROOT, tiny_tokenizer

import minigrpo.tools.calculator_pool as calculator_module
import minigrpo.tools.calculator_worker as calculator_worker
import minigrpo.verifier.answers.arithmetic as arithmetic
from minigrpo.model import Tokenizer
from minigrpo.tools import CalculatorError, ToolError, ToolRunner, calculator
from minigrpo.verifier import Unsupported, bounded_work, checked_mul

CALC_MARKERS = ("<calc>", "</calc>", "<out>", "</out>")
BENIGN = {
    "347*56": "19432",
    r"\sum_{k=1}^{100} k": "5050",
    r"\prod_{k=1}^{5} k": "120",
    "1/3+1/6": "1/2",
    "sqrt(2)": "1.41421356237310",
    "2^10": "1024",
    r"\sum_{k=1}^{10} \frac{1}{k}": "7381/2520",
    "3-5*2": "-7",
}
_FIVE_BINOMIALS = "+".join(rf"\binom{{{100000 - i}}}{{50000}}" for i in range(5))
HOSTILE = [
    r"\sum_{k=1}^{10^9} \sin k",
    r"\sum_{k=0}^{60} 2^{2^k}",
    r"\prod_{k=1}^{10^9} k",
    r"\sum_{k=1}^{10^{9}} \frac{1}{k^2}",
    r"\prod_{k=1}^{300} 3^{1000}",
    r"\sum_{m=1}^{1000}\sum_{n=1}^{1000} \sin(mn)",
    r"\sum_{k=1}^{200} \frac{1}{10^{20}+k}",
    r"\sqrt{10^{5000}+1}",  # sympy's root of a 5,000-digit number took seconds: refused up front
]
RUN_CALLS = """
import json, os, resource, signal, sys, time
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a runaway call may not take the machine
import minigrpo.tools.calculator_pool as calculator_pool
from minigrpo.model import Tokenizer
from minigrpo.tools import ToolRunner

tokenizer = Tokenizer.from_directory(sys.argv[1])
expressions = json.loads(sys.argv[2])
calculator_pool.PROCESSES = 2  # every call is refused or answered at once: two workers suffice
runner = ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=4)
started = time.monotonic()
for request, expression in enumerate(expressions):
    runner.start(request, tokenizer.encode(f"<calc>{expression}</calc>"))
answers = {}
while len(answers) < len(expressions) and time.monotonic() - started < 30:
    for request in set(range(len(expressions))) - set(answers):
        if runner.poll(request) is not None:
            answers[request] = [runner.calls(request)[0].response, time.monotonic() - started]
    time.sleep(0.01)
pool = calculator_pool._shared_pool()
for worker in pool.idle:  # stopped, as a worker stuck in C code: the next call waits on it until exit
    os.kill(worker.process.pid, signal.SIGSTOP)
idle = len(pool.idle)
runner.start(len(expressions), tokenizer.encode("<calc>" + sys.argv[3] + "</calc>"))
while len(pool.idle) == idle:  # until a stopped worker holds the call
    time.sleep(0.01)
print(json.dumps({"answers": answers, "exiting": time.time()}), flush=True)
"""


@pytest.fixture(scope="module")
def tokenizer_directory(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("calc-tokenizer"))
    tiny_tokenizer(directory, CALC_MARKERS)
    return directory


@pytest.fixture(scope="module")
def tokenizer(tokenizer_directory):
    tokenizer = Tokenizer.from_directory(tokenizer_directory)
    calculator("1")  # a worker started: the tests below time calls, not sympy's import
    return tokenizer


RUNAWAY_SECONDS = 60  # a verdict still computing after this long fails its test rather than hanging it


def verdict(expression: str) -> str:
    """The budget's answer to `expression`, computed in this process, where no CPU timer can answer
    first: its value, or "error: " and the reason it is refused."""

    def runaway(signum, frame):
        pytest.fail(f"{expression!r} still computing after {RUNAWAY_SECONDS} s: the budget let it through")

    previous = signal.signal(signal.SIGALRM, runaway)
    signal.alarm(RUNAWAY_SECONDS)
    try:
        return calculator_worker.evaluate(expression)
    except CalculatorError as error:
        return f"error: {error}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def observations(tokenizer, expressions: list[str], patience: float = 30.0) -> list[str]:
    """The observation of each expression as its own calc call, all made at once, as text."""
    with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=4) as runner:
        for request, expression in enumerate(expressions):
            runner.start(request, tokenizer.encode(f"<calc>{expression}</calc>"))
        answered, deadline = {}, time.monotonic() + patience
        while len(answered) < len(expressions):
            assert time.monotonic() < deadline, "some calls were never answered"
            for request in set(range(len(expressions))) - set(answered):
                observation = runner.poll(request)
                if observation is not None:
                    answered[request] = tokenizer.decode(observation)
            time.sleep(0.005)
    return [answered[request] for request in range(len(expressions))]


def test_hostile_calls_beside_benign_ones_are_bounded_and_the_interpreter_exits(tokenizer_directory):
    """Eight hostile calls among eight benign ones, in a trainer-like process: the benign are answered
    exactly, the hostile with an error in bounded time, and the process exits at once with a call stuck
    in a worker (its worker killed, no thread of it waited for)."""
    expressions = [e for pair in zip(BENIGN, HOSTILE) for e in pair]  # interleaved
    result = subprocess.run(
        [sys.executable, "-c", RUN_CALLS, tokenizer_directory, json.dumps(expressions), "347*56"],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    exited = time.time()
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    answers = {expressions[int(request)]: answer for request, answer in report["answers"].items()}
    assert {e: answers[e][0] for e in BENIGN} == BENIGN
    assert all(answers[e][0].startswith("error: ") for e in HOSTILE), {e: answers[e][0] for e in HOSTILE}
    assert answers[HOSTILE[-1]][0].startswith("error: a root of a number of more than 2000 bits")
    assert max(seconds for _, seconds in answers.values()) < 15
    # the interpreter's exit, its workers' included (they hold its stderr): well short of KILL_AFTER, the
    # wall time the stuck call would have been waited for, however slow the machine's own exit
    assert exited - report["exiting"] < calculator_module.KILL_AFTER / 2


@pytest.mark.parametrize(
    "expression, error",
    [
        (r"\sum_{k=1}^{10^9} \sin k", "more than 500 operations in sums and products"),
        (r"\sum_{k=1}^{300} (\sqrt{k}+1)", "more than 500 operations"),  # two operations a term
        (r"\sum_{m=1}^{100}\sum_{n=1}^{100} \sin(mn)", "more than 500 operations"),  # nested, counted
        # a term of two word operations, ten million times: the work, not the count of terms
        (r"\sum_{k=1}^{10^7} k", "more than 2,000,000 word operations in sums and products"),
        (r"\prod_{k=1}^{10^9} k", "more than 2,000,000 word operations"),
        (r"\sum_{k=1}^{10^{9}} \frac{1}{k^2}", "more than 2,000,000 word operations"),
        (r"\sum_{k=1}^{100000} k^{50}", "more than 2,000,000 word operations"),  # 51 coefficients a term
        # an inner sum started once per term: 1,000 times reading its term, counted before the first
        (r"\sum_{m=1}^{1000}\sum_{n=1}^{1000} \sin(mn)", "more than 2,000,000 word operations"),
        (r"\sqrt{10^{5000}+1}", "a root of a number of more than 2000 bits"),  # sympy's perfect powers
        (r"\ln(10^{20000}+1)", "ln of a number of more than 2000 bits"),  # minutes on some hash seeds
        (r"\log_{10^{1000}} 5", "log of a number of more than 2000 bits"),
        (r"\sum_{k=0}^{60} 2^{2^k}", "result too large"),  # a term's power, estimated as the parser does
        (r"\prod_{k=1}^{300} 3^{1000}", "result too large"),  # the partial product, as it grows
        (r"\sum_{k=1}^{200} \frac{1}{10^{20}+k}", "result too large"),  # its denominator, as it grows
        (r"\sum_{k=1}^{n} k", "a sum or product needs whole numbers as its bounds"),
        (r"\sum_{k=1}^{\sum_{j=1}^{3} j} k", "a sum or product in the bounds of another"),
        (r"\sin(10^{1000})", "sin of a number of more than 2000 bits"),  # refused by the parser
        (r"\sin(10^{500})", "a number of more than 300 digits in sin"),  # by the calculator
        # a power of a product with a variable: sympy raises its number at once, 7^{10^7}, past the CPU limit
        (r"\sum_{k=1}^{2} (7k)^{10^7}", "result too large"),
        # the exact work of the whole call, each operation allowed alone: five binomials (past the CPU
        # limit), three roots of 600-digit numbers, a 400,000-bit fraction reduced, roots of a sum's terms
        (_FIVE_BINOMIALS, "more than 300,000,000 word products of exact arithmetic"),
        (
            "+".join(rf"\binom{{{40000 - i}}}{{20000}}" for i in range(5)),
            "more than 300,000,000 word products",
        ),
        (r"\sqrt{10^{600}+1}+\sqrt{10^{600}+2}+\sqrt{10^{600}+3}", "more than 300,000,000 word products"),
        (r"\frac{3^{250000}}{7^{140000}+1}", "more than 300,000,000 word products"),
        (
            r"\sum_{k=1}^{100} \lfloor \frac{\sqrt{10^{600}+k}}{10^{300}} \rfloor",
            "more than 300,000,000 word",
        ),
        (r"\binom{-1}{100000}", "result too large"),  # 100,000 steps of sympy's loop (timed out)
        ("3!!!", "not an arithmetic expression (three factorial marks)"),
        (r"\sqrt[4]{-16}", "not a real number"),  # an even root of a negative number
    ],
)
def test_a_call_over_the_budget_is_refused_before_it_is_computed(expression, error):
    assert verdict(expression).startswith(f"error: {error}"), verdict(expression)


@pytest.mark.parametrize(
    "expression, value",
    [
        (r"\sum_{k=1}^{100} k", "5050"),
        (r"\sum_{k=1}^{1000} k", "500500"),  # many small terms: their work is small
        (r"\sum_{k=1}^{10000} k", "50005000"),
        (r"\sum_{k=1}^{10000} k^2", "333383335000"),
        (r"\sum_{k=1}^{10000} \frac{1}{k(k+1)}", "10000/10001"),  # fractions, each added exactly
        (r"\sum_{m=1}^{30}\sum_{n=1}^{30} mn", "216225"),  # nested: 30 small sums
        (r"\prod_{k=1}^{20} \frac{k}{3}", "370812682240000/531441"),
        (r"\prod_{k=1}^{501} k", "6.11288549821546e+1136"),
        (r"\sum_{k=1}^9 k", "45"),  # a bound of one digit, as LaTeX reads it
        (r"\sum_{k=1}^{10} \frac{1}{k}", "7381/2520"),
        (r"\prod_{k=1}^{5} k", "120"),
        (r"\sum_{m=1}^{3}\sum_{n=1}^{m} mn", "25"),  # an inner bound that is the outer index
        (r"\sum_{k=-2}^{2} |k|", "6"),
        (r"\sum_{k=1}^{0} k", "0"),  # no terms
        (r"2^{\sum_{k=1}^{10} k}", "36028797018963968"),  # a sum inside a power: 2^55
        (r"\sum_{k=1}^{300} \sqrt{k}", "3472.55638857641"),
        ("10^{5000}+1", "1.00000000000000e+5000"),  # an exact value too long to write, however long
    ],
)
def test_sums_products_and_long_values_are_exact(expression, value):
    assert calculator(expression) == value


def test_an_expensive_call_gets_the_same_answer_among_many_and_alone(tokenizer):
    """The same call 8 at once (two for each worker) beside a thread keeping the CPU busy, and alone: one
    answer. The call is among the costliest the budget allows (80 terms of 6 operations: 480 of 500) and
    each is computed from an empty cache. A call over the budget (a red team's sum of 2,500 terms) is
    refused every time."""
    expensive = r"\sum_{k=1}^{80} \sqrt{\sqrt{\sqrt{k+1}+1}+1}"
    value, refusal = (
        "<out>152.307419959715</out>",
        "<out>error: more than 500 operations in sums and products</out>",
    )
    over = r"\sum_{k=1}^{2500} \sqrt{k}"
    busy = threading.Event()

    def spin():
        while not busy.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        crowded = observations(tokenizer, [expensive] * 8 + [over] * 4)
    finally:
        busy.set()
    assert crowded == [value] * 8 + [refusal] * 4
    assert observations(tokenizer, [expensive, over]) == [value, refusal]


def test_a_worker_never_imports_torch():
    """A worker imports sympy and the verifier, not the model's torch (it did, through the tools' door):
    starting one costs a fraction of the time and memory."""
    code = (
        "import sys, minigrpo.tools.calculator_worker as worker; worker.evaluate('1+1'); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT}
    )


def test_a_worker_past_its_wall_time_is_killed_and_replaced(monkeypatch):
    """A call that has not answered KILL_AFTER seconds after its worker took it is answered "timed out"
    (TimeoutError: the runner counts it as such), its worker killed; the next call gets a fresh one."""
    calculator("1")
    monkeypatch.setattr(calculator_module, "KILL_AFTER", 0.05)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out"):
        calculator(
            r"\sum_{k=1}^{80} \sqrt{\sqrt{\sqrt{k+2}+1}+1}"
        )  # a fifth of a second of sympy: past 0.05 s
    assert time.monotonic() - started < 1.0
    monkeypatch.undo()
    assert calculator("6*7") == "42"


def test_a_refusal_is_a_tool_error():
    with pytest.raises(ToolError, match="more than 500 operations"):
        calculator(r"\prod_{k=1}^{501} \sqrt{k}")


@pytest.mark.parametrize(
    "expression, value",
    [
        (r"\sum_{k=1}^{1000} k^{100}", "1.04093220851419e+301"),  # degree MAX_DEGREE: still a polynomial
        (r"\sum_{k=1}^{3} \sqrt{2} k", "8.48528137423857"),  # an irrational coefficient: sympy's term
        (r"\sum_{k=1}^{3} k \sin 1", "5.04882590884738"),  # a function of no index: sympy's term
        (r"\sum_{k=1}^{500000} k", "125000250000"),  # 3 word operations a term: no fraction's cost
        # a power of a sum in the index past degree 16 is not expanded: sympy's terms (it took 17 s)
        (r"\sum_{k=1}^{1} ((k+1)^{10}+1)^{10}", "1280084544196357822418212890625"),
        # exactly MAX_WORK: 4 word operations a term and the setup of reading the term as polynomials
        (r"\sum_{k=1}^{497500} k^2", "41044910211541250"),
        (r"\prod_{k=3}^{1} \frac{k}{3}", "1"),  # no terms, a constant denominator
        (r"\sum_{k=1}^{250} |k| 2^{9800}", "3.89530296552275e+2954"),  # exact terms add no bit of 0
        (r"\prod_{k=1}^{150} \frac{2^{65} |k|}{k}", "1.10270088674780e+2935"),  # exact terms add no bit of 1
        (r"\sqrt{2^{1999}}", "7.57671002241162e+300"),  # 2,000 bits: a root still taken
        (r"(10^{700})^2", "1.00000000000000e+1400"),  # an integer power of a big number: no root
        # binomials: of \pi, evaluated rather than expanded (\binom{\pi}{300} timed out); of a negative
        # number, in k steps; of a natural number, 10,534 digits, within the exact work
        (r"\binom{\pi}{3}", "1.28010813070189"),
        (r"\binom{\pi}{300}", "5.53942557085501e-11"),
        (r"\binom{-3}{5}", "-21"),
        (r"\binom{35000}{17500}", "4.78355945893448e+10533"),
        (r"\sum_{k=0}^{10} \binom{10}{k}", "1024"),  # a binomial of the index, checked once it has a value
        (r"\sum_{k=2}^{5} \binom{k}{2}", "20"),
        (r"2^{\pi}", "8.82497782707629"),  # an irrational exponent, estimated from its value
        (r"1^{10^{100}}", "1"),  # a power of 1 has no size, whatever its exponent
        ("0!", "1"),
        ("1000!", "4.02387260077094e+2567"),  # MAX_FACTORIAL
    ],
)
def test_budget_edges_are_answered(expression, value):
    assert verdict(expression) == value


@pytest.mark.parametrize(
    "expression, error",
    [
        # an empty sum's (negative) count of terms pays for no other sum's work
        (r"\sum_{k=1}^{-10^9} k + \sum_{k=1}^{10^7} k", "more than 2,000,000 word operations"),
        (r"\sum_{k=1}^{10000} k^{50}", "more than 2,000,000 word operations"),  # k^50's words counted
        (r"\sum_{k=0}^{3} \frac{1}{k}", "division by zero"),  # a term's denominator of 0
        (r"\prod_{k=1}^{100000} k", "result too large"),  # the product measured as it grows
        (r"\prod_{k=1}^{2000} k", "result too large"),  # 19,053 bits: past MAX_PARTIAL_BITS
        (r"\sum_{k=1}^{2} 10^{5000} k", "result too large"),  # a sum measured at its end
        (r"\ln \frac{1}{10^{1000}}", "ln of a number of more than 2000 bits"),  # its denominator
        (r"\sum_{k=1}^{497501} k^2", "more than 2,000,000 word operations"),  # one term past MAX_WORK
        # a product's constant denominator, measured before it is raised to the count of terms
        (r"\prod_{k=1}^{1000} \frac{1}{3^{1000}}", "result too large"),
        (r"\prod_{k=1}^{300000} \frac{1}{3}", "result too large"),
        ("1001!", "result too large"),  # past MAX_FACTORIAL
        (r"2^{\frac{1}{1001}}", "result too large"),  # a root of an index past 1,000
        ("1e200000", "result too large"),  # a literal past MAX_BITS, refused before it is made
        # a binomial of a number past 100,000, refused by its size before its work is counted (the
        # verifier, which counts no work, relies on it)
        (r"\binom{200000}{100000}", "result too large"),
        # a sum that starts again for each outer term pays each time for reading its term
        (
            r"\sum_{j=1}^{500}\sum_{k=1}^{2} \frac{(k+1)^{9}+3}{(k+2)^{9}+7}",
            "more than 2,000,000 word operations",
        ),
    ],
)
def test_budget_edges_are_refused(expression, error):
    assert verdict(expression).startswith(f"error: {error}"), verdict(expression)


def test_inner_sums_are_counted_before_the_first_term(monkeypatch):
    """A sum whose every term starts an inner sum pays for reading all their terms before it computes one:
    at the 2,000,000-word-operation edge nothing is read or computed, so no timer can answer first."""
    terms_read = []
    monkeypatch.setattr(calculator_worker, "_as_polynomials", lambda *args: terms_read.append(args))
    nested = r"\sum_{j=1}^{500}\sum_{k=1}^{2} \frac{(k+1)^{9}+3}{(k+2)^{9}+7}"
    assert verdict(nested).startswith("error: more than 2,000,000 word operations"), verdict(nested)
    assert terms_read == []


@pytest.mark.parametrize(
    "expression, value",
    [
        (r"\log_2 8", "3"),  # a one-digit subscript before a number is not two numbers side by side
        (r"\log_2 \frac{1}{8}", "-3"),
        (r"\log_2 10", "3.32192809488736"),
        (r"\sum_{k=1}^9 2k", "90"),
        (r"\sum_{k=1}^{5} k!", "153"),  # a factorial of the index, computed once it has a value
        (r"\sum_{k=1}^{5} k!!", "29"),
        ("3!!", "3"),  # the double factorial, not (3!)! (see verifier/answers/parse.py's departures)
        ("(3!)!", "720"),
        (r"\sqrt[3]{-8}", "-2"),  # the real root of a negative number
        (r"\sqrt[3]{-9}", "-2.08008382305190"),
        (r"\sqrt[5]{-\frac{1}{32}}", "-1/2"),
    ],
)
def test_small_exact_calls_are_answered(expression, value):
    assert verdict(expression) == value


@pytest.mark.parametrize(
    "expression, answer",
    [
        (r"\frac{1}{0}", "error: division by zero"),
        (r"\frac{2}{1-1}", "error: division by zero"),  # a divisor that is 0 once computed
        ("0^{-1}", "error: division by zero"),
        ("(1-1)^{-2}", "error: division by zero"),
        ("1^{-2}", "1"),
        (r"\sqrt[100]{2^{100}}", "2"),  # the largest root index taken
        (r"\sqrt[101]{2}", "error: not an arithmetic expression (root index must be a small integer)"),
        (
            r"\begin{pmatrix}1&2\end{pmatrix}\begin{pmatrix}1&2\end{pmatrix}",
            "error: not an arithmetic expression (matrix shapes do not match)",
        ),
        (
            r"\frac{1}{\begin{pmatrix}1\\2\end{pmatrix}}",
            "error: not an arithmetic expression (division by a matrix)",
        ),
    ],
)
def test_a_division_by_zero_and_a_root_index_past_100_are_refused_by_name(expression, answer):
    """sympy would answer zoo (complex infinity) for the first four, and take any root's index."""
    assert verdict(expression) == answer


def test_the_budget_counts_each_exact_operation_before_it_is_computed():
    """Within bounded_work, an operation is refused once the work of all of them would pass the bound:
    a product of two integers of 3 and 2 words is 6 word products, allowed at a bound of 6, not of 5."""
    big = 2**150  # 3 words
    medium = 2**100  # 2 words
    with bounded_work(6):
        assert checked_mul(big, medium) == 2**250
    with bounded_work(5), pytest.raises(Unsupported, match="more than 5 word products"):
        checked_mul(big, medium)
    with bounded_work(11):
        checked_mul(big, medium)
        with pytest.raises(Unsupported, match="more than 11 word products"):  # 12 in all
            checked_mul(big, medium)
    assert checked_mul(big, big) == 2**300  # no bound outside bounded_work


def test_an_answer_does_not_depend_on_the_calls_before_it():
    """The same call in a fresh worker, and in that worker again after a related call: the same answer.
    Five large binomials timed out in a fresh worker and were answered after three of them (sympy kept
    their values); they are refused before anything is computed, and each call starts with sympy's cache
    empty."""
    worker = calculator_module._Worker()
    try:
        worker.wait_ready()
        fresh = worker.ask(_FIVE_BINOMIALS)
        worker.ask("+".join(rf"\binom{{{100000 - i}}}{{50000}}" for i in range(3)))
        after_a_related_call = worker.ask(_FIVE_BINOMIALS)
    finally:
        worker.kill()
    assert (
        fresh == after_a_related_call == ["error", "more than 300,000,000 word products of exact arithmetic"]
    )


def test_a_call_finds_nothing_of_the_calls_before_it_in_sympys_cache():
    """What sympy caches while computing a call is the same whatever was computed before it."""

    def cached_after(*expressions) -> int:
        for expression in expressions:
            verdict(expression)
        return sum(function.cache_info().currsize for function in sympy.core.cache.CACHE)

    verdict(r"\sqrt{2}+\sqrt{3}")  # what sympy initialises once per process, out of the way
    alone = cached_after(r"\sqrt{2}+\sqrt{3}")
    assert cached_after(r"\sum_{k=1}^{30} \sqrt{k}", r"\sqrt{2}+\sqrt{3}") == alone


@pytest.mark.parametrize(
    "operation, arguments, work",
    [
        # worked out by hand from verifier/answers/costs.py's estimates (words: 1 + bits // 64)
        ("add", (2**150, 2**100), 3 + 2),  # integers: one pass over 3 and 2 words
        ("add", (sympy.Rational(1, 3), 2**100), 6 * 2 * 2),  # a fraction: GCD_WEIGHT * 2 * 2
        ("mul", (2**150, 2**100), 3 * 2),
        ("mul", (sympy.Rational(1, 3), 2**100), 6 * 2 * 2),
        ("mul", (sympy.pi, sympy.pi), 6 * 1 * 1),  # no exact number in either: a word each, at least
        ("div", (2**150, 2**100), 6 * 3 * 2),  # a fraction reduced, even of integers
        # 3^{100}: 100 * log2(3) + 1 = 159.5 bits, (1 + 159 // 64)^2; 2^{127}: 128 bits, 3 words
        ("power", (3, 100), 3**2),
        ("power", (2, 127), 3**2),
        ("power", (sympy.Rational(2, 3), 100), 5**2),  # 100 * (log2(2) + log2(3)) + 1 = 259.5 bits
        ("checked_literal", ("1", 640), 34**2),  # 1e640: (1 + 640) * 3.33 = 2134.5 bits, 34 words
        # \sqrt{2^{1999}}: a result of 1000.5 bits, (1 + 15)^2, and a root of 32 words, ROOT_WEIGHT * 32^2
        ("power", (2**1999, sympy.Rational(1, 2)), 16**2 + 150_000 * 32**2),
        ("factorial", (100,), 10 * 100 * (1 + 664 // 64)),  # 100 steps, 100 * log2(100) = 664.4 bits
        # \binom{60}{30}: 30 steps, 30 * (6 - 5 + 3) = 120 bits
        ("binomial", (60, 30), 10 * 30 * 2),
        # \binom{-3}{16}: 16 steps on integers, 16 * (max(2, 5) + 1 + 1 + 5) = 192 bits, then reduced
        ("binomial", (-3, 16), 10 * 16 * 4 + 6 * 4**2),
        # \binom{1/3}{10}: 10 steps on fractions, 10 * (max(1, 5) + 1 + 2 + 4) = 120 bits, then reduced
        ("binomial", (sympy.Rational(1, 3), 10), 40 * 10 * 2 + 6 * 2**2),
    ],
)
def test_each_exact_operation_costs_its_estimate(operation, arguments, work):
    """An exact operation is allowed within a bound of exactly its estimated work, refused one below it."""
    checked = getattr(arithmetic, operation)
    with bounded_work(work):
        checked(*arguments)
    with bounded_work(work - 1), pytest.raises(Unsupported, match=f"more than {work - 1:,} word products"):
        checked(*arguments)


def test_a_binomial_of_an_irrational_number_is_left_unexpanded():
    """\\binom{\\pi}{300} stays a binomial, evaluated when its value is asked for: sympy expanded the product
    of its 300 factors (past the CPU limit), to the same value."""
    value = arithmetic.binomial(sympy.pi, 300)
    assert value.func is sympy.binomial and value.args == (sympy.pi, 300)
