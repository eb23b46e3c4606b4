"""Tasks: JSONL loaders (GSM8K, MATH, local and Hub), synthetic splits, prompt templates, the
countdown reward, and evaluate() with its pass@k estimator. Nothing here touches the network."""

import json
import math
import time

import huggingface_hub
import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from minigrpo.config import SamplingConfig
from minigrpo.rollout import check_prompts
from minigrpo.run import evaluate, pass_at_k, summarize
from minigrpo.tasks import Problem, Task, to_task
from minigrpo.tasks.datasets import load_jsonl, load_problems, parse_hub_path
from minigrpo.tasks.prompts import INSTRUCTION, template
from minigrpo.tasks.synthetic import generate
from minigrpo.verifier import REWARD_FUNCTIONS, RewardSpec, compute_rewards

GSM8K_ROWS = [
    {
        "question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
        "answer": (
            "In May she sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"
        ),
    },
    # extra fields are ignored
    {
        "question": "A ship carries 1,000 boxes and takes on 234 more. How many boxes now?",
        "answer": "1,000 + 234 = 1,234 boxes.\n#### 1,234",
        "id": 7,
    },
    {"question": "How much is lost?", "answer": "She loses 2,500,000 - 2,500,005.\n####  -5 "},
]
MATH_ROWS = [
    {
        "problem": "What is $\\frac{2}{4}$ in lowest terms?",
        "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$.",
    },
    {
        "problem": "Find $\\sin 60^\\circ$.",
        "solution": "It is $\\boxed{\\frac{\\sqrt{3}}{2}}$.",
        "level": "Level 2",
    },
    {"problem": "Solve $x + 1 = 3$.", "answer": "x = 2", "solution": "Subtract 1: \\boxed{2}."},
    {"problem": "What is 5 + 5?", "answer": 10},
]


def write_jsonl(path, rows, blank_after_first=False):
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    if blank_after_first:
        lines.insert(1, "   ")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(str(tmp_path_factory.mktemp("tokenizer")))


# --- GSM8K and MATH files -------------------------------------------------------------------------
def test_gsm8k_answers_are_the_last_line_without_commas(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS, blank_after_first=True)
    problems = load_jsonl(path, "gsm8k")
    assert [p.answer for p in problems] == ["72", "1234", "-5"]
    assert problems[0].question == GSM8K_ROWS[0]["question"]
    assert problems[1].solution == "1,000 + 234 = 1,234 boxes.\n#### 1,234"
    assert all(p.extra == {} for p in problems)


