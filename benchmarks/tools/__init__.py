"""Measuring tools the benchmark scripts share, one job each:

- loop_floor.py: the closed-loop floor, probe servers that only spin and wait (what a lock-step
  loop reaches on this machine at all);
- bare_driver.py: the real simulator servers stepped by a loop that does nothing else;
- hot_path.py: py-spy samples of a running process sorted into kinds of work.

benchmarks/broker_overhead.py sets all three beside the broker.
"""
