"""The lab: scripts that measure the product side by side, and the tools they share (benchmarks/tools/).

Not part of the product: no package of it imports the lab (tests/test_layers.py checks), and the
wheel leaves it out (pyproject.toml). Run a script from the repository root, either way:

    python -m benchmarks.<script> [flags]
    python benchmarks/<script>.py [flags]

Results that are committed live in benchmarks/results/ (README.md there says which command made each).
"""
