"""GET and PATCH /v1/config: the settings a run can change while it runs.

alpha, t_max and samples_per_iteration go to the broker (from its next iteration), learning_rate
and ent_coef to the learner (from its next update); metrics.jsonl records each change with the
iteration it took effect (`settings_changed`).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from gateway.convert import to_plain
from gateway.deps import Authorized, UpstreamsDep
from gateway.models import (
    AUTH_RESPONSES,
    BrokerSettingsAnswer,
    ConfigPatch,
    ConfigPatchAnswer,
    ConfigView,
    LearnerSettingsAnswer,
)
from gateway.upstream import UpstreamError

router = APIRouter(prefix="/v1", tags=["config"])


@router.get("/config", response_model=ConfigView)
async def get_config(upstreams: UpstreamsDep) -> ConfigView:
    run, learner = await asyncio.gather(upstreams.run_status(), upstreams.learner_status())
    run_plain, learner_plain = to_plain(run), to_plain(learner)
    return ConfigView.model_validate(
        {
            "settings": run_plain["settings"],
            "pending_settings": run_plain["pending_settings"],
            "hyperparameters": learner_plain["hyperparameters"],
        }
    )


@router.patch(
    "/config",
    response_model=ConfigPatchAnswer,
    dependencies=[Authorized],
    responses=AUTH_RESPONSES,
)
async def patch_config(patch: ConfigPatch, upstreams: UpstreamsDep) -> ConfigPatchAnswer:
    """Both halves are checked here first (422 names the field and its range), so a refusal by a
    service means it is unavailable; the answer says which half was applied before it."""
    answer = ConfigPatchAnswer(broker=None, learner=None)
    if broker_values := patch.broker_part():
        reply = await upstreams.update_settings(**broker_values)
        answer.broker = BrokerSettingsAnswer.model_validate(to_plain(reply))
    if learner_values := patch.learner_part():
        try:
            reply = await upstreams.update_hyperparameters(**learner_values)
        except UpstreamError as error:
            if answer.broker is not None:  # say that the broker's half did take
                applied = ", ".join(broker_values)
                raise UpstreamError(
                    error.service,
                    error.address,
                    error.code,
                    f"{error.details} (the broker's {applied} were applied already)",
                    error.deadline_s,
                ) from None
            raise
        answer.learner = LearnerSettingsAnswer.model_validate(to_plain(reply))
    return answer
