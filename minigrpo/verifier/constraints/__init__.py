"""Stage 2 of the loop, verify: the constraints wing, registered as the rewards "json", "length" and
"sql".

In: completions and, per row or as options, what each checks against. Out: one float per completion:
`json_reward(s)` (JSON that parses and fits a JSON-Schema subset: json_schema.py), `length_reward(s)` (a
length within a soft band: length.py), `sql_reward(s)` (a query that returns the gold query's rows on a
read-only SQLite database: sql.py). constraint_inputs.py holds what they read alike (a completion's
answer text, values shown in errors, numbers), which rewards.py's checks of the options use too. It
knows strings, not the trainer.
"""

from .constraint_inputs import is_integer, shown
from .json_schema import json_reward, json_rewards
from .length import length_reward, length_rewards
from .sql import sql_reward, sql_rewards

__all__ = [
    "is_integer",
    "json_reward",
    "json_rewards",
    "length_reward",
    "length_rewards",
    "shown",
    "sql_reward",
    "sql_rewards",
]
