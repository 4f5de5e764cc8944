"""`fast advise`: measure the simulators, predict every sampling mode, validate the best (docs/advisor.md)."""
