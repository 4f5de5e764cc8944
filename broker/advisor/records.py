"""A model's inputs as plain JSON and back: a `Workload` and a `Horizon` written beside what was
measured on them, so that a later version of the model can be run on the very inputs a benchmark
probed and compared with the very figures it measured (benchmarks/advisor_ranking.py `--repredict`),
without measuring again.

Every field is written; reading needs every field the record has and fills none it lacks but those
added to the dataclasses since (their defaults), so a record stays readable as the model grows.
"""

from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np

from broker.advisor.lengths import EpisodeLengths
from broker.advisor.model import Catalog, Horizon, SimulatorCosts, Workload

_STRUCTURED = ("lengths", "costs", "catalog")  # the Workload fields written as records of their own


def workload_record(workload: Workload) -> dict:
    costs = workload.costs if isinstance(workload.costs, tuple) else (workload.costs,)
    scalars = {f.name: getattr(workload, f.name) for f in fields(workload) if f.name not in _STRUCTURED}
    catalog = workload.catalog
    return {
        **scalars,
        "costs": [asdict(c) for c in costs],
        "lengths": {
            "values": workload.lengths.values.tolist(),
            "probabilities": workload.lengths.probabilities.tolist(),
        },
        "catalog": None
        if catalog is None
        else {
            "clip_map_ids": np.asarray(catalog.clip_map_ids).tolist(),
            "holdout_every": catalog.holdout_every,
            "locality_max_repeat": catalog.locality_max_repeat,
        },
    }


def workload_from_record(record: dict) -> Workload:
    """The `Workload` a `workload_record` wrote; ValueError naming what is missing or wrong."""
    try:
        costs = tuple(SimulatorCosts(**c) for c in record["costs"])
        lengths = EpisodeLengths(
            np.asarray(record["lengths"]["values"], dtype=np.int64),
            np.asarray(record["lengths"]["probabilities"], dtype=np.float64),
        )
        catalog = record.get("catalog")
        if catalog is not None:
            catalog = Catalog(
                np.asarray(catalog["clip_map_ids"], dtype=np.int64),
                holdout_every=int(catalog["holdout_every"]),
                locality_max_repeat=int(catalog["locality_max_repeat"]),
            )
        scalars = {f.name: record[f.name] for f in fields(Workload) if f.name not in _STRUCTURED and f.name in record}
        # Inside the try: a field of the wrong type (a string for seconds) fails Workload's own checks.
        return Workload(lengths, costs if len(costs) > 1 else costs[0], catalog=catalog, **scalars)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a workload record: {type(exc).__name__} {str(exc)[:80]}") from None


def horizon_record(horizon: Horizon) -> dict:
    return asdict(horizon)


def horizon_from_record(record: dict) -> Horizon:
    return Horizon(**{f.name: record[f.name] for f in fields(Horizon) if f.name in record})


def inputs_record(workload: Workload, horizon: Horizon, *, seed: int, seeds: int) -> dict:
    """Everything one `predict` call takes but the mode: `model_inputs` in `fast advise --json` and ranking.json."""
    return {"workload": workload_record(workload), "horizon": horizon_record(horizon), "seed": seed, "seeds": seeds}


def inputs_from_record(record: dict) -> tuple[Workload, Horizon, int, int]:
    """(workload, horizon, seed, seeds) of an `inputs_record`; seeds 1 where it has none (written before
    the model played several)."""
    try:
        horizon, seed, seeds = horizon_from_record(record["horizon"]), int(record["seed"]), int(record.get("seeds", 1))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a model-inputs record: {type(exc).__name__} {str(exc)[:80]}") from None
    return workload_from_record(record["workload"]), horizon, seed, seeds
