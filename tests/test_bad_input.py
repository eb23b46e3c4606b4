"""Bad input to the command-line tools (issue 16, item 15; issue 22, items 10 and 12): each case exits
non-zero with one line on stderr that names the problem, never a traceback, and the output checks come
before any work. Rows a data set cannot use are skipped with a note instead (NOTED).

One table, run through tests/tool_runner.py: every case is its own process, forked from one that has
imported torch and the library once (a process per case from scratch would cost 2-3 s each). The table
runs beside the suite's other files (background_work, conftest's Background).
"""

import errno
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import in_a_process, tiny_model, tiny_run, tiny_tokenizer, tree

import minigrpo
from minigrpo import files

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# its tokenizer keeps digits and operators only
EMBEDDED = os.path.join(ROOT, "models", "minigrpo-tiny-arith")
LONG = "What is 12 + 30? " * 40  # about 280 tokens, beyond the tiny model's context of 64
HUGE = "What is 12 + 30? " * 600_000  # 10 MB: tokenizing it takes half a minute, refusing it must not

# What each tool is given besides the input under test (a case's own flags replace these); {name}: the case's.
BASE = {
    "sample.py": {"--prompt": "12+30", "--max_new_tokens": "4"},
    "eval_math.py": {
        "--data": "arithmetic",
        "--count": "2",
        "--max_new_tokens": "4",
        "--output": "{tmp}/results/{name}.jsonl",
    },
    "train_math.py": {
        "--template": "tiny",
        "--train_count": "20",
        "--eval_count": "2",
        "--steps": "1",
        "--output_dir": "{tmp}/runs/{name}",
    },
}

