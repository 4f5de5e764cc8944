"""FAST: aligned sampling and training for parallel on-policy RL with slow-to-reset simulators."""

__version__ = "0.1.0"
API_VERSION = "fast.v1"