def test_math_answers_from_answer_field_or_last_box(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    problems = load_jsonl(path, "math")
    assert [p.answer for p in problems] == ["\\frac{1}{2}", "\\frac{\\sqrt{3}}{2}", "x = 2", "10"]
    assert problems[1].question == "Find $\\sin 60^\\circ$."
    assert problems[2].solution == "Subtract 1: \\boxed{2}."
    assert problems[3].solution == ""


def test_auto_format_matches_the_explicit_one(tmp_path):
    gsm8k = write_jsonl(tmp_path / "a.jsonl", GSM8K_ROWS)
    math = write_jsonl(tmp_path / "b.jsonl", MATH_ROWS)
    assert load_jsonl(gsm8k) == load_jsonl(gsm8k, "gsm8k")
    assert load_jsonl(math) == load_jsonl(math, "math")
    with pytest.raises(ValueError, match="line 1: missing field 'problem'"):
        load_jsonl(gsm8k, "math")
    with pytest.raises(ValueError, match="unknown dataset format 'alpaca'"):
        load_jsonl(gsm8k, "alpaca")


BAD_ROWS = {
    "not json": ([GSM8K_ROWS[0], '{"question": "q", "answer": '], 3, "not valid JSON"),
    "not an object": ([GSM8K_ROWS[0], "[1, 2]"], 3, r"not a JSON object \(got list\)"),
    "missing field": ([GSM8K_ROWS[0], {"question": "q"}], 3, "missing field 'answer'"),
    "no #### line": ([GSM8K_ROWS[0], {"question": "q", "answer": "It is 5."}], 3, "no '#### ' line"),
    "empty after ####": ([GSM8K_ROWS[0], {"question": "q", "answer": "So\n#### "}], 3, "empty answer"),
    "no box": (
        [MATH_ROWS[0], {"problem": "p", "solution": "The answer is 5."}],
        3,
        "no \\\\boxed\\{\\} answer",
    ),
    "empty box": ([MATH_ROWS[0], {"problem": "p", "solution": "So \\boxed{ }."}], 3, "empty or unterminated"),
    "empty answer": ([MATH_ROWS[0], {"problem": "p", "answer": ""}], 3, "empty answer"),
    "list question": ([MATH_ROWS[0], {"problem": ["p"], "answer": "1"}], 3, "field 'problem' is a list"),
    "unknown keys": ([{"prompt": "p", "completion": "c"}], 1, "cannot tell the format"),
    # Python's json reads JSON's NaN and Infinity, and 1e999 as inf: golds "nan" and "inf" otherwise
    "NaN answer": (
        [MATH_ROWS[0], '{"problem": "p", "answer": NaN}'],
        3,
        "field 'answer' is nan, not a finite number",
    ),
    "Infinity answer": (
        [MATH_ROWS[0], '{"problem": "p", "answer": -Infinity}'],
        3,
        "field 'answer' is -inf, not a finite",
    ),
    "overflowing answer": (
        [MATH_ROWS[0], '{"problem": "p", "answer": 1e999}'],
        3,
        "field 'answer' is inf, not a finite",
    ),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_a_bad_row_names_file_and_line(tmp_path, case):
    rows, line, message = BAD_ROWS[case]
    path = write_jsonl(tmp_path / "bad.jsonl", rows, blank_after_first=True)  # the blank line 2 is skipped
    with pytest.raises(ValueError, match=message) as error:
        load_jsonl(path)
    assert f"{path}, line {line}: " in str(error.value)


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_an_empty_file_is_an_error(tmp_path, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match="empty.jsonl is empty: it has no JSON rows"):
        load_jsonl(str(path))


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no such dataset file: .*nope.jsonl"):
        load_jsonl(str(tmp_path / "nope.jsonl"))


# --- the Hub --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source, expected",
    [
        ("hf://datasets/openai/gsm8k/main/test.jsonl", ("openai/gsm8k", "main/test.jsonl", None)),
        ("hf://datasets/me/math@v1.0/data/test.jsonl", ("me/math", "data/test.jsonl", "v1.0")),
        ("hf://datasets/me/math@refs%2Fpr%2F3/test.jsonl", ("me/math", "test.jsonl", "refs/pr/3")),
    ],
)
def test_hub_paths_parse(source, expected):
    assert parse_hub_path(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "hf://datasets/me/test.jsonl",
        "hf://datasets/me/math@/test.jsonl",
        "hf://datasets//math/test.jsonl",
        "hf://models/me/math/test.jsonl",
    ],
)
def test_bad_hub_paths_are_errors(source):
    with pytest.raises(ValueError, match="hf://datasets/<owner>/<name>"):
        parse_hub_path(source)


def test_hub_file_is_fetched_with_repo_filename_and_revision(tmp_path, monkeypatch):
    files = {
        "main/test.jsonl": write_jsonl(tmp_path / "good.jsonl", GSM8K_ROWS),
        "main/bad.jsonl": write_jsonl(
            tmp_path / "bad.jsonl", GSM8K_ROWS + [{"question": "q", "answer": "5"}]
        ),
    }
    calls = []

    def fake_download(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs))
        return files[filename]

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    problems = load_problems("hf://datasets/openai/gsm8k@abc123/main/test.jsonl", count=2)
    assert [p.answer for p in problems] == ["72", "1234"]
    assert calls == [("openai/gsm8k", "main/test.jsonl", {"repo_type": "dataset", "revision": "abc123"})]
    with pytest.raises(ValueError, match="line 4: no '#### ' line") as error:  # errors name the Hub source
        load_jsonl("hf://datasets/openai/gsm8k/main/bad.jsonl")
    assert str(error.value).startswith("hf://datasets/openai/gsm8k/main/bad.jsonl, line 4")
    assert calls[1] == ("openai/gsm8k", "main/bad.jsonl", {"repo_type": "dataset", "revision": None})


