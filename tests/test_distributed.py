"""Data-parallel GRPO on CPU with gloo, every job launched through torchrun as a user would: one
process and two take the same gradients and train to the same weights (DDP and FSDP2; grpo, dapo
with global statistics and tool observations, outcome+process advantages, dynamic sampling with
uneven ranks, on-policy distillation), resume under two ranks is exact, examples/train_math.py runs
unchanged with --fsdp, and wrong set-ups fail with one clear line.
Every job imports minigrpo from this checkout, whatever else is installed. The jobs run one after
another in background_work, beside the suite's other files (conftest's Background)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import in_a_process, tiny_run

import minigrpo
from minigrpo import distributed
from minigrpo.config import GRPOConfig, TrainConfig
from minigrpo.run import latest_checkpoint, load_state

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# Each run's TrainConfig: helpers.tiny_train_config (distributed_job.py) with TRAIN and its batch over it.
# Adam's early steps are about lr * sign(g) for every |g| >> adam_epsilon: rounding noise (other
# padding, other summation order) in gradients that should be 0, such as the KL's at step 1, would
# become lr-sized moves. A larger epsilon keeps the comparison about the gradients.
TRAIN = dict(max_steps=2, learning_rate=1e-3, adam_epsilon=1e-6)
# Three objectives, each with gradient accumulation over several micro-batches on every rank.
OBJECTIVES = {
    "grpo": (dict(num_generations=4, max_completion_length=10), dict(batch_size=16, micro_batch_size=3)),
    # With tool calls: each completion's observation tokens (distributed_job.py) are context, not loss,
    # and out of dapo's global token count.
    "dapo": (
        dict(
            num_generations=4,
            max_completion_length=10,
            loss_type="dapo",
            scale_rewards="batch",
            epsilon_high=0.28,
            beta=0.04,
            num_iterations=2,
            tools="calculator",
        ),
        dict(batch_size=16, micro_batch_size=4),
    ),
    # Per-token advantages: each completion's step rewards (at least its answer step) travel on its
    # rollout from the rank that scored it; every rank then computes the advantages of the whole batch.
    "process": (
        dict(num_generations=4, max_completion_length=10, loss_type="dapo", advantage_type="outcome+process"),
        dict(batch_size=16, micro_batch_size=3),
    ),
    # Every third prompt's group is flat (distributed_job.py): over 3 steps, a step trains 5 groups
    # (2 on one rank, 3 on the other) and a step's second round samples 1 prompt (none on one rank).
    "dynamic": (
        dict(
            num_generations=4,
            max_completion_length=10,
            loss_type="dr_grpo",
            dynamic_sampling=True,
            max_sampling_rounds=2,
        ),
        dict(batch_size=24, micro_batch_size=3, max_steps=3),
    ),
    # The objectives menu: REINFORCE++'s per-token returns with the KL in its rewards (the reference's
    # log-probs of every rollout, whitened over the whole batch), SAPO's gate on the second pass, and an
    # entropy bonus whose gradient and mean entropy are over every rank.
    "menu": (
        dict(
            num_generations=4,
            max_completion_length=10,
            advantage_estimator="reinforce_plus_plus",
            beta=0.04,
            loss_type="sapo",
            num_iterations=2,
            entropy_coef=0.01,
        ),
        dict(batch_size=16, micro_batch_size=3),
    ),
    # On-policy distillation's full form mixed with the verifier's advantages, under dynamic sampling's
    # uneven ranks: every rank runs the teacher (distributed_job.py's TEACHER, another tiny policy) on
    # the whole batch, a rank short of micro-batches forwards padding that adds no KL, and the tool
    # observations' tokens are context, out of the KL.
    "distill": (
        dict(
            num_generations=4,
            max_completion_length=10,
            teacher_model="TEACHER",
            distillation_form="full",
            distillation_coef=0.5,
            dynamic_sampling=True,
            max_sampling_rounds=2,
            tools="calculator",
        ),
        dict(batch_size=24, micro_batch_size=3, max_steps=3),
    ),
}


# LoRA (not under FSDP2, which refuses it): only the adapters' gradients are all-reduced, and the KL's
# reference is the base with the adapters off on every rank.
LORA = (
    dict(num_generations=4, max_completion_length=10, beta=0.04),
    dict(batch_size=16, micro_batch_size=3, lora_rank=4, learning_rate=1e-2),
)


def background_work(tmp_path_factory) -> dict:
    """Every torchrun job of this file, one after another, beside the suite's other files (conftest's
    Background); what the tests below check."""
    # torchrun leaves its log directory (torchelastic_*) in the temporary directory: pytest's, not the host's
    ENV["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    # the calc format's markers, one token each: the tools objective's trainer checks them at start
    markers = ("<calc>", "</calc>", "<out>", "</out>")
    policy, teacher = (str(tmp_path_factory.mktemp(name)) for name in ("policy", "teacher"))
    policies = [(policy, markers, {}), (teacher, markers, {"seed": 1})]  # both in one process
    checkpoint, ENV["MINIGRPO_TEST_TEACHER"] = in_a_process(
        "helpers", "tiny_policies", policies, max_position_embeddings=128
    )
    layouts = layouts_job(checkpoint, tmp_path_factory)
    return {
        "checkpoint": checkpoint,
        "layouts": layouts,
        "two_nodes": two_nodes_job(layouts, checkpoint, tmp_path_factory),
        "fsdp": fsdp_job(checkpoint, tmp_path_factory.mktemp("fsdp")),
        "refused": refused_job(checkpoint, tmp_path_factory.mktemp("refused")),
    }


@pytest.fixture(scope="module")
def jobs(background) -> dict:
    return background.result(__name__)


@pytest.fixture(scope="module")
def checkpoint(jobs) -> str:
    return jobs["checkpoint"]


@pytest.fixture(scope="module")
def layouts(jobs):
    return jobs["layouts"]


@pytest.fixture(scope="module")
def two_nodes(jobs) -> dict:
    return jobs["two_nodes"]


def torchrun(processes: int, *args, check: bool = True) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        *args,
    ]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


# The checkout first, so that the jobs test this code and not an installed minigrpo; then the tests' helpers.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([ROOT, TESTS])}


def job(processes: int, checkpoint: str, runs: list[dict], **options) -> subprocess.CompletedProcess:
    """distributed_job.py under torchrun (processes ranks on this node)."""
    return torchrun(
        processes, os.path.join(TESTS, "distributed_job.py"), spec_of(checkpoint, runs, **options)
    )


def spec_of(checkpoint: str, runs: list[dict], **options) -> str:
    return json.dumps({"checkpoint": checkpoint, "runs": runs, **options})


def plain_job(checkpoint: str, runs: list[dict], **options) -> subprocess.Popen:
    """distributed_job.py as one plain process (no torchrun), started: wait for it with finish()."""
    return subprocess.Popen(
        [sys.executable, os.path.join(TESTS, "distributed_job.py"), spec_of(checkpoint, runs, **options)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> None:
    """Wait for a started plain job; it must succeed."""
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stdout[-2000:] + stderr[-4000:]


def run(out, objective: str, fixed: bool = False, **train) -> dict:
    grpo, batch = LORA if objective == "lora" else OBJECTIVES[objective]
    return {"grpo": grpo, "train": {**TRAIN, **batch, "output_dir": str(out), **train}, "fixed": fixed}


def final_weights(out) -> dict[str, torch.Tensor]:
    return minigrpo.load_pretrained(latest_checkpoint(str(out)))[0].state_dict()


def metrics(out) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


RESUMED = [("ddp", {}), ("fsdp", {"fsdp": True})]  # the layouts test_resume_under_two_ranks_is_exact resumes


def layouts_job(checkpoint: str, tmp_path_factory):
    """The same fixed completions trained by one plain process, by two under DDP and by two under FSDP2;
    where each process imported minigrpo from is kept in imports/. The two-rank job also runs, with
    sampled completions, the straight and the stopped runs that test_resume_under_two_ranks_is_exact
    compares (one torchrun start-up less). The plain process runs while torchrun starts its ranks."""
    base = tmp_path_factory.mktemp("layouts")
    imports = {"imports_dir": str(base / "imports")}
    (base / "imports").mkdir()
    one = plain_job(
        checkpoint, [run(base / f"one-{name}", name, fixed=True) for name in [*OBJECTIVES, "lora"]], **imports
    )
    layouts = [run(base / f"ddp-{name}", name, fixed=True) for name in [*OBJECTIVES, "lora"]]
    layouts += [run(base / f"fsdp-{name}", name, fixed=True, fsdp=True) for name in OBJECTIVES]
    resumed = [run(base / f"straight-{kind}", "dapo", max_steps=3, **options) for kind, options in RESUMED]
    resumed += [
        run(base / f"stopped-{kind}", "dapo", max_steps=3, stop_at_step=2, **options)
        for kind, options in RESUMED
    ]
    job(2, checkpoint, layouts + resumed, **imports)
    finish(one)
    return base


def test_every_job_imports_minigrpo_from_this_checkout(layouts):
    imported = [path.read_text().splitlines() for path in (layouts / "imports").iterdir()]
    assert sorted(rank for rank, _ in imported) == ["0", "0", "1"]  # one plain process, then two ranks
    for _, path in imported:
        assert os.path.commonpath([os.path.realpath(path), os.path.realpath(ROOT)]) == os.path.realpath(
            ROOT
        ), path


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_two_ranks_train_to_the_weights_of_one_process(layouts, checkpoint, layout, objective):
    one, two = final_weights(layouts / f"one-{objective}"), final_weights(layouts / f"{layout}-{objective}")
    start = minigrpo.load_pretrained(checkpoint)[0].state_dict()
    for name, value in one.items():
        moved = (value - start[name]).abs().max()
        assert moved > 1e-4, f"{name} did not train"
        # fp32 rounding: the chunked LM head sums its weight gradient chunk by chunk, in an order that
        # depends on which rows a rank holds (largest difference seen 1.1e-5, on the tied embedding)
        torch.testing.assert_close(two[name], value, rtol=1e-5, atol=3e-5)
        assert (two[name] - value).abs().max() < 0.01 * moved, name  # the same update, to 1% of it
    # Every logged metric is over all ranks: the same as one process's.
    for a, b in zip(
        metrics(layouts / f"one-{objective}"), metrics(layouts / f"{layout}-{objective}"), strict=True
    ):
        assert a.keys() == b.keys()
        for key in (
            "reward/mean",
            "reward/std",
            "groups/zero_variance_frac",
            "groups/trained",
            "completion/length_mean",
        ):
            assert a[key] == pytest.approx(b[key], rel=1e-6), key
        for key in ("loss", "grad_norm", "clip/region_frac", "entropy", "ratio/mean") + (
            ("kl",) if "kl" in a else ()
        ):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_two_ranks_take_the_gradients_of_one_process(layouts, layout, objective):
    """Every AdamW step's gradients before the clip, whole: AdamW's update hardly depends on the
    gradient's scale, so a loss off by a factor (not scaled by the world size, say) shows here and
    not in the weights. Past the first step the weights already differ by fp32 rounding."""
    one = torch.load(layouts / f"one-{objective}" / "gradients.pt")
    two = torch.load(layouts / f"{layout}-{objective}" / "gradients.pt")
    grpo, batch = OBJECTIVES[objective]
    assert len(one) == len(two) == {**TRAIN, **batch}["max_steps"] * grpo.get("num_iterations", 1)
    for step, (a, b) in enumerate(zip(one, two)):
        assert a.keys() == b.keys() and len(a) > 0
        for name, gradient in a.items():
            scale = float(gradient.abs().max())
            assert scale > 0, (step, name)
            torch.testing.assert_close(
                b[name], gradient, rtol=1e-3, atol=1e-3 * scale, msg=f"step {step}, {name}"
            )


def test_two_ranks_train_lora_adapters_to_those_of_one_process(layouts, checkpoint):
    one, two = (
        minigrpo.load_pretrained(latest_checkpoint(str(layouts / f"{kind}-lora")))[0]
        for kind in ("one", "ddp")
    )
    start = minigrpo.load_pretrained(checkpoint)[0].state_dict()
    adapters = minigrpo.model.adapter_state(one)
    assert adapters and all(
        float(value.detach().abs().max()) > 0 for name, value in adapters.items() if ".lora_B." in name
    )
    for name, value in minigrpo.model.adapter_state(two).items():
        torch.testing.assert_close(value, adapters[name], rtol=1e-5, atol=3e-5)
    for name, value in two.state_dict().items():  # the base, loaded from the run's start, never moved
        if ".lora_" not in name:
            assert torch.equal(value, start[name]), name
    kl = [line["kl"] for line in metrics(layouts / "ddp-lora")]
    assert kl == pytest.approx([line["kl"] for line in metrics(layouts / "one-lora")], rel=1e-4, abs=1e-7)
    assert kl[-1] > 0


def test_lora_under_fsdp_is_refused_with_one_line():
    with pytest.raises(ValueError, match="fsdp cannot be combined with LoRA"):
        TrainConfig(lora_rank=4, fsdp=True).check_against(GRPOConfig(), world_size=2)
    TrainConfig(lora_rank=4, fsdp=True).check_against(GRPOConfig(), world_size=1)  # one process: no FSDP2


def two_nodes_job(layouts, checkpoint: str, tmp_path_factory) -> dict:
    """One job under torchrun --nnodes 2, two agents on this machine with one process each, as on two
    machines (one torchrun start-up for three tests): a grpo run of fixed completions
    (test_two_nodes_train_to_the_weights_of_one_process), the layouts' stopped runs resumed
    (test_resume_under_two_ranks_is_exact), and last a run whose ranks disagree on the configuration,
    which stops the job (test_ranks_that_disagree_on_the_configuration_stop_with_one_line). Each node's
    (exit status, stdout, stderr); the runs' output_dirs are under "out"."""
    base = tmp_path_factory.mktemp("two-nodes")
    runs = [run(base / "grpo", "grpo", fixed=True)]
    runs += [
        run(layouts / f"stopped-{kind}", "dapo", max_steps=3, resume=True, **options)
        for kind, options in RESUMED
    ]
    # each rank asks for another learning rate
    runs.append({**run(base / "disagree", "grpo"), "disagree": True})
    port = str(_free_port())
    agents = []
    for node in (0, 1):
        # files, not pipes: an agent that filled a pipe nobody reads would stall the other node
        with open(base / f"node-{node}.out", "w") as out, open(base / f"node-{node}.err", "w") as err:
            agents.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        "--nnodes",
                        "2",
                        "--node_rank",
                        str(node),
                        "--nproc_per_node",
                        "1",
                        "--master_addr",
                        "127.0.0.1",
                        "--master_port",
                        port,
                        os.path.join(TESTS, "distributed_job.py"),
                        spec_of(checkpoint, runs),
                    ],
                    cwd=ROOT,
                    env=ENV,
                    stdout=out,
                    stderr=err,
                )
            )
    nodes = []
    for node, agent in enumerate(agents):
        agent.wait(timeout=300)
        outputs = [(base / f"node-{node}.{kind}").read_text() for kind in ("out", "err")]
        nodes.append((agent.returncode, *outputs))
    return {"out": base, "nodes": nodes}