# The inputs every tool that loads a checkpoint must refuse: (case, arguments, what stderr says).
MODEL_INPUTS = [
    ("device_unknown", ["--model", "{ckpt}", "--device", "bogus"], "unknown device 'bogus'"),
    (
        "device_cuda_without_gpu",
        ["--model", "{ckpt}", "--device", "cuda"],
        "device 'cuda' asks for a GPU, but torch sees none",
    ),
    ("no_tokenizer_json", ["--model", "{no_tokenizer}"], "{no_tokenizer} has no tokenizer.json"),
    (
        "safetensors_truncated",
        ["--model", "{truncated}"],
        "{truncated}/model.safetensors is not a readable safetensors file",
    ),
    (
        "safetensors_empty",
        ["--model", "{empty}"],
        "{empty}/model.safetensors is not a readable safetensors file",
    ),
    (
        "safetensors_corrupt",
        ["--model", "{corrupt}"],
        "{corrupt}/model.safetensors is not a readable safetensors file",
    ),
    (
        "config_json_null",
        ["--model", "{config_null}"],
        "{config_null}/config.json holds null, not a JSON object",
    ),
    (
        "config_json_list",
        ["--model", "{config_list}"],
        "{config_list}/config.json holds [1, 2], not a JSON object",
    ),
    (
        "tokenizer_json_bad",
        ["--model", "{bad_tokenizer}"],
        "{bad_tokenizer}/tokenizer.json is not a tokenizer file",
    ),
]
# (tool, case, arguments, what stderr says); "output" cases also pass a damaged --model, whose error
# would show instead if the output check came after loading it: they prove the check comes first.
CASES = [(tool, case, args, message) for tool in BASE for case, args, message in MODEL_INPUTS] + [
    (
        "sample.py",
        "prompt_beyond_context",
        ["--model", "{ckpt}", "--prompt", LONG],
        "exceeds the model's context of 64",
    ),
    # its message also says "exceeds the model's context of 64"
    (
        "eval_math.py",
        "prompt_beyond_context",
        ["--model", "{ckpt}", "--data", "{long}"],
        "{long}, line 2 (prompts) has",
    ),
    # the file's line, counted from 1, not the row's index
    (
        "train_math.py",
        "prompt_beyond_context",
        ["--model", "{ckpt}", "--eval_data", "{long}", "--max_completion_length", "8"],
        "{long}, line 2 (held-out prompts) has",
    ),
    (
        "train_math.py",
        "config_model_is_a_number",
        ["--config", "{config_model_5}"],
        "{config_model_5}: model must be text, got 5",
    ),
    (
        "train_math.py",
        "config_data_is_a_list",
        ["--config", "{config_data_list}", "--model", "{ckpt}"],
        "{config_data_list}: data must be text, got [1, 2]",
    ),
    (
        "train_math.py",
        "config_unknown_keys",
        ["--config", "{config_unknown}"],
        "{config_unknown} has unknown options: epochs, lr",
    ),
    # SamplingConfig's check
    (
        "train_math.py",
        "config_top_p_0",
        ["--config", "{config_top_p_0}"],
        "top_p must be in (0, 1], got 0",
    ),
    # the objectives menu (issue 53): each setting refused where the config or the trainer checks it
    (
        "train_math.py",
        "estimator_unknown",
        ["--advantage_estimator", "gae"],
        "argument --advantage_estimator: invalid choice: 'gae'",
    ),
    (
        "train_math.py",
        "dual_clip_not_above_1",
        ["--clip_ratio_c", "1.0"],
        "clip_ratio_c must be > 1 (dual-clip caps a negative advantage's loss at clip_ratio_c * |A|)",
    ),
    (
        "train_math.py",
        "pass_k_above_the_group",
        ["--advantage_estimator", "passk", "--pass_k", "99"],
        "pass_k=99 is more than num_generations=",
    ),
    # log V is known only once the model is loaded: the trainer checks it, before any step
    (
        "train_math.py",
        "entropy_target_above_log_v",
        ["--model", "{ckpt}", "--config", "{config_entropy_target_50}"],
        "entropy_target must be in (0, log V) = (0, ",
    ),
    (
        "train_math.py",
        "entropy_option_unread",
        ["--entropy_target", "0.5"],
        "entropy_target=0.5 is read only with use_adaptive_entropy; here it would do nothing",
    ),
    (
        "train_math.py",
        "output_dir_is_a_file",
        ["--model", "{truncated}", "--output_dir", "{file}"],
        "--output_dir {file} is a file; it must be a directory",
    ),
    (
        "train_math.py",
        "output_dir_under_a_file",
        ["--model", "{truncated}", "--output_dir", "{file}/run"],
        "--output_dir {file}/run cannot be created: {file} is a file",
    ),
    (
        "train_math.py",
        "output_dir_not_writable",
        ["--model", "{truncated}", "--output_dir", "{read_only}/run"],
        "--output_dir {read_only}/run cannot be written: no write permission in {read_only}",
    ),
    (
        "eval_math.py",
        "max_batch_rows_0",
        ["--model", "{ckpt}", "--max_batch_rows", "0"],
        "max_batch_rows must be a positive integer (or None for no limit), got 0",
    ),
    (
        "eval_math.py",
        "max_batch_rows_negative",
        ["--model", "{ckpt}", "--max_batch_rows", "-1"],  # once pass@1 0.000
        "max_batch_rows must be a positive integer (or None for no limit), got -1",
    ),
    (
        "eval_math.py",
        "output_is_a_directory",
        ["--model", "{truncated}", "--output", "{tmp}"],
        "--output {tmp} is a directory",
    ),
    (
        "eval_math.py",
        "output_under_a_file",
        ["--model", "{truncated}", "--output", "{file}/results.jsonl"],
        "--output {file}/results.jsonl cannot be created: {file} is a file",
    ),
    (
        "eval_math.py",
        "output_not_writable",
        ["--model", "{truncated}", "--output", "{read_only}/results.jsonl"],
        "--output {read_only}/results.jsonl cannot be created: no write permission in {read_only}",
    ),
    # tools (issue 25): an unknown tool, a tokenizer without the format's markers, a bad recorded task
    (
        "train_math.py",
        "tools_unknown",
        ["--model", "{ckpt}", "--tools", "abacus"],
        "unknown tool(s) abacus; registered: calculator, python",
    ),
    (
        "eval_math.py",
        "tools_unknown",
        ["--model", "{ckpt}", "--tools", "abacus"],
        "unknown tool(s) abacus; registered: calculator, python",
    ),
    (
        "train_math.py",
        "tool_markers_missing",
        ["--model", "{ckpt}", "--tools", "calculator"],
        "the tool-call marker '<calc>' is 6 tokens of this tokenizer, not one",
    ),
    (
        "eval_math.py",
        "tool_markers_missing",
        ["--model", "{ckpt}", "--tools", "calculator"],
        "the tool-call marker '<calc>' is 6 tokens of this tokenizer, not one",
    ),
    (
        "train_math.py",
        "task_not_a_mapping",
        ["--model", "{task_list}"],
        "{task_list}/tokenizer_config.json: minigrpo_task must map option names to values, got [1, 2]",
    ),
    (
        "eval_math.py",
        "task_not_a_mapping",
        ["--model", "{task_list}"],
        "{task_list}/tokenizer_config.json: minigrpo_task must map option names to values, got [1, 2]",
    ),
    (
        "train_math.py",
        "task_unknown_option",
        ["--model", "{task_unknown}"],
        "{task_unknown}/tokenizer_config.json: minigrpo_task has unknown options: epochs",
    ),
    (
        "pretrain_tiny.py",
        "eval_count_0",
        ["--eval_count", "0", "--output", "{tmp}/pretrained"],
        "--eval_count must be a positive integer, got 0",
    ),
    (
        "pretrain_tiny.py",
        "output_is_a_file",
        ["--output", "{file}"],
        "--output {file} is a file; it must be a directory",
    ),
    (
        "pretrain_tiny.py",
        "output_under_a_file",
        ["--output", "{file}/model"],
        "--output {file}/model cannot be created: {file} is a file",
    ),
    # Earlier one-line errors, here to share the runner: a missing model or data set, and (item 17) prompts
    # that the embedded default's tokenizer cannot represent.
    (
        "sample.py",
        "model_missing",
        ["--model", "{tmp}/missing"],
        "no such checkpoint directory: {tmp}/missing",
    ),
    (
        "sample.py",
        "model_missing_local_path",
        ["--model", "models/no-such-model"],  # ./models exists: never a Hub look-up
        "no such checkpoint directory: models/no-such-model",
    ),
    (
        "eval_math.py",
        "model_missing",
        ["--model", "{tmp}/missing"],
        "no such checkpoint directory: {tmp}/missing",
    ),
    (
        "eval_math.py",
        "data_missing",
        ["--model", "{ckpt}", "--data", "{tmp}/none.jsonl"],
        "unknown dataset '{tmp}/none.jsonl'",
    ),
    (
        "sample.py",
        "prompt_the_tokenizer_cannot_represent",
        ["--prompt", "What is 12+7*3?"],  # it keeps only 12+7*3
        "minigrpo-tiny-arith cannot represent",
    ),
    (
        "train_math.py",
        "prompt_the_tokenizer_cannot_represent",
        ["--data", "{gsm8k}"],
        "minigrpo-tiny-arith cannot represent",
    ),
]
# Issue 22, item 12: numbers that are not finite, 0 read as "the default", a YAML error, a reward weight, a
# data set's NaN, a data set of golds nothing can match; item 10: output_dir where os.access says yes but
# nothing can be written.
CASES += [
    (
        "train_math.py",
        "completion_beyond_context",
        ["--model", "{ckpt}", "--max_completion_length", "100000"],
        "max_completion_length 100000 leaves no room for a prompt: the model's context is",
    ),
    (
        "train_math.py",
        "eval_count_negative",
        ["--eval_count", "-5"],
        "--eval_count must be a positive integer, got -5",
    ),
    (
        "train_math.py",
        "train_count_zero",
        ["--train_count", "0"],
        "--train_count must be a positive integer, got 0",
    ),
    (
        "train_math.py",
        "temperature_inf",
        ["--model", "{ckpt}", "--temperature", "inf"],
        "temperature must be a finite number, got inf",
    ),
    (
        "train_math.py",
        "learning_rate_nan",
        ["--model", "{ckpt}", "--learning_rate", "nan"],
        "learning_rate must be a finite number, got nan",
    ),
    (
        "sample.py",
        "temperature_inf",
        ["--model", "{ckpt}", "--temperature", "inf"],
        "temperature must be >= 0 and finite",
    ),
    (
        "eval_math.py",
        "temperature_inf",
        ["--model", "{ckpt}", "--temperature", "inf"],
        "temperature must be >= 0 and finite",
    ),
    (
        "sample.py",
        "max_new_tokens_0",
        ["--model", "{ckpt}", "--max_new_tokens", "0"],
        "--max_new_tokens must be a positive integer (leave it out for what the context leaves), got 0",
    ),
    (
        "eval_math.py",
        "max_new_tokens_0",
        ["--model", "{ckpt}", "--max_new_tokens", "0"],
        "--max_new_tokens must be a positive integer (leave it out for what the context leaves), got 0",
    ),
    (
        "train_math.py",
        "config_yaml_error",
        ["--config", "{config_bad_yaml}"],
        "cannot read the config file {config_bad_yaml}: line 3, column 1: expected ',' or ']'",
    ),
    (
        "train_math.py",
        "rewards_weight_not_a_number",
        ["--model", "{ckpt}", "--rewards", "accuracy:abc"],
        "--rewards 'accuracy:abc': the weight of 'accuracy' must be a number, got 'abc'",
    ),
    (
        "eval_math.py",
        "answer_nan",
        ["--model", "{ckpt}", "--data", "{answer_nan}"],
        "{answer_nan}, line 2: field 'answer' is nan",
    ),
    (
        "train_math.py",
        "answer_infinity",
        ["--model", "{ckpt}", "--eval_data", "{answer_infinity}"],
        "{answer_infinity}, line 2: field 'answer' is inf, not a finite number",
    ),
    (
        "eval_math.py",
        "no_gold_can_match",
        ["--model", "{ckpt}", "--data", "{golds_unmatchable}"],
        "{golds_unmatchable}: no row has a gold answer that a completion can match",
    ),
    (
        "train_math.py",
        "output_dir_in_proc",
        ["--model", "{truncated}", "--output_dir", "/proc/minigrpo-run"],
        "--output_dir /proc/minigrpo-run cannot be written",
    ),
    (
        "train_math.py",
        "output_dir_in_sys",
        ["--model", "{truncated}", "--output_dir", "/sys/minigrpo-run/a"],
        "--output_dir /sys/minigrpo-run/a cannot be written",
    ),
    (
        "train_math.py",
        "output_dir_empty",
        ["--model", "{truncated}", "--output_dir", ""],
        "--output_dir is empty",
    ),
    (
        "pretrain_tiny.py",
        "learning_rate_inf",
        ["--output", "{tmp}/pretrained", "--learning_rate", "inf", "--max_steps", "1"],
        "--learning_rate must be a finite number, got inf",
    ),
    (
        "pretrain_tiny.py",
        "stop_accuracy_nan",
        ["--output", "{tmp}/pretrained", "--stop_accuracy", "nan", "--max_steps", "1"],
        "--stop_accuracy must be a finite number, got nan",
    ),
]
# Red-team findings 6, 7, 11 and 13: a reward's inputs are checked on every row before any work (not at the
# step that samples a bad one); argparse's own errors are one line too; settings that would do nothing, or
# value steps without the run's tools, are refused.
SMALL_RUN = ["--model", "{ckpt}", "--num_generations", "2", "--batch_size", "4", "--micro_batch_size", "4"]
CASES += [
    (
        "train_math.py",
        "rewards_length_without_a_band",
        [*SMALL_RUN, "--rewards", "accuracy:1,length:0.1"],
        "row 1: length reward: soft must be a number > 0",
    ),
    (
        "train_math.py",
        "rewards_sql_without_its_columns",
        [*SMALL_RUN, "--rewards", "accuracy:1,sql:1"],
        "reward 'sql' needs the column(s) database, gold_sql; the task has answer",
    ),
    (
        "train_math.py",
        "rewards_code_without_its_columns",
        [*SMALL_RUN, "--rewards", "accuracy:1,code:1"],
        "reward 'code' needs the column(s) tests; the task has answer",
    ),
    (
        "train_math.py",
        "rewards_named_twice",
        [*SMALL_RUN, "--rewards", "accuracy:1,accuracy:1"],
        "the reward 'accuracy' is named 2 times",
    ),
    (
        "train_math.py",
        "advantage_type_unknown",
        ["--model", "{ckpt}", "--advantage_type", "bogus"],
        "argument --advantage_type: invalid choice: 'bogus'",
    ),
    (
        "train_math.py",
        "process_rewards_unknown",
        ["--model", "{ckpt}", "--process_rewards", "bogus"],
        "argument --process_rewards: invalid choice: 'bogus'",
    ),
    (
        "train_math.py",
        "sampling_dtype_unknown",
        ["--model", "{ckpt}", "--sampling_dtype", "int8"],
        "argument --sampling_dtype: invalid choice: 'int8'",
    ),
    (
        "train_math.py",
        "monte_carlo_with_tools",
        [
            *SMALL_RUN,
            *("--advantage_type", "process", "--process_rewards", "monte_carlo", "--tools", "calculator"),
        ],
        "process_rewards='monte_carlo' cannot be combined with tools (calculator)",
    ),
    (
        "train_math.py",
        "monte_carlo_with_outcome_advantages",
        [*SMALL_RUN, "--process_rewards", "monte_carlo"],
        "process_rewards='monte_carlo' values steps for process advantages, which advantage_type='outcome'",
    ),
    (
        "train_math.py",
        "process_samples_without_monte_carlo",
        [*SMALL_RUN, "--process_samples", "8"],
        "process_samples=8 is read only by process_rewards='monte_carlo'",
    ),
    # issue 55, item 6: a teacher that is not there, a coefficient outside [0, 1]
    (
        "train_math.py",
        "teacher_missing",
        [*SMALL_RUN, "--teacher_model", "{tmp}/no-teacher"],
        "teacher_model {tmp}/no-teacher: no such checkpoint directory",
    ),
    (
        "train_math.py",
        "distillation_coef_above_1",
        [*SMALL_RUN, "--teacher_model", "{ckpt}", "--distillation_coef", "1.5"],
        "distillation_coef must be in [0, 1] (1: distillation alone, 0: RL alone), got 1.5",
    ),
]
# Issue 58, item 7: argparse's own errors are one line in every tool, as in train_math.py (a bad choice, a
# value of the wrong type, an unknown flag, a missing argument), not its usage and then the error.
CASES += [
    (
        "eval_math.py",
        "template_unknown",
        ["--template", "bogus"],
        "argument --template: invalid choice: 'bogus'",
    ),
    (
        "eval_math.py",
        "num_samples_not_a_number",
        ["--num_samples", "many"],
        "argument --num_samples: invalid int value: 'many'",
    ),
    ("eval_math.py", "flag_unknown", ["--bogus", "1"], "unrecognized arguments: --bogus 1"),
    ("sample.py", "dtype_unknown", ["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    ("sample.py", "seed_not_a_number", ["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    ("merge_lora.py", "arguments_missing", [], "the following arguments are required: adapter, output"),
    ("merge_lora.py", "dtype_unknown", ["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    ("pretrain_tiny.py", "kind_unknown", ["--kind", "bogus"], "argument --kind: invalid choice: 'bogus'"),
]
# Rows a data set cannot use: skipped (or kept) with a note on stdout, and the run goes on: (tool, case,
# arguments, note).
NOTED = [
    (
        "eval_math.py",
        "golds_skipped_and_unparsed",
        ["--model", "{ckpt}", "--data", "{golds_mixed}", "--count", "5", "--num_samples", "1"],
        [
            "note: {golds_mixed}: skipped 2 of 5 rows whose gold answer no completion can match "
            "(empty once normalised, or its braces unbalanced), first line 3 ('$$')",
            "note: {golds_mixed}: 1 of 5 rows have a gold answer the verifier cannot parse, "
            "first line 5 ('\\\\int_0^1 x dx'); kept, "
            "but only an answer written the same way scores right on them",
            "{golds_mixed} (3 problems",
        ],
    ),
]
SKIPPED = {}  # case -> why it cannot be shown on this machine
if importlib.util.find_spec("yaml") is None:
    SKIPPED["config_yaml_error"] = "PyYAML is not installed"
if torch.cuda.is_available():
    SKIPPED["device_cuda_without_gpu"] = "this machine has a GPU"
if os.geteuid() == 0:
    SKIPPED["output_dir_not_writable"] = SKIPPED["output_not_writable"] = (
        "run as root, who writes through a read-only mode; the 'under a file' cases reach the same check"
    )


def _record_task(directory, task) -> None:
    """Write `task` as the checkpoint's recorded task, tokenizer_config.json's "minigrpo_task"."""
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "minigrpo_task": task}))


def name_of(tool, case):
    return f"{tool.removesuffix('.py')}-{case}"


def checkpoints(tmp) -> dict:
    """A good tiny checkpoint (context 64) and one damaged copy per bad input; the other paths the table
    names."""
    tokenizer = tiny_tokenizer(str(tmp / "tokenizer"))
    good = tmp / "ckpt"
    minigrpo.save_pretrained(
        tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=64), tokenizer, good
    )
    weights = (good / "model.safetensors").read_bytes()
    damage = {
        "no_tokenizer": lambda d: (d / "tokenizer.json").unlink(),
        "truncated": lambda d: (d / "model.safetensors").write_bytes(weights[: len(weights) // 2]),
        "empty": lambda d: (d / "model.safetensors").write_bytes(b""),
        # the header's JSON
        "corrupt": lambda d: (d / "model.safetensors").write_bytes(weights[:8] + b"x" * 32 + weights[40:]),
        "config_null": lambda d: (d / "config.json").write_text("null"),
        "config_list": lambda d: (d / "config.json").write_text("[1, 2]"),
        "bad_tokenizer": lambda d: (d / "tokenizer.json").write_text("{not json"),
        # the task a checkpoint records (tokenizer.read_task): not a mapping, or options no script has
        "task_list": lambda d: _record_task(d, [1, 2]),
        "task_unknown": lambda d: _record_task(d, {"data": "arithmetic", "epochs": 3}),
    }
    paths = {
        "tmp": tmp,
        "ckpt": good,
        "long": tmp / "long.jsonl",
        "file": tmp / "a-file",
        "read_only": tmp / "read-only",
        "config_model_5": tmp / "model-5.json",
        "config_data_list": tmp / "data-list.json",
        "config_unknown": tmp / "unknown.json",
        "config_top_p_0": tmp / "top-p-0.yaml",
        "config_entropy_target_50": tmp / "entropy-target-50.yaml",
        "config_bad_yaml": tmp / "bad.yaml",
        "answer_nan": tmp / "answer-nan.jsonl",
        "answer_infinity": tmp / "answer-infinity.jsonl",
        "golds_unmatchable": tmp / "golds-unmatchable.jsonl",
        "golds_mixed": tmp / "golds-mixed.jsonl",
    }
    for name, edit in damage.items():
        paths[name] = tmp / name
        paths[name].mkdir()
        for file in good.iterdir():
            (paths[name] / file.name).write_bytes(file.read_bytes())
        edit(paths[name])
    paths["long"].write_text(
        json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"})
        + "\n"
        + json.dumps({"question": LONG, "answer": "#### 42"})
        + "\n"
    )
    # the list never closes
    paths["config_bad_yaml"].write_text("learning_rate: 1e-5\nadam_betas: [0.9, 0.95\n")
    first = json.dumps({"problem": "What is 1 + 1?", "answer": "2"})
    # Python's json reads both
    paths["answer_nan"].write_text(first + '\n{"problem": "What is 0 / 0?", "answer": NaN}\n')
    paths["answer_infinity"].write_text(first + '\n{"problem": "What is 1 / 0?", "answer": Infinity}\n')
    paths["golds_unmatchable"].write_text(
        "".join(
            json.dumps({"problem": f"{i} + 1", "answer": gold}) + "\n"
            for i, gold in enumerate(["$$", "\\frac{1", "\\$"])
        )
    )
    # kept, kept, skipped, skipped, kept (not parsed)
    golds = [
        "2",
        "\\frac{1}{2}",
        "$$",
        "\\frac{1",
        "\\int_0^1 x dx",
    ]
    paths["golds_mixed"].write_text(
        "".join(json.dumps({"problem": f"{i} + 1", "answer": gold}) + "\n" for i, gold in enumerate(golds))
    )
    paths["gsm8k"] = tmp / "gsm8k.jsonl"
    paths["gsm8k"].write_text(
        json.dumps({"question": "Janet has 3 ducks and 4 eggs. How many?", "answer": "3 + 4 = 7\n#### 7"})
        + "\n"
    )
    paths["file"].write_text("not a directory\n")
    paths["config_model_5"].write_text(json.dumps({"model": 5}))
    paths["config_data_list"].write_text(json.dumps({"data": [1, 2]}))
    paths["config_unknown"].write_text(json.dumps({"epochs": 3, "learning_rate": 1e-5, "lr": 0.1}))
    paths["config_top_p_0"].write_text("top_p: 0\n")
    paths["config_entropy_target_50"].write_text(
        "use_adaptive_entropy: true\nentropy_coef: 0.01\nentropy_target: 50\n"
    )
    paths["read_only"].mkdir(mode=0o555)
    return paths


def made_checkpoints(tmp: str) -> dict[str, str]:
    """checkpoints(tmp), its paths as text: what background_work gets back from its own process."""
    return {name: str(path) for name, path in checkpoints(Path(tmp)).items()}


def background_work(tmp_path_factory):
    """Every case of the table, run at once beside the suite's other files (conftest's Background); name ->
    (exit status, stdout, stderr), and the paths. The checkpoints are made in a process of their own:
    making them draws from torch's random generator, which the tests running meanwhile seed."""
    tmp = tmp_path_factory.mktemp("bad_input")
    made = in_a_process("test_bad_input", "made_checkpoints", str(tmp))
    paths = {name: Path(path) for name, path in made.items()}
    jobs = []
    for tool, case, args, _ in CASES + NOTED:
        if case not in SKIPPED:
            name = name_of(tool, case)
            flags = {**BASE.get(tool, {}), **dict(zip(args[::2], args[1::2]))}
            argv = [part.format(name=name, **paths) for flag in flags.items() for part in flag]
            jobs.append({"name": name, "script": tool, "argv": argv})
    jobs.append({"name": "crash", "script": "no_such_tool.py", "argv": []})  # the runner shows tracebacks too
    out = tmp / "out"
    out.mkdir()
    runner = subprocess.run(
        [sys.executable, os.path.join(HERE, "tool_runner.py"), str(out)],
        input=json.dumps(jobs),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert runner.returncode == 0, runner.stderr[-3000:]
    statuses = json.loads(runner.stdout)
    results = {
        name: (status, (out / f"{name}.out").read_text(), (out / f"{name}.err").read_text())
        for name, status in statuses.items()
    }
    return results, paths


@pytest.fixture(scope="module")
def runs(background):
    """background_work's runs: name -> (exit status, stdout, stderr), and the paths."""
    results, paths = background.result(__name__)
    yield results, paths
    paths["read_only"].chmod(0o755)  # so that pytest can remove it


@pytest.mark.parametrize(
    "tool, case, args, message",
    [
        pytest.param(
            *row,
            id=name_of(*row[:2]),
            marks=[pytest.mark.skip(reason=SKIPPED[row[1]])] if row[1] in SKIPPED else [],
        )
        for row in CASES
    ],
)
def test_bad_input_is_refused_in_one_line(runs, tool, case, args, message):
    results, paths = runs
    status, stdout, stderr = results[name_of(tool, case)]
    assert status != 0 and "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: "), stderr
    assert message.format(**paths) in lines[0]
    # refused before anything ran: the damaged --model was never read, nothing was printed
    if "output" in case:
        assert stdout == ""
    if tool == "train_math.py":  # nothing written
        assert not (paths["tmp"] / "runs" / name_of(tool, case)).exists()


@pytest.mark.parametrize("tool, case, args, notes", NOTED, ids=[name_of(*row[:2]) for row in NOTED])
def test_rows_a_data_set_cannot_use_are_named_in_a_note(runs, tool, case, args, notes):
    results, paths = runs
    status, stdout, stderr = results[name_of(tool, case)]
    assert status == 0, stderr
    for note in notes:
        assert note.format(**paths) in stdout, stdout


# python -m minigrpo.download (issue 58, item 7's follow-up): (case, arguments, what its one line says). The
# Hub is offline: a check that came after asking it would say "could not fetch" instead.
DOWNLOAD_CASES = [
    ("flag_unknown", ["Qwen/Qwen3-0.6B", "--bogus"], "unrecognized arguments: --bogus"),
    ("repo_id_missing", [], "the following arguments are required: repo_id"),
    (
        "repo_id_not_one",
        ["not a repo"],
        "'not a repo' is not a Hugging Face repo id, such as Qwen/Qwen3-0.6B",
    ),
    # its default directory would be models/..
    ("repo_id_climbing", ["Qwen/.."], "'Qwen/..' is not a Hugging Face repo id"),
    ("dir_empty", ["Qwen/Qwen3-0.6B", "--dir", ""], "--dir is empty: name a directory"),
    ("dir_a_file", ["Qwen/Qwen3-0.6B", "--dir", "{file}"], "the target directory {file} is a file"),
    (
        "dir_under_a_file",
        ["Qwen/Qwen3-0.6B", "--dir", "{file}/qwen"],
        "the target directory {file}/qwen cannot be created: {file} is a file",
    ),
    (
        "dir_not_a_checkpoint",
        ["Qwen/Qwen3-0.6B", "--dir", "{notes}"],
        "the target directory {notes} holds config.txt, which no Hugging Face checkpoint holds",
    ),
    (
        "dir_in_proc",
        ["Qwen/Qwen3-0.6B", "--dir", "/proc/minigrpo-download"],
        "the target directory /proc/minigrpo-download cannot be written: writing a file in /proc fails",
    ),
]


@pytest.fixture
def download_places(tmp_path, monkeypatch) -> dict:
    """The Hub offline, and the directories the download cases name: a file, a directory of notes (one of
    them named as a checkpoint's file), an earlier download."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    paths = {"file": tmp_path / "a-file", "notes": tmp_path / "notes", "earlier": tmp_path / "earlier"}
    paths["file"].write_text("not a directory\n")
    paths["notes"].mkdir()
    (paths["notes"] / "config.txt").write_text("my settings\n")
    (paths["notes"] / "config.json").write_text('{"mine": 1}\n')  # a download would write over it
    (paths["earlier"] / ".cache" / "huggingface").mkdir(parents=True)
    (paths["earlier"] / "config.json").write_text('{"model_type": "qwen3"}\n')
    return paths


@pytest.mark.parametrize("case, args, message", DOWNLOAD_CASES, ids=[row[0] for row in DOWNLOAD_CASES])
def test_bad_input_to_the_download_command_is_one_line_and_writes_nothing(
    download_places, tmp_path, case, args, message
):
    from minigrpo import download

    paths = download_places
    before = tree(str(tmp_path))
    with pytest.raises(SystemExit) as stop:
        download.main([arg.format(**paths) for arg in args])
    line = str(stop.value.code)  # what the interpreter prints, exiting 1
    assert line.startswith("python -m minigrpo.download: ") and "\n" not in line, line
    assert message.format(**paths) in line
    assert tree(str(tmp_path)) == before
    assert not os.path.exists("/proc/minigrpo-download")


def test_a_download_into_an_earlier_one_asks_the_hub(download_places, capsys):
    """An earlier download's directory (a checkpoint's files and huggingface_hub's .cache) is not refused:
    the download completes or updates it. Offline, huggingface_hub returns it as it is."""
    from minigrpo import download

    earlier = str(download_places["earlier"])
    assert download.main(["Qwen/Qwen3-0.6B", "--dir", earlier]) == 0
    assert capsys.readouterr().out == f"Qwen/Qwen3-0.6B -> {earlier}\n"


def test_a_10_mb_prompt_is_refused_without_being_tokenized(examples_server, tmp_path):
    """Tokenizing 10 MB takes half a minute; a prompt that long cannot fit whatever its tokens, and is refused
    in time linear in its length (a look at its characters), naming its file and line."""
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"question": HUGE, "answer": "#### 42"}) + "\n")
    # the server has imported
    examples_server.run("eval_math.py", ["--data", "no-such-kind"], str(tmp_path), "warm-up")
    started = time.monotonic()
    code = examples_server.run(
        "eval_math.py",
        ["--model", EMBEDDED, "--data", str(huge), "--output", str(tmp_path / "r.jsonl")],
        str(tmp_path),
        "huge",
    )
    seconds = time.monotonic() - started
    stderr = (tmp_path / "huge.err").read_text()
    assert code == 1 and stderr.count("\n") == 1, stderr
    assert f"{huge}, line 1 (prompts) has {len(HUGE):,} characters, too many for the" in stderr
    assert seconds < 10, seconds  # a few seconds for reading and checking 10 MB on a busy machine; not 30-90


def load_train_math():
    """examples/train_math.py as a module (its __main__ part not run)."""
    spec = importlib.util.spec_from_file_location(
        "train_math", os.path.join(ROOT, "examples", "train_math.py")
    )
    train_math = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_math)
    return train_math


def test_a_full_disk_at_the_output_dir_probe_is_one_line_naming_the_free_space(tmp_path, monkeypatch):
    """ENOSPC while probing --output_dir (a write, or the fsync after it) says so, and leaves nothing
    behind."""
    train_math = load_train_math()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "runs" / "full"
    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", full)
        with pytest.raises(SystemExit) as stop:
            train_math.check_output_dir(str(out))
    assert str(stop.value.code).startswith(
        f"train_math.py: --output_dir {out} cannot be written: no space left on the device ("
    ) and str(stop.value.code).endswith(" bytes free)")
    assert list(tmp_path.iterdir()) == []  # neither the directories it made nor the probe file are left


def test_runs_probing_sibling_output_dirs_at_once_both_pass(tmp_path, monkeypatch):
    """Two runs started at once into runs/a and runs/b, where runs/ does not exist yet: the other run
    makes runs/ between this probe's look and its mkdir. The probe goes on with the other's runs/, and,
    once it passes, keeps runs/ (the other run may be about to make its directory there)."""
    real_mkdir = os.mkdir

    def the_other_run_first(path, *args, **kwargs):
        if os.path.basename(path) == "runs" and not os.path.exists(path):
            real_mkdir(path)  # the other run's
        return real_mkdir(path, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(os, "mkdir", the_other_run_first)
        assert files.write_probe(str(tmp_path / "runs" / "a")) is None
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and list((tmp_path / "runs").iterdir()) == []
    assert files.write_probe(str(tmp_path / "runs" / "b")) is None


def test_wall_seconds_add_up_the_processes_of_a_killed_run(examples_server, tmp_path):
    """A run killed as it saves its last step, then resumed: the resumed process has nothing left to train,
    and summary.json's wall_seconds still holds the killed process's time (kept in the checkpoint), not only
    its own."""
    out = tmp_path / "run"
    args = [*tiny_run(), "--output_dir", str(out)]
    code = examples_server.train_math(
        args, "save 2: renamed into place, its directory not fsynced", str(tmp_path), "killed"
    )
    assert code == -9, (tmp_path / "killed.err").read_text()[-3000:]
    saved = torch.load(out / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=True).get(
        "wall_seconds", 0
    )
    started = time.monotonic()
    assert examples_server.train_math(args + ["--resume"], None, str(tmp_path), "resumed") == 0, (
        tmp_path / "resumed.err"
    ).read_text()[-3000:]
    resumed = time.monotonic() - started  # the resumed process's time, start-up included
    wall = json.load(open(out / "summary.json"))["wall_seconds"]
    # 0.05: the summary's rounding
    assert saved > 0 and saved <= wall <= saved + resumed + 0.05, (
        saved,
        wall,
        resumed,
    )


def test_the_runner_shows_what_the_interpreter_would(runs):
    """A tool that raises prints its traceback through the runner: "no Traceback" above is not for want of
    one."""
    status, _, stderr = runs[0]["crash"]
    assert (
        status == 1
        and stderr.startswith("Traceback (most recent call last):")
        and "no_such_tool.py" in stderr
    )