def test_a_failed_download_names_the_source(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("Name or service not known\nretrying")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(
        ValueError, match=r"could not fetch hf://datasets/a/b/x.jsonl .*OSError: Name or service not known\)$"
    ):
        load_jsonl("hf://datasets/a/b/x.jsonl")


# --- load_problems --------------------------------------------------------------------------------
def test_synthetic_train_and_test_never_overlap():
    train = load_problems("arithmetic", "train", count=300)
    test = load_problems("arithmetic", "test", count=100)
    assert len(train) == 300 and len(test) == 100
    assert len({p.question for p in train}) == 300
    assert not {p.question for p in train} & {p.question for p in test}
    again = load_problems("arithmetic", "test", count=100)
    assert [(p.question, p.answer) for p in again] == [(p.question, p.answer) for p in test]
    other_seed = load_problems("arithmetic", "test", count=100, seed=1)
    assert [p.question for p in other_seed] != [p.question for p in test]


def test_synthetic_default_counts_and_answers():
    test = load_problems("linear", "test")
    assert len(test) == 200
    p = load_problems("arithmetic", count=1)[0]
    assert eval(p.question) == int(p.answer)  # "a+b*c": Python's precedence is the problem's


def test_load_problems_reads_files_and_rejects_unknown_names(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", MATH_ROWS)
    assert [p.answer for p in load_problems(path, "test", count=2)] == [
        "\\frac{1}{2}",
        "\\frac{\\sqrt{3}}{2}",
    ]
    assert len(load_problems(path)) == 4
    with pytest.raises(
        ValueError, match="unknown dataset 'gsm9k': not a synthetic kind \\(arithmetic, fractions"
    ):
        load_problems("gsm9k")
    with pytest.raises(ValueError, match="count must be a positive integer"):
        load_problems("arithmetic", count=0)
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        load_problems("arithmetic", "validation")


def test_golds_no_completion_can_match_are_skipped_with_a_note(tmp_path):
    golds = ["\\frac{1}{2}", "$$", "7", "\\frac{1", "1, 2, \\ldots", "x = 2", "\\$"]  # line 2 is blank
    path = write_jsonl(
        tmp_path / "golds.jsonl",
        [{"problem": f"q{i}", "answer": g} for i, g in enumerate(golds)],
        blank_after_first=True,
    )
    notes = []
    problems = load_problems(path, note=notes.append)
    assert [p.answer for p in problems] == ["\\frac{1}{2}", "7", "1, 2, \\ldots", "x = 2"]
    # the file's lines, from 1
    assert [p.source for p in problems] == [f"{path}, line {n}" for n in (1, 4, 6, 7)]
    assert notes == [
        f"note: {path}: skipped 3 of 7 rows whose gold answer no completion can match (empty once "
        "normalised, or its braces unbalanced), first line 3 ('$$')",
        f"note: {path}: 1 of 7 rows have a gold answer the verifier cannot parse, first line 6 "
        "('1, 2, \\\\ldots'); kept, but only an answer written the same way scores right on them",
    ]
    notes.clear()
    assert [p.answer for p in load_problems(path, count=2, note=notes.append)] == ["\\frac{1}{2}", "7"]
    # rows past the count: not read
    assert notes == [
        f"note: {path}: skipped 1 of 3 rows whose gold answer no completion can match (empty once "
        "normalised, or its braces unbalanced), first line 3 ('$$')"
    ]
    unusable = write_jsonl(tmp_path / "none.jsonl", [{"problem": "q", "answer": "$$"}])
    with pytest.raises(ValueError, match="none.jsonl: no row has a gold answer that a completion can match"):
        load_problems(unusable, note=notes.append)


def test_every_kept_gold_is_matched_by_itself_in_a_box(tmp_path):
    """What keep_scorable keeps, the verifier scores right: its boxed copy earns the accuracy reward."""
    golds = ["\\frac{1}{2}", "x = 2", "1, 2, \\ldots", "\\int_0^1 x dx", "-5", "\\text{Monday}", "(1, 2)"]
    path = write_jsonl(
        tmp_path / "golds.jsonl", [{"problem": f"q{i}", "answer": g} for i, g in enumerate(golds)]
    )
    problems = load_problems(path, note=lambda _: None)
    assert [p.answer for p in problems] == golds
    completions = [f"So it is \\boxed{{{p.answer}}}." for p in problems]
    assert compute_rewards(completions, {"answer": golds}, [RewardSpec("accuracy")]).total == [1.0] * len(
        golds
    )


def test_rows_of_a_task_are_counted_from_1_or_named_by_their_source():
    with pytest.raises(ValueError, match="^row 2 needs a 'prompt'"):
        Task([{"prompt": "a"}, {"question": "b"}], [RewardSpec("accuracy")])
    with pytest.raises(
        ValueError, match="^d.jsonl, line 5 has columns \\['answer', 'prompt'\\], d.jsonl, line 2 has"
    ):
        Task(
            [{"prompt": "a"}, {"prompt": "b", "answer": "1"}],
            [RewardSpec("accuracy")],
            ["d.jsonl, line 2", "d.jsonl, line 5"],
        )
    problems = [Problem("1+1", "2", source="d.jsonl, line 3"), Problem("2+2", "4", source="d.jsonl, line 4")]
    assert to_task(problems, template("tiny"), [RewardSpec("accuracy")]).sources == [
        "d.jsonl, line 3",
        "d.jsonl, line 4",
    ]
    assert (
        to_task(problems + [Problem("3+3", "6")], template("tiny"), [RewardSpec("accuracy")]).sources is None
    )


def test_a_prompt_too_long_is_named_by_its_file_and_line():
    config = SamplingConfig(max_new_tokens=4)
    with pytest.raises(
        ValueError, match="^d.jsonl, line 7 \\(held-out prompts\\) has 5 tokens; with max_new_tokens=4"
    ):
        check_prompts(
            [[1], [1] * 5], config, 10, 8, "held-out prompts", ["d.jsonl, line 3", "d.jsonl, line 7"]
        )
    with pytest.raises(ValueError, match="^row 2 of the held-out prompts has 5 tokens"):
        check_prompts([[1], [1] * 5], config, 10, 8, "held-out prompts")


@pytest.mark.parametrize(
    "texts",
    [
        ["What is 12 + 30? " * 50, "x" * 999, " " * 500, "\\boxed{42}" * 30, "Janet has 3 ducks." * 20],
        # NFC shortens the first, lengthens the second
        [
            "e\u0301" * 300,
            "\ufb2c" * 200,
            "\u1e17" * 100,
            "한국어 " * 100,
        ],
    ],
)
def test_fewest_tokens_is_a_lower_bound_found_without_encoding(tokenizer, texts):
    """fewest_tokens never says more than encode gives (it may refuse only what could never fit), and a text
    past what the room can spell is refused before anything is encoded."""
    for text in texts:
        assert tokenizer.fewest_tokens(text) <= len(tokenizer.encode(text)), text[:20]
    huge = "What is 12 + 30? " * 600_000  # 10 MB: half a minute to encode
    started = time.process_time()  # CPU time: a busy machine's waits do not count, encoding 10 MB would
    with pytest.raises(
        ValueError, match="^d.jsonl, line 2 \\(prompts\\) has 10,200,000 characters, too many for the 60 "
    ):
        tokenizer.encode_all(
            ["1 + 1", huge], "prompts", "a model", 60, ["d.jsonl, line 1", "d.jsonl, line 2"]
        )
    assert time.process_time() - started < 1.0


# --- prompt templates -----------------------------------------------------------------------------
def test_base_templates_render_the_question():
    assert template("tiny").render("23*6+47") == "23*6+47\n"
    assert template("base").render("What is 2+3?") == f"Question: What is 2+3?\n{INSTRUCTION}\nAnswer:"
    with pytest.raises(ValueError, match="unknown prompt template 'qwen'"):
        template("qwen")


def test_chat_templates_use_the_tokenizers_chat_format(tokenizer):
    text = template("chat").render("What is 2+3?", tokenizer)
    assert text == f"<|im_start|>user\nWhat is 2+3?\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    no_thinking = template("chat-no-thinking").render("What is 2+3?", tokenizer)
    assert no_thinking.startswith("<|im_start|>user") and no_thinking.endswith(
        "assistant\n<think>\n\n</think>\n\n"
    )
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        template("chat").render("What is 2+3?")


# --- the countdown reward -------------------------------------------------------------------------
def test_countdown_reward_checks_numbers_and_value():
    countdown = REWARD_FUNCTIONS["countdown"]
    completions = [
        "so \\boxed{(3+5)*7-2}",
        "\\boxed{(3+5)*7-1-1}",
        "\\boxed{(3+5)*7+2}",
        "####2-7+(5*3)",
        "no answer",
    ]
    scores = countdown(completions, numbers=[[3, 5, 7, 2]] * 5, answer=["54", "54", "54", "10", "54"])
    assert scores == [1.0, 0.0, 0.0, 1.0, 0.0]  # right; a number not given; 58 != 54; tiny format; nothing


def test_synthetic_countdown_solutions_score_one():
    problems = generate("countdown", 5, seed=3, difficulty=2)
    columns = {"answer": [p.answer for p in problems], "numbers": [p.extra["numbers"] for p in problems]}
    rewards = compute_rewards([p.solution for p in problems], columns, [RewardSpec("countdown")])
    assert rewards.total == [1.0] * 5


# --- evaluate and pass@k --------------------------------------------------------------------------
def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 4, 2) == 1.0 and pass_at_k(5, 5, 1) == 1.0


def answering_model(tokenizer, answers: dict[str, float]):
    """A tiny Qwen3 that, after a prompt's final newline, answers each of `answers` (single tokens)
    with its probability, then ends. Attention and MLP outputs are zeroed, so a position's hidden
    state is its own token's embedding: the newline's points to the answers, each answer's to EOS."""
    model = tiny_model(vocab_size=tokenizer.vocab_size)
    (newline,), eos = tokenizer.encode("\n"), tokenizer.eos_token_ids[0]
    with torch.no_grad():
        for block in model.layers:
            block.self_attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
        model.norm.weight.fill_(1.0)
        embedding, head = model.embed_tokens.weight.zero_(), model.lm_head.weight.zero_()
        embedding[newline, 0] = 1.0
        scale = float(model.norm(embedding[newline])[0])  # the normed hidden state's one non-zero entry
        for text, probability in answers.items():
            (token,) = tokenizer.encode(text)
            embedding[token, 1] = 1.0
            head[token, 0] = (30.0 + math.log(probability)) / scale  # logit 30 + log p; every other token's 0
        head[eos, 1] = 30.0 / scale
    return model


def test_evaluate_scores_a_model_whose_answers_are_known(tokenizer):
    """It answers 42 (p 0.6) or 2 (p 0.4) to anything: right on two problems when it says 42, on the
    third when it says 2. 5 samples each, so a majority is never a tie."""
    model = answering_model(tokenizer, {"42": 0.6, "2": 0.4})
    problems = [Problem("40+2", "42"), Problem("6*7", "42"), Problem("1+1", "2")]
    result = evaluate(
        model,
        tokenizer,
        problems,
        template("tiny"),
        samples=5,
        temperature=1.0,
        max_new_tokens=6,
        ks=(1, 2, 4, 8),
    )
    # k above the 5 samples is left out
    assert len(result.results) == 3 and set(result.pass_at_k) == {
        1,
        2,
        4,
    }
    counts = []
    for row, problem in zip(result.results, problems):
        assert (row["question"], row["answer"]) == (problem.question, problem.answer)
        assert set(row["completions"]) <= {"42", "2"} and len(row["completions"]) == 5
        assert row["correct"] == [c == problem.answer for c in row["completions"]]
        counts.append(sum(row["correct"]))
    # right and wrong, within a problem too
    assert 0 < sum(counts) < 15 and any(0 < c < 5 for c in counts), counts
    assert result.pass_at_1 == pytest.approx(sum(counts) / 15)
    for k in (1, 2, 4):  # 1 - C(n - c, k) / C(n, k): the chance that none of k samples is right, from 1
        assert result.pass_at_k[k] == pytest.approx(
            sum(1 - math.comb(5 - c, k) / math.comb(5, k) for c in counts) / 3
        )
    majorities = [max(set(row["completions"]), key=row["completions"].count) for row in result.results]
    assert result.majority_at_k == pytest.approx(sum(m == p.answer for m, p in zip(majorities, problems)) / 3)
    greedy = [evaluate(model, tokenizer, problems, template("tiny"), max_new_tokens=6) for _ in range(2)]
    assert greedy[0].results == greedy[1].results
    # the likelier answer, every time
    assert [row["completions"] for row in greedy[0].results] == [["42"]] * 3
    assert greedy[0].pass_at_1 == pytest.approx(2 / 3)


def test_majority_vote_on_hostile_answers_is_fast_and_never_raises():
    """The vote extracts and normalises in-process, outside the verifier's workers (issue 16, item 10):
    a box nested 1,200 deep raised RecursionError, and a long run of digits took seconds."""
    deep = "\\boxed{" + "\\text{" * 1200 + "1" + "}" * 1201
    digits = "\\boxed{" + "1 " * 20_000 + "}"
    results = [
        {"question": "q", "answer": "1", "completions": [deep, deep, digits], "correct": [True, True, False]}
    ]
    start = time.process_time()  # CPU time: a busy machine's waits do not count
    assert summarize(results, 3).majority_at_k == 1.0
    assert time.process_time() - start < 1.0