def said(two_nodes) -> str:
    """Both nodes' stderr, to show with a failed assertion."""
    return "\n".join(err[-3000:] for _, _, err in two_nodes["nodes"])


def test_two_nodes_train_to_the_weights_of_one_process(layouts, two_nodes):
    """torchrun --nnodes 2, two agents on this machine with one process each, as on two machines."""
    assert latest_checkpoint(str(two_nodes["out"] / "grpo")) is not None, said(two_nodes)
    one, two = final_weights(layouts / "one-grpo"), final_weights(two_nodes["out"] / "grpo")
    for name, value in one.items():
        # fp32 rounding: the chunked LM head sums its weight gradient chunk by chunk, in an order that
        # depends on which rows a rank holds (largest difference seen 1.1e-5, on the tied embedding)
        torch.testing.assert_close(two[name], value, rtol=1e-5, atol=3e-5)


def test_dynamic_sampling_left_the_ranks_uneven(layouts):
    lines = metrics(layouts / "ddp-dynamic")
    assert any(line["groups/trained"] % 2 for line in lines)  # an odd number of groups over two ranks
    assert any(line["groups/sampled"] % 2 for line in lines)  # a round of one prompt: one rank sampled none


def test_resume_under_two_ranks_is_exact(layouts, two_nodes):
    """The stopped runs of the layouts' job (2 of 3 steps, sampled completions, some of which call the
    calculator) resumed in a new job (the two-node one)."""
    for kind, _ in RESUMED:
        state = load_state(latest_checkpoint(str(layouts / f"stopped-{kind}")))
        assert state["step"] == 3, said(two_nodes)
        straight = final_weights(layouts / f"straight-{kind}")
        resumed = final_weights(layouts / f"stopped-{kind}")
        for name, value in straight.items():
            assert torch.equal(value, resumed[name]), (kind, name)
        straight_lines = metrics(layouts / f"straight-{kind}")
        assert straight_lines == _without_times(metrics(layouts / f"stopped-{kind}"), like=straight_lines)
        assert any(line["tools/calls_per_completion"] > 0 for line in straight_lines)  # sampled calls too
        assert len(state["rng"]) == 2  # each rank's own RNG states


