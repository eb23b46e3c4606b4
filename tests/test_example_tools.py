"""Smoke tests of examples/sample.py and examples/eval_math.py, run as scripts on a tiny checkpoint, and
of examples/pretrain_tiny.py --kind calc for one step, with --overwrite over an earlier checkpoint, and
--kind countdown for one step.

Every run of this file is made by one fixture, each forked in turn from conftest's examples_server
(which has paid the imports), and the tests read the finished runs.
"""

import json
import os
import shutil
import subprocess

import pytest
from helpers import tiny_model, tiny_tokenizer

import minigrpo
from minigrpo.model import read_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (script, arguments); {ckpt}, {data} and {tmp} are filled in by the fixture. Bad input:
# test_bad_input.py
RUNS = {
    "sample": ("sample.py", "--model {ckpt} --prompt 12+30 --answer 42 --num_samples 3 --max_new_tokens 8"),
    "eval": (
        "eval_math.py",
        "--model {ckpt} --data {data} --count 4 --num_samples 2 --k 1,2,8 --max_new_tokens 8 "
        "--output {tmp}/results.jsonl",
    ),
    # one held-out problem: the figures pretrain.json records need no more
    "pretrain_calc": (
        "pretrain_tiny.py",
        "--kind calc --max_steps 1 --eval_every 1 --batch_size 4 --eval_count 1 "
        "--output {tmp}/calc --overwrite",
    ),
    "pretrain_countdown": (
        "pretrain_tiny.py",
        "--kind countdown --max_steps 1 --eval_every 1 --batch_size 4 --eval_count 1 "
        "--output {tmp}/countdown",
    ),
    # no --model, typed in another directory than the repository's
    "embedded": ("sample.py", "--prompt 12+30 --num_samples 1 --max_new_tokens 8"),
}
TYPED_IN = {"embedded": "{tmp}"}  # where a run's command is typed; the others: the repository's root


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("example_tools")


