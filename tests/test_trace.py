"""The trace page: one traced step on a tiny model writes trace.html, and the page, read back with
the standard library's HTML parser, shows what the step did: the prompt, each completion's reward
and advantage as the rollouts hold them, one span per token whose numbers are the log-probs before
and after the update and whose colour has the sign of the change, the update's stats, and nothing
fetched from elsewhere (no script, no link, no URL)."""

import re
from html.parser import HTMLParser

import pytest
from helpers import ROWS, tiny_model, tiny_tokenizer, tiny_train_config

from minigrpo import GRPOConfig, RewardSpec, Task, Trainer
from minigrpo.run import Trace, render_html
from minigrpo.verifier import REWARD_FUNCTIONS, register_reward

G = 4
GREEN, RED = "rgba(0, 170, 60,", "rgba(220, 30, 30,"


def _vowels(completions, **_):
    """Rewards a random model earns unevenly: the share of characters that are vowels, the length."""
    return [sum(c.count(ch) for ch in "aeiou") / max(len(c), 1) for c in completions]


def _length(completions, **_):
    return [len(c) / 10 for c in completions]


for _name, _fn in (("test_trace_vowels", _vowels), ("test_trace_length", _length)):
    if _name not in REWARD_FUNCTIONS:
        register_reward(_name)(_fn)