def fsdp_job(checkpoint: str, base: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """examples/train_math.py under torchrun with --fsdp, two ranks: the result and its output_dir."""
    out = base / "run"
    flags = tiny_run(output_dir=out, fsdp=True, batch_size=8, eval_count=6, eval_every=1, save_every=None)
    result = torchrun(2, "examples/train_math.py", "--model", checkpoint, *flags)
    return result, out


def test_train_math_runs_unchanged_under_torchrun_with_fsdp(jobs, checkpoint):
    result, out = jobs["fsdp"]
    assert result.stdout.count("held-out greedy accuracy before GRPO") == 1  # rank 0 alone prints
    summary = json.load(open(out / "summary.json"))
    assert summary["steps"] == 2 and summary["processes"] == 2
    assert [line["step"] for line in metrics(out)] == [0, 1, 2]  # one line per step: rank 0 alone writes
    saved = latest_checkpoint(str(out))
    model, tokenizer = minigrpo.load_pretrained(saved)  # whole weights in Hugging Face layout
    start = minigrpo.load_pretrained(checkpoint)[0].state_dict()
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in start.items()}
    assert tokenizer is not None
    # The optimizer's state, gathered whole: two AdamW steps on every parameter, under its own name.
    optimizer = load_state(saved)["optimizer"]["state"]
    assert set(optimizer) == {f"model.{name}" for name in start}
    assert all(
        float(s["step"]) == 2 and s["exp_avg"].shape == start[n.removeprefix("model.")].shape
        for n, s in optimizer.items()
    )


