"""GET and PATCH /v1/config: the settings a run can change while it runs.

alpha, t_max, samples_per_iteration and mode go to every broker (from its next iteration), learning_rate
and ent_coef to the learner, rank 0 of a group (from its next update); metrics.jsonl records each
change with the iteration it took effect (`settings_changed`). GET shows broker 0's settings and
rank 0's hyper-parameters (GET /v1/status shows every broker's).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from fast.v1 import broker_pb2
from gateway.convert import to_plain
from gateway.deps import Authorized, UpstreamsDep
from gateway.errors import FanOutError
from gateway.fanout import to_every_broker
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
    """Both halves are checked here first (422 names the field and its range), and every service that
    is to take a part is asked its status before anything is sent (one that does not answer: 503,
    nothing applied). The brokers' part goes to every broker at once, the learner's to rank 0 (whose
    values every rank trains with); a failure then says which part, and which brokers, took it."""
    answer = ConfigPatchAnswer(broker=None, learner=None)
    broker_values, learner_values = patch.broker_part(), patch.learner_part()
    if learner_values:
        await upstreams.learner_status()  # rank 0 is down: 503 naming it, before any broker takes its part
    if broker_values:
        untouched = f"the learner's {', '.join(learner_values)} were not sent" if learner_values else ""
        replies, answer.brokers = await to_every_broker(
            upstreams,
            "UpdateSettings",
            broker_pb2.UpdateSettingsRequest(**broker_values),
            lambda reply: {"effective_iteration": reply.effective_iteration},
            note_if_failed=untouched,
        )
        answer.broker = BrokerSettingsAnswer.model_validate(to_plain(replies[0]))
    if learner_values:
        try:
            reply = await upstreams.update_hyperparameters(**learner_values)
        except UpstreamError as error:
            if answer.broker is not None:  # say that the brokers' half did take, on every broker
                note = f"the brokers' {', '.join(broker_values)} were applied; send the learner's part again alone"
                raise FanOutError(error, answer.brokers, note) from None
            raise
        answer.learner = LearnerSettingsAnswer.model_validate(to_plain(reply))
    return answer