class Page(HTMLParser):
    """Every element in document order: its tag, attributes, text (its children's included) and the
    elements it is inside."""

    def __init__(self, text):
        super().__init__()
        self.raw, self.elements, self.open = text, [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append({"tag": tag, **dict(attrs), "text": "", "parents": list(self.open)})
        if tag != "meta":  # the one element without an end tag here
            self.open.append(self.elements[-1])

    def handle_endtag(self, tag):
        self.open.pop()

    def handle_data(self, data):
        for element in self.open:  # an element's text includes its children's
            element["text"] += data

    def having(self, cls, inside=None):
        return [
            e
            for e in self.elements
            if e.get("class") == cls and (inside is None or any(p is inside for p in e["parents"]))
        ]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One traced step, G completions per prompt, 2 prompts; (trainer, trace, step stats, page)."""
    tmp_path = tmp_path_factory.mktemp("trace")
    tokenizer = tiny_tokenizer(str(tmp_path / "tokenizer"))
    model = tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    config = tiny_train_config(tmp_path / "run", max_steps=1, batch_size=2 * G, micro_batch_size=G)
    task = Task(ROWS, [RewardSpec("test_trace_vowels"), RewardSpec("test_trace_length", weight=0.5)])
    trainer = Trainer(
        model,
        tokenizer,
        task,
        GRPOConfig(num_generations=G, max_completion_length=10),
        config,
    )
    printed = []
    trace = Trace(write=printed.append, html_path=str(tmp_path / "trace.html"))
    stats, _ = trainer.train_step(trace)
    assert any("[4 loss]" in line for line in printed)  # the console trace is still printed
    trained = sum(p.numel() for p in model.parameters())
    assert f"[4 trained]        {trained:,} parameters (every weight)" in printed
    return trainer, trace, stats, Page(open(tmp_path / "trace.html", encoding="utf-8").read())


def test_the_page_shows_the_traced_group(traced):
    trainer, trace, stats, page = traced
    group, after = trace.group, trace._logprobs(trainer)  # the model is the updated one now
    assert len(group) == G and len({r.advantage for r in group}) > 1  # a group with signal
    assert page.having("prompt")[0]["text"] == trainer.tokenizer.decode(group[0].prompt_ids)
    completions = page.having("completion")
    assert len(completions) == G
    changes = []
    for i, (r, element) in enumerate(zip(group, completions)):
        assert set(r.rewards) == {"test_trace_vowels", "test_trace_length"}
        assert all(f"{k} {v:g}" in element["text"] for k, v in r.rewards.items())
        [reward], [advantage] = page.having("reward", element), page.having("advantage", element)
        assert float(reward["text"]) == pytest.approx(r.reward, rel=1e-5)
        assert float(advantage["text"]) == pytest.approx(r.advantage, rel=1e-5, abs=1e-6)
        tokens = page.having("tok", element)
        assert len(tokens) == len(r.completion_ids)
        assert "".join(t["text"] for t in tokens) == "".join(
            trainer.tokenizer.decode([t]) for t in r.completion_ids
        )
        for t, span in enumerate(tokens):
            before_shown, after_shown = map(
                float, re.fullmatch(r"log p (\S+) → (\S+) \(Δ \S+\)", span["title"]).groups()
            )
            assert before_shown == pytest.approx(float(trace.before[i, t]), abs=1e-6)
            assert after_shown == pytest.approx(float(after[i, t]), abs=1e-6)
            # "before" is the sampling policy
            assert abs(float(trace.before[i, t]) - float(r.sampler_logprobs[t])) < 1e-4
            change = float(after[i, t] - trace.before[i, t])
            if change != 0:
                assert span["style"].startswith("background:" + (GREEN if change > 0 else RED)), (
                    change,
                    span["style"],
                )
            changes.append(change)
    assert min(changes) < 0 < max(changes)  # both colours occur
    for key, value in trace.record["stats"].items():  # the update's stats, as the logger gets them
        assert value == stats[key]
        [number] = [e for e in page.elements if e.get("class") == "key" and e["text"] == key]
        assert float(page.elements[page.elements.index(number) + 1]["text"]) == pytest.approx(
            value, rel=1e-5, abs=1e-12
        )
    assert "loss" in trace.record["stats"]


def test_the_page_is_self_contained(traced):
    page = traced[3]
    # no script, link, img, iframe
    assert {e["tag"] for e in page.elements} <= {
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "h1",
        "h2",
        "pre",
        "p",
        "div",
        "span",
        "b",
    }
    assert not any(name in ("src", "href") for e in page.elements for name in e)
    assert not re.search(r"https?://|url\(|@import", page.raw)


def test_the_console_shows_the_tokens_the_update_moved_most_in_their_order():
    from minigrpo.run.trace import MAX_TOKENS_SHOWN, _most_moved

    # (text, log p before, after, trained): token t moves by t / 100, except the three planted large moves;
    # token 7 is a tool's observation, which moved most but is never the policy's to show
    tokens = [(f"t{t}", -1.0, -1.0 + t / 100, True) for t in range(20)]
    tokens[2], tokens[5], tokens[11] = (
        ("a", -2.0, -1.0, True),
        ("b", -1.0, -3.0, True),
        ("c", -0.5, -0.4, True),
    )
    tokens[7] = ("obs", -9.0, -1.0, False)
    cells = _most_moved(tokens)
    positions = [int(cell.split(":")[0]) for cell in cells]
    trained = [t for t in range(20) if t != 7]
    largest = sorted(trained, key=lambda t: -abs(tokens[t][2] - tokens[t][1]))[:MAX_TOKENS_SHOWN]
    assert len(cells) == MAX_TOKENS_SHOWN and positions == sorted(largest) and {2, 5, 19} <= set(positions)
    assert cells[positions.index(5)] == "5:'b' -1.00->-3.00(x0.135)"  # exp(-2)
    # fewer than the table holds: all
    assert [cell.split(":")[0] for cell in _most_moved(tokens[:3])] == [
        "0",
        "1",
        "2",
    ]


def test_the_page_marks_each_step_right_or_wrong_with_its_step_reward():
    """A record as a process-supervised step leaves it: each completion's arithmetic steps, then its
    answer step, each a span marked right (green) or wrong (red) with the step reward trained on."""
    steps = [
        {"text": "65*7=455", "correct": True, "reward": 1.0},
        {"text": "70+455=515", "correct": False, "reward": -1.0},
        {"text": "answer", "correct": False, "reward": 0.0},
    ]
    completion = dict(
        text="65*7=455;70+455=515;####515",
        answer="515",
        rewards={"accuracy": 0.0},
        reward=0.0,
        advantage=-0.5,
        finish_reason="stop",
        steps=steps,
        tokens=[("6", -1.0, -1.1, True)],
    )
    record = {
        "step": 1,
        "prompt": "70+65*7\n",
        "mean": 0.5,
        "std": 0.5,
        "completions": [completion],
        "stats": {},
    }
    page = Page(render_html(record))
    right, wrong = page.having("step right"), page.having("step wrong")
    assert [e["text"] for e in right] == ["65*7=455 ✓ step reward +1"]
    assert [e["text"] for e in wrong] == ["70+455=515 ✗ step reward -1", "answer ✗ step reward +0"]
    assert right[0]["style"].startswith("background:" + GREEN) and wrong[0]["style"].startswith(
        "background:" + RED
    )
