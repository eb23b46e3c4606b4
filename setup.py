from setuptools import find_packages, setup

setup(
    name="minigrpo",
    version="0.1.0",
    description=(
        "A from-scratch, pure-PyTorch GRPO trainer for reinforcement learning from verifiable rewards"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["minigrpo", "minigrpo.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.5",  # >= 2.5 for scaled_dot_product_attention(enable_gqa=...)
        "safetensors",
        "tokenizers",
        "huggingface_hub",
        "sympy",
        "numpy",
        # a checkpoint's own chat template (Jinja), rendered as transformers renders it; torch depends
        # on jinja2 too, so it is installed wherever torch is; before 3.1.6 a template escapes its sandbox
        "jinja2>=3.1.6",
    ],
    extras_require={
        # transformers and peft are test oracles only: nothing under minigrpo/ imports them (peft reads and
        # writes the LoRA adapters' files the tests compare with minigrpo's); trl is there for the
        # smoke runs of the benchmarks that measure against it (tests/test_benchmarks.py); matplotlib
        # and tensorboard for the plotting and --report_to tests (wandb's test skips without it).
        "test": [
            "pytest",
            "hypothesis",
            "transformers>=4.51",
            "peft>=0.13",
            "trl==1.16.0",  # the objectives' equality tests run TRL 1.16's own loss code
            "matplotlib",
            "tensorboard",
            "pyyaml",
        ],
        "plot": ["matplotlib"],
        "tensorboard": ["tensorboard"],  # --report_to tensorboard (torch.utils.tensorboard writes the events)
        "wandb": ["wandb"],  # --report_to wandb (offline runs; `wandb sync` uploads them)
        # what benchmarks/ measures against: transformers' generate and forward, TRL's GRPOTrainer,
        # Math-Verify's grader
        "bench": ["transformers>=4.51", "trl>=1.0", "math-verify[antlr4_13_2]"],
        # the formatter and linter CI checks with (ruff.toml); pinned, as another version formats differently
        "dev": ["ruff==0.17.6"],
    },
)
