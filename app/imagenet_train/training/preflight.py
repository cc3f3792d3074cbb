"""The planner's verdict on a launch before it starts, shared by the trainer, the Lightning module and Ray."""

from __future__ import annotations

import logging

from imagenet_train.config import Config
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.planning import plan

log = logging.getLogger(__name__)


def preflight_check(
    cfg: Config, train_sizes: list[int] | None, world: int, warn: bool = False
) -> plan.Assessment | None:
    """The planner's verdict on `world` ranks training `cfg`; raises if they would hang (unless --force), and
    with `warn` logs any other verdict but OK (every rank reaches the same verdict from the same inputs)."""
    if train_sizes is None:
        return None
    setup = plan.Setup.of(cfg.data, cfg.run.seed, train_sizes, gpus_per_node=world)
    assessment = plan.assess(setup)
    if assessment.hangs and not cfg.run.force:
        raise ImagenetTrainError(f"pre-flight: {assessment.verdict}; {assessment.fix} (--force runs anyway)")
    if warn and assessment.level is not plan.Verdict.OK:
        log.warning("pre-flight: %s; suggested fix: %s", assessment.verdict, assessment.fix)
    return assessment
