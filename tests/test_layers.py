"""The import layers of docs/architecture.md, checked on the source and in a fresh interpreter.

    jobs/                                   top: the `fast` command and its jobs
    sim_server/  broker/  learner/  gateway/   middle: the services
    fast/                                   bottom: protocol stubs and shared helpers

A module may import its own package and the layers below it. A service reaches another
service only through the modules that service exports for it (EXPORTS), and only where
the design has one call the other (MAY_USE); what those modules import in turn is held to
the same rule, so an export cannot drag in its service's internals. The lab (benchmarks/, tests/)
may import any layer; no layer imports the lab or launches its modules.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOTTOM, SERVICES, TOP = "fast", ("sim_server", "broker", "learner", "gateway"), "jobs"
PACKAGES = (BOTTOM, *SERVICES, TOP)

# What a service offers the other services: its client and the wire format of its messages.
# learner.policy is the policy network, which the broker runs for inference with the weights
# the learner ships.
EXPORTS = {
    "sim_server": {"sim_server", "sim_server.client"},
    "learner": {"learner", "learner.client", "learner.wire", "learner.policy"},
    "broker": {"broker", "broker.client"},
}
# Which service may call which (docs/architecture.md: the broker drives simulators and feeds the learner;
# the gateway talks to the broker and the learner through the protos only).
MAY_USE = {"broker": {"sim_server", "learner"}}

# `python -m fast` must run the command: the entry point names the top layer and is never imported.
ENTRY_POINTS = {"fast.__main__"}

# The lab (docs/architecture.md): it may import the product, never the other way round.
LAB = ("benchmarks", "tests")
_LAB_MODULE = re.compile(r"^(benchmarks|tests)(\.\w+)+$")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if (ROOT / "fast" / "v1") in path.parents:
                continue  # generated stubs import only each other
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    """Project modules `name` imports (any depth in the file), as dotted names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {m for m in out if m.split(".")[0] in PACKAGES}


SOURCES = _sources()
GRAPH = {name: {m for m in _imports(name, path) if m in SOURCES} for name, path in SOURCES.items()}


def _with_parents(module: str) -> set[str]:
    """Importing a.b.c runs a/__init__ and a/b/__init__ first."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & SOURCES.keys()


def _reach(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        for dep in GRAPH.get(module, ()):
            for m in _with_parents(dep):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
    return seen


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return 0 if top == BOTTOM else 2 if top == TOP else 1


def _allowed(importer: str, imported: str) -> bool:
    mine, theirs = importer.split(".")[0], imported.split(".")[0]
    if mine == theirs or _layer(imported) < _layer(importer) or _layer(importer) == 2:
        return True
    if _layer(importer) == 1 and _layer(imported) == 1:
        return theirs in MAY_USE.get(mine, set()) and imported in EXPORTS.get(theirs, set())
    return False


def test_every_package_is_found() -> None:
    assert {m.split(".")[0] for m in SOURCES} >= {BOTTOM, *SERVICES[:3], TOP}
    assert len(GRAPH) > 50


def test_no_module_imports_a_higher_layer_or_another_services_internals() -> None:
    bad = []
    for name, deps in GRAPH.items():
        if name in ENTRY_POINTS:
            continue
        bad += [f"{name} imports {dep}" for dep in sorted(deps) if not _allowed(name, dep)]
    assert not bad, "layer violations (docs/architecture.md):\n" + "\n".join(bad)


@pytest.mark.parametrize("service", SERVICES)
def test_what_a_service_reaches_of_another_is_only_its_exports(service: str) -> None:
    """Transitively: an export that imports its own service's internals leaks them."""
    bad = []
    for name in (m for m in SOURCES if m.split(".")[0] == service):
        for reached in sorted(_reach(name)):
            other = reached.split(".")[0]
            if _layer(reached) == 1 and other != service and reached not in EXPORTS.get(other, set()):
                bad.append(f"{name} reaches {reached}")
    assert not bad, "\n".join(bad)


def _lab_uses(path: Path) -> list[str]:
    """What a product module takes from the lab: imports of it, and module names of it in strings
    (a `python -m benchmarks.x` it would launch)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] in LAB]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in LAB:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _LAB_MODULE.match(node.value):
            found.append(repr(node.value))
    return found


def test_no_product_module_uses_the_lab() -> None:
    """benchmarks/ and tests/ measure and check the product; it runs without them (the wheel leaves them out)."""
    bad = [f"{name} uses {used}" for name, path in SOURCES.items() for used in _lab_uses(path)]
    assert not bad, "the product reaches into the lab:\n" + "\n".join(bad)


def test_the_lab_check_catches_an_import_and_a_launch(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import benchmarks.tools.hot_path\nfrom tests import conftest\n"
        "cmd = ['python', '-m', 'benchmarks.tools.loop_floor']\nfrom benchmarks_of_a_user import x\n"
    )
    assert _lab_uses(source) == ["benchmarks.tools.hot_path", "tests", "'benchmarks.tools.loop_floor'"]


def test_the_check_itself_catches_an_upward_and_a_sideways_import() -> None:
    assert not _allowed("fast.rpc", "jobs.cli")
    assert not _allowed("sim_server.server", "broker.run")
    assert not _allowed("broker.run", "learner.core")
    assert _allowed("broker.run", "learner.client")
    assert not _allowed("gateway.app", "broker.client")  # the gateway speaks protos only
    assert _allowed("jobs.train.orchestrate", "broker.dealer")


def test_importing_the_broker_loads_no_optimiser() -> None:
    """The broker needs the policy network and the batch's wire format, not SMPO or the optimiser."""
    code = (
        "import sys, broker.run, broker.server\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('learner', 'jobs', 'gateway'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert set(loaded) <= EXPORTS["learner"], f"broker loads {sorted(set(loaded) - EXPORTS['learner'])}"


def test_importing_the_broker_loads_no_torch() -> None:
    """torch costs a process 2.5 CPU seconds to import; the broker reads its weights with fast/weights.py and
    runs a Box policy in numpy (broker/policy_runner.py; tests/test_policy_runner.py runs one without torch)."""
    code = "import sys, broker.run, broker.server\nprint('torch' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert loaded == ["False"], "importing broker.run and broker.server loads torch"
