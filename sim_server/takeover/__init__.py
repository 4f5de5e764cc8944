"""The built-in `takeover` workload: a numpy driving simulator replaying scripted takeover clips."""

from sim_server.takeover.catalog import Catalog, build_catalog
from sim_server.takeover.env import TakeoverEnv

__all__ = ["Catalog", "TakeoverEnv", "build_catalog"]
