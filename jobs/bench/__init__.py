"""Benchmarks as commands: `fast bench sampling`, `fast bench train` (docs/bench.md)."""
