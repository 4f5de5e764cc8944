"""The top layer: the `fast` command and the jobs it runs (train, bench, compare, play).

Jobs start services as processes and may import any service's modules; nothing below
imports them (docs/architecture.md).
"""
