"""`fast compare`: two groups of runs' final policies on the same held-out clips, per closed-loop
metric the difference of means with its delete-one jackknife 95% CI over clips (docs/compare.md).

| module | job |
| --- | --- |
| `jackknife.py` | the statistics: paired difference, jackknife CI, Student's t quantile (pure numpy) |
| `run.py` | `compare(...)`: check the run directories, start simulators, evaluate, write compare.json/.md |
| `cli.py` | `compare_command`, the typer function behind `fast compare RUN_A RUN_B` |
"""