@pytest.fixture(scope="module")
def runs(tmp, examples_server):
    """name -> the finished run of RUNS, as a CompletedProcess (exit status, stdout, stderr)."""
    tokenizer = tiny_tokenizer(str(tmp / "tokenizer"))
    minigrpo.save_pretrained(tiny_model(vocab_size=tokenizer.vocab_size), tokenizer, tmp / "ckpt")
    earlier = shutil.copytree(os.path.join(ROOT, "models", "minigrpo-tiny-arith"), tmp / "calc")
    # a sharded checkpoint's file, which the one-file save does not write: gone once replaced whole
    shutil.copy(earlier / "model.safetensors", earlier / "model-00001-of-00002.safetensors")
    # what a save into calc killed before its rename left: the run's save deletes it
    shutil.copytree(earlier, tmp / ".calc.tmp-killed00")
    data = tmp / "gsm8k.jsonl"
    rows = [{"question": f"{i}+1", "answer": f"{i}+1={i + 1}\n#### {i + 1}"} for i in range(6)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp / "out"
    out.mkdir()
    finished = {}
    for name, (script, args) in RUNS.items():
        argv = [arg.format(ckpt=tmp / "ckpt", data=data, tmp=tmp) for arg in args.split()]
        cwd = TYPED_IN[name].format(tmp=tmp) if name in TYPED_IN else None
        status = examples_server.run(script, argv, str(out), name, cwd=cwd)
        finished[name] = subprocess.CompletedProcess(
            name, status, (out / f"{name}.out").read_text(), (out / f"{name}.err").read_text()
        )
    return finished


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sample_prints_each_completion_with_its_rewards(runs):
    out = runs["sample"]
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("prompt (") and "12+30\n" in out.stdout
    assert out.stdout.count("\n--- sample ") == 3
    reward_lines = [line for line in out.stdout.splitlines() if line.startswith("answer: ")]
    assert len(reward_lines) == 3 and all(
        "accuracy: " in line and "format: " in line for line in reward_lines
    )
    assert "/3 correct (gold answer 42)" in out.stdout


def test_eval_math_scores_a_jsonl_file_and_writes_one_row_per_problem(runs, tmp):
    out = runs["eval"]
    assert out.returncode == 0, out.stderr
    summary = out.stdout.splitlines()[-1]  # the summary line comes last
    assert summary.startswith(f"{tmp}/gsm8k.jsonl (4 problems, 2 samples each, temperature 0.8): pass@1 ")
    # k above the samples is left out
    assert "pass@2 " in summary and "maj@2 " in summary and "pass@8" not in summary
    rows = read_jsonl(tmp / "results.jsonl")
    assert [row["answer"] for row in rows] == ["1", "2", "3", "4"]  # the first 4 of the file's 6 rows
    assert all(
        set(row) == {"question", "answer", "completions", "correct", "steps", "tool_calls"} for row in rows
    )
    assert all(len(row["completions"]) == 2 and len(row["correct"]) == 2 for row in rows)


def test_the_embedded_default_is_found_from_any_directory(runs):
    """Without --model, an example loads models/minigrpo-tiny-arith next to itself, not a path
    relative to the working directory (which would be looked up on the Hub, offline: an error)."""
    out = runs["embedded"]
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("prompt (") and "--- sample 1" in out.stdout


def test_encode_all_passes_what_round_trips_and_counts_what_is_lost():
    tokenizer = minigrpo.Tokenizer.from_directory(os.path.join(ROOT, "models", "minigrpo-tiny-arith"))
    assert tokenizer.encode_all(["47+23*6\n"]) == [tokenizer.encode("47+23*6\n")]
    with pytest.raises(ValueError, match=r"cannot represent 50% of the characters of the prompts \('ab12'"):
        tokenizer.encode_all(["ab12"])


def test_pretrain_tiny_makes_a_calc_model_that_records_its_task(runs, tmp):
    """One warm-up step of the tool-use demo's model: a checkpoint whose four calculator markers are
    one token each, that records its task for train_math.py and eval_math.py, and whose pretrain.json
    has the tool-use figures. --overwrite replaced the arithmetic checkpoint there whole, and the save
    deleted a killed save's leftover beside it."""
    out = runs["pretrain_calc"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(os.listdir(tmp / "calc")) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "pretrain.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert not (tmp / ".calc.tmp-killed00").exists()
    assert "calculator calls per completion" in out.stdout
    model, tokenizer = minigrpo.load_pretrained(str(tmp / "calc"))
    assert all(len(tokenizer.encode(marker)) == 1 for marker in ["<calc>", "</calc>", "<out>", "</out>"])
    task = read_task(str(tmp / "calc"))
    assert (task["data"], task["tools"], task["tool_format"]) == ("calc", "calculator", "calc")
    record = json.load(open(tmp / "calc" / "pretrain.json"))
    assert record["steps"] == 1 and {"tool_calls_per_completion", "greedy_accuracy_tools_off"} <= set(record)


def test_pretrain_tiny_makes_a_countdown_model_that_records_its_task(runs, tmp):
    """One warm-up step of the countdown model: a tokenizer that keeps the prompts' commas and arrow, no
    calculator markers, the task recorded for train_math.py and eval_math.py, and no tool figures."""
    out = runs["pretrain_countdown"]
    assert out.returncode == 0, out.stderr[-3000:]
    _, tokenizer = minigrpo.load_pretrained(str(tmp / "countdown"))
    assert tokenizer.decode(tokenizer.encode("13,12,7->8\n")) == "13,12,7->8\n"
    assert tokenizer.decode(tokenizer.encode("<calc>")) != "<calc>"  # no marker, nor its letters
    task = read_task(str(tmp / "countdown"))
    assert task == {"data": "countdown", "difficulty": 1, "template": "tiny", "max_completion_length": 40}
    record = json.load(open(tmp / "countdown" / "pretrain.json"))
    assert record["steps"] == 1 and "tool_calls_per_completion" not in record
    assert "calculator" not in out.stdout
