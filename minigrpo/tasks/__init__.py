"""Start of the loop, task: problems with verifiable answers, and the prompts that ask them.

- `Problem` (problem.py): a question, its gold answer, and (for generated problems) a worked solution;
- `synthetic`: seeded generators with disjoint train / test splits (arithmetic, fractions,
  linear equations, Countdown);
- `datasets`: GSM8K- and MATH-format JSONL files, local or fetched from the Hugging Face Hub;
- `prompts`: templates for base models and for chat models (Qwen3's chat format).
`load_problems(name_or_path, split)` picks among them (`generate_problems` is the synthetic kinds'
own); `to_task` turns problems and a template into the trainer's `Task` (task.py: rows, reward
specs, the order prompts are drawn in, `PromptStream`). Nothing outside this folder imports from
inside it: only the names below.
It knows text, not tokens or the model.
"""

from .datasets import load_problems
from .problem import Problem, sources_of
from .prompts import INSTRUCTION, TEMPLATES, Template, template
from .synthetic import generate as generate_problems
from .task import PromptStream, Task, to_task

__all__ = [
    "INSTRUCTION",
    "TEMPLATES",
    "Problem",
    "PromptStream",
    "Task",
    "Template",
    "generate_problems",
    "load_problems",
    "sources_of",
    "template",
    "to_task",
]