def test_ranks_that_disagree_on_the_configuration_stop_with_one_line(two_nodes):
    """The last run of the two-node job: rank 0 and rank 1 each stop, and say why in one line."""
    for code, _, stderr in two_nodes["nodes"]:
        assert code != 0
        assert (
            "the ranks disagree on the run's configuration: "
            "rank 1 has configs.TrainConfig.learning_rate = 0.002, rank 0 has 0.001" in stderr
        ), stderr[-3000:]
        assert "Traceback" not in stderr.split("failed (exitcode")[0]  # before torchrun's own report


def refused_job(checkpoint: str, base: Path) -> subprocess.CompletedProcess:
    """examples/train_math.py under torchrun, two ranks, with a batch of 3 prompts."""
    return torchrun(
        2,
        "examples/train_math.py",
        "--model",
        checkpoint,
        "--template",
        "tiny",
        "--output_dir",
        str(base / "run"),
        "--num_generations",
        "2",
        "--batch_size",
        "6",
        check=False,
    )


def test_a_world_size_that_does_not_divide_the_prompts_is_refused(jobs):
    result = jobs["refused"]
    assert result.returncode != 0
    assert "3 prompts per step, which do not split evenly across 2 processes" in result.stderr
    assert "Traceback" not in result.stderr.split("failed (exitcode")[0]  # before torchrun's own report
    with pytest.raises(ValueError, match="multiple of 8"):
        TrainConfig(batch_size=36).check_against(GRPOConfig(num_generations=4), world_size=2)


def test_a_gpu_backend_without_gpus_is_refused(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="NCCL backend on GPUs, but torch sees no GPU"):
        distributed.setup("cuda")


def test_blocks_cover_the_items_in_order():
    for n in range(7):
        blocks = [list(range(n))[distributed.Dist(rank=r, world_size=3).block(n)] for r in range(3)]
        assert sum(blocks, []) == list(range(n)) and max(map(len, blocks)) - min(map(len, blocks)) <= 1


def _without_times(lines: list[dict], like: list[dict]) -> list[dict]:
    """The lines with the timing and throughput values of `like` (they differ from run to run), the
    seconds tool calls took among them."""
    volatile = ("time/", "sampling/", "training/")
    return [
        {k: (b[k] if k.startswith(volatile) or k.endswith("/seconds") else v) for k, v in a.items()}
        for a, b in zip(lines, like, strict=True)
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
