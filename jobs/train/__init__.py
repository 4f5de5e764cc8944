"""`fast train`: the local stack (simulators, learner, broker) as processes, one run, a report.

| module | job |
| --- | --- |
| `config.py` | `TrainConfig`: every setting and default of a run, validated once |
| `monitor.py` | broker status, metrics.jsonl tail, TensorBoard scalars, the progress bar |
| `evaluation.py` | the final policy against a random one on the held-out clips (eval.json) |
| `report.py` | report.md and its plots from a run directory |
| `orchestrate.py` | `train(cfg)`: the order of it all, and the exit code |
"""
