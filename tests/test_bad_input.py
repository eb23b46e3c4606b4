"""Bad input to the command-line tools (issue 16, item 15): each case exits non-zero with one line on
stderr that names the problem, never a traceback, and the output checks come before any work.

One table, run through tests/tool_runner.py: every case is its own process, forked from one that has
imported torch and the library once (a process per case from scratch would cost 2-3 s each).
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

import minigrpo

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LONG = "What is 12 + 30? " * 40  # about 280 tokens, beyond the tiny model's context of 64

# What each tool is given besides the input under test (a case's own flags replace these); {name}: the case's.
BASE = {
    "sample.py": {"--prompt": "12+30", "--max_new_tokens": "4"},
    "eval_math.py": {"--data": "arithmetic", "--count": "2", "--max_new_tokens": "4", "--output": "{tmp}/results/{name}.jsonl"},
    "train_math.py": {"--template": "tiny", "--train_count": "20", "--eval_count": "2", "--steps": "1",
                      "--output_dir": "{tmp}/runs/{name}"},
}

# The inputs every tool that loads a checkpoint must refuse: (case, arguments, what stderr says).
MODEL_INPUTS = [
    ("device_unknown", ["--model", "{ckpt}", "--device", "bogus"], "unknown device 'bogus'"),
    ("device_cuda_without_gpu", ["--model", "{ckpt}", "--device", "cuda"], "device 'cuda' asks for a GPU, but torch sees none"),
    ("no_tokenizer_json", ["--model", "{no_tokenizer}"], "{no_tokenizer} has no tokenizer.json"),
    ("safetensors_truncated", ["--model", "{truncated}"], "{truncated}/model.safetensors is not a readable safetensors file"),
    ("safetensors_empty", ["--model", "{empty}"], "{empty}/model.safetensors is not a readable safetensors file"),
    ("safetensors_corrupt", ["--model", "{corrupt}"], "{corrupt}/model.safetensors is not a readable safetensors file"),
    ("config_json_null", ["--model", "{config_null}"], "{config_null}/config.json holds null, not a JSON object"),
    ("config_json_list", ["--model", "{config_list}"], "{config_list}/config.json holds [1, 2], not a JSON object"),
    ("tokenizer_json_bad", ["--model", "{bad_tokenizer}"], "{bad_tokenizer}/tokenizer.json is not a tokenizer file"),
]
# (tool, case, arguments, what stderr says); "output" cases also pass a damaged --model, whose error
# would show instead if the output check came after loading it: they prove the check comes first.
CASES = [(tool, case, args, message) for tool in BASE for case, args, message in MODEL_INPUTS] + [
    ("sample.py", "prompt_beyond_context", ["--model", "{ckpt}", "--prompt", LONG], "exceeds the model's context of 64"),
    ("eval_math.py", "prompt_beyond_context", ["--model", "{ckpt}", "--data", "{long}"], "exceeds the model's context of 64"),
    ("train_math.py", "prompt_beyond_context", ["--model", "{ckpt}", "--eval_data", "{long}", "--max_completion_length", "8"],
     "row 0 of the held-out prompts ({long}) has"),
    ("train_math.py", "config_model_is_a_number", ["--config", "{config_model_5}"], "{config_model_5}: model must be text, got 5"),
    ("train_math.py", "config_data_is_a_list", ["--config", "{config_data_list}", "--model", "{ckpt}"],
     "{config_data_list}: data must be text, got [1, 2]"),
    ("train_math.py", "config_unknown_keys", ["--config", "{config_unknown}"], "{config_unknown} has unknown options: epochs, lr"),
    ("train_math.py", "config_top_p_0", ["--config", "{config_top_p_0}"], "top_p must be in (0, 1], got 0"),  # SamplingConfig's check
    ("train_math.py", "output_dir_is_a_file", ["--model", "{truncated}", "--output_dir", "{file}"],
     "--output_dir {file} is a file; it must be a directory"),
    ("train_math.py", "output_dir_under_a_file", ["--model", "{truncated}", "--output_dir", "{file}/run"],
     "--output_dir {file}/run cannot be created: {file} is a file"),
    ("train_math.py", "output_dir_not_writable", ["--model", "{truncated}", "--output_dir", "{read_only}/run"],
     "--output_dir {read_only}/run cannot be written: no write permission in {read_only}"),
    ("eval_math.py", "max_batch_rows_0", ["--model", "{ckpt}", "--max_batch_rows", "0"],
     "max_batch_rows must be a positive integer (or None for no limit), got 0"),
    ("eval_math.py", "max_batch_rows_negative", ["--model", "{ckpt}", "--max_batch_rows", "-1"],  # once pass@1 0.000
     "max_batch_rows must be a positive integer (or None for no limit), got -1"),
    ("eval_math.py", "output_is_a_directory", ["--model", "{truncated}", "--output", "{tmp}"], "--output {tmp} is a directory"),
    ("eval_math.py", "output_under_a_file", ["--model", "{truncated}", "--output", "{file}/results.jsonl"],
     "--output {file}/results.jsonl cannot be created: {file} is a file"),
    ("eval_math.py", "output_not_writable", ["--model", "{truncated}", "--output", "{read_only}/results.jsonl"],
     "--output {read_only}/results.jsonl cannot be created: no write permission in {read_only}"),
    ("pretrain_tiny.py", "output_is_a_file", ["--output", "{file}"], "--output {file} is a file; it must be a directory"),
    ("pretrain_tiny.py", "output_under_a_file", ["--output", "{file}/model"], "--output {file}/model cannot be created: {file} is a file"),
    # Earlier one-line errors, here to share the runner: a missing model or data set, and (item 17) prompts that
    # the embedded default's tokenizer cannot represent.
    ("sample.py", "model_missing", ["--model", "{tmp}/missing"], "no such checkpoint directory: {tmp}/missing"),
    ("sample.py", "model_missing_local_path", ["--model", "models/no-such-model"],  # ./models exists: never a Hub look-up
     "no such checkpoint directory: models/no-such-model"),
    ("eval_math.py", "model_missing", ["--model", "{tmp}/missing"], "no such checkpoint directory: {tmp}/missing"),
    ("eval_math.py", "data_missing", ["--model", "{ckpt}", "--data", "{tmp}/none.jsonl"], "unknown dataset '{tmp}/none.jsonl'"),
    ("sample.py", "prompt_the_tokenizer_cannot_represent", ["--prompt", "What is 12+7*3?"],  # it keeps only 12+7*3
     "minigrpo-tiny-arith cannot represent"),
    ("train_math.py", "prompt_the_tokenizer_cannot_represent", ["--data", "{gsm8k}"], "minigrpo-tiny-arith cannot represent"),
]
SKIPPED = {}  # case -> why it cannot be shown on this machine
if torch.cuda.is_available():
    SKIPPED["device_cuda_without_gpu"] = "this machine has a GPU"
if os.geteuid() == 0:
    SKIPPED["output_dir_not_writable"] = SKIPPED["output_not_writable"] = (
        "run as root, who writes through a read-only mode; the 'under a file' cases reach the same check")


def name_of(tool, case):
    return f"{tool.removesuffix('.py')}-{case}"


def checkpoints(tmp) -> dict:
    """A good tiny checkpoint (context 64) and one damaged copy per bad input; the other paths the table names."""
    tokenizer = tiny_tokenizer(str(tmp / "tokenizer"))
    good = tmp / "ckpt"
    minigrpo.save_pretrained(tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=64), tokenizer, good)
    weights = (good / "model.safetensors").read_bytes()
    damage = {
        "no_tokenizer": lambda d: (d / "tokenizer.json").unlink(),
        "truncated": lambda d: (d / "model.safetensors").write_bytes(weights[:len(weights) // 2]),
        "empty": lambda d: (d / "model.safetensors").write_bytes(b""),
        "corrupt": lambda d: (d / "model.safetensors").write_bytes(weights[:8] + b"x" * 32 + weights[40:]),  # the header's JSON
        "config_null": lambda d: (d / "config.json").write_text("null"),
        "config_list": lambda d: (d / "config.json").write_text("[1, 2]"),
        "bad_tokenizer": lambda d: (d / "tokenizer.json").write_text("{not json"),
    }
    paths = {"tmp": tmp, "ckpt": good, "long": tmp / "long.jsonl", "file": tmp / "a-file", "read_only": tmp / "read-only",
             "config_model_5": tmp / "model-5.json", "config_data_list": tmp / "data-list.json",
             "config_unknown": tmp / "unknown.json", "config_top_p_0": tmp / "top-p-0.yaml"}
    for name, edit in damage.items():
        paths[name] = tmp / name
        paths[name].mkdir()
        for file in good.iterdir():
            (paths[name] / file.name).write_bytes(file.read_bytes())
        edit(paths[name])
    paths["long"].write_text(json.dumps({"question": LONG, "answer": "#### 42"}) + "\n")
    paths["gsm8k"] = tmp / "gsm8k.jsonl"
    paths["gsm8k"].write_text(json.dumps({"question": "Janet has 3 ducks and 4 eggs. How many?", "answer": "3 + 4 = 7\n#### 7"}) + "\n")
    paths["file"].write_text("not a directory\n")
    paths["config_model_5"].write_text(json.dumps({"model": 5}))
    paths["config_data_list"].write_text(json.dumps({"data": [1, 2]}))
    paths["config_unknown"].write_text(json.dumps({"epochs": 3, "learning_rate": 1e-5, "lr": 0.1}))
    paths["config_top_p_0"].write_text("top_p: 0\n")
    paths["read_only"].mkdir(mode=0o555)
    return paths


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case of the table, run at once; name -> (exit status, stdout, stderr), and the paths."""
    tmp = tmp_path_factory.mktemp("bad_input")
    paths = checkpoints(tmp)
    jobs = []
    for tool, case, args, _ in CASES:
        if case not in SKIPPED:
            name = name_of(tool, case)
            flags = {**BASE.get(tool, {}), **dict(zip(args[::2], args[1::2]))}
            argv = [part.format(name=name, **paths) for flag in flags.items() for part in flag]
            jobs.append({"name": name, "script": tool, "argv": argv})
    jobs.append({"name": "crash", "script": "no_such_tool.py", "argv": []})  # the runner shows tracebacks too
    out = tmp / "out"
    out.mkdir()
    runner = subprocess.run([sys.executable, os.path.join(HERE, "tool_runner.py"), str(out)], input=json.dumps(jobs), cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert runner.returncode == 0, runner.stderr[-3000:]
    statuses = json.loads(runner.stdout)
    yield {name: (status, (out / f"{name}.out").read_text(), (out / f"{name}.err").read_text())
           for name, status in statuses.items()}, paths
    paths["read_only"].chmod(0o755)  # so that pytest can remove it


@pytest.mark.parametrize("tool, case, args, message", [
    pytest.param(*row, id=name_of(*row[:2]), marks=[pytest.mark.skip(reason=SKIPPED[row[1]])] if row[1] in SKIPPED else [])
    for row in CASES])
def test_bad_input_is_refused_in_one_line(runs, tool, case, args, message):
    results, paths = runs
    status, stdout, stderr = results[name_of(tool, case)]
    assert status != 0 and "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: "), stderr
    assert message.format(**paths) in lines[0]
    if "output" in case:  # refused before anything ran: the damaged --model was never read, nothing was printed
        assert stdout == ""
    if tool == "train_math.py":  # nothing written
        assert not (paths["tmp"] / "runs" / name_of(tool, case)).exists()


def test_the_runner_shows_what_the_interpreter_would(runs):
    """A tool that raises prints its traceback through the runner: "no Traceback" above is not for want of one."""
    status, _, stderr = runs[0]["crash"]
    assert status == 1 and stderr.startswith("Traceback (most recent call last):") and "no_such_tool.py" in stderr
