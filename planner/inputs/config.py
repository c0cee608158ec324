"""Training configuration: global batch, micro-batch candidates, optimizer, schedule."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.schema import load_document, validate
from edgepipe.planner.schedule import ScheduleName

KIND = "edgepipe.training_config"

#: optimizer state bytes per parameter byte (reference/asteroid.md §3.1, [inferred]):
#: SGD keeps none, SGD+momentum one buffer, Adam two moments.
OptimizerName = Literal["sgd", "momentum", "adam"]
OPTIMIZER_STATE: dict[OptimizerName, int] = {"sgd": 0, "momentum": 1, "adam": 2}

#: largest micro-batch size tried when the config names no candidates
DEFAULT_MAX_MICRO_BATCH = 64

#: bounds that keep the cost model's tables and schedules small (also in the schemas)
MAX_MICRO_BATCH = 1024
MAX_MICRO_BATCHES = 4096

#: optimizer hyper-parameters when the config names none (torch's own defaults except
#: the learning rate and momentum, which torch leaves to the user)
DEFAULT_LEARNING_RATE = 0.01
DEFAULT_MOMENTUM = 0.9
DEFAULT_ADAM_BETAS = (0.9, 0.999)
DEFAULT_ADAM_EPS = 1e-8
DEFAULT_DATA_SEED = 0

#: replicas of every stage's weights and optimizer state are refreshed every this many
#: committed steps (docs/fault-tolerance.md); 0 turns replication off
MAX_REPLICATION_INTERVAL = 1_000_000
#: the default interval: the smallest that hides a point's transfer, resolved when the
#: plan is made (:func:`planner.plan.make_plan`; docs/decisions.md)
AUTO = "auto"

#: how the 1F1B warm-up depth K_p is chosen (:meth:`TrainingConfig.warmup_depth`)
WarmupName = Literal["asteroid", "classic"]

SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)
WARMUPS: tuple[WarmupName, ...] = get_args(WarmupName)


@dataclass(frozen=True)
class TrainingConfig:
    """What to train: ``global_batch`` samples per optimizer step, split into
    ``global_batch / B`` micro-batches of ``B`` samples, ``B`` from the candidates."""

    global_batch: int
    micro_batch_candidates: tuple[int, ...] | None = None
    optimizer: OptimizerName = "momentum"
    schedule: ScheduleName = "1f1b"
    warmup: WarmupName = "asteroid"
    max_stages: int | None = None
    learning_rate: float | None = None
    momentum: float | None = None
    adam_betas: tuple[float, float] | None = None
    adam_eps: float | None = None
    data_seed: int | None = None
    replication_interval: int | str = AUTO
    #: a plan's config: its interval was resolved from ``auto`` (:func:`planner.plan.make_plan`),
    #: so a re-plan resolves it again for the new plan (planner/replan/incremental.py);
    #: False: a number the user chose, kept as given
    replication_interval_auto: bool = False

    def __post_init__(self) -> None:
        def bad(field: str, problem: str) -> InputError:
            return InputError("training config", f"$.{field}", problem)

        def whole(field: str, value: object) -> None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(field, f"must be a whole number, got {str(value)[:40]!r}")

        whole("global_batch", self.global_batch)
        for b in self.micro_batch_candidates or ():
            whole("micro_batch_candidates", b)
        if self.max_stages is not None:
            whole("max_stages", self.max_stages)
        if not 1 <= self.global_batch <= MAX_MICRO_BATCH * MAX_MICRO_BATCHES:
            raise bad(
                "global_batch",
                f"must be 1..{MAX_MICRO_BATCH * MAX_MICRO_BATCHES}, got {self.global_batch}",
            )
        for b in self.micro_batch_candidates or ():
            if not 1 <= b <= MAX_MICRO_BATCH:
                raise bad("micro_batch_candidates", f"{b} is not in 1..{MAX_MICRO_BATCH}")
        if not self.micro_batch_sizes():
            raise bad(
                "micro_batch_candidates",
                f"no candidate divides global_batch {self.global_batch} into at most "
                f"{MAX_MICRO_BATCHES} micro-batches; add a (larger) divisor",
            )
        if self.optimizer not in OPTIMIZER_STATE:
            raise bad("optimizer", f"{self.optimizer!r} is not one of {sorted(OPTIMIZER_STATE)}")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", f"{self.schedule!r} is not one of {list(SCHEDULES)}")
        if self.warmup not in WARMUPS:
            raise bad("warmup", f"{self.warmup!r} is not one of {list(WARMUPS)}")
        if self.max_stages is not None and self.max_stages < 1:
            raise bad("max_stages", f"must be at least 1, got {self.max_stages}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise bad("learning_rate", f"must be positive, got {self.learning_rate}")
        if self.momentum is not None and not 0 <= self.momentum < 1:
            raise bad("momentum", f"must be in [0, 1), got {self.momentum}")
        if self.adam_betas is not None and not all(0 <= b < 1 for b in self.adam_betas):
            raise bad("adam_betas", f"both must be in [0, 1), got {list(self.adam_betas)}")
        if self.adam_eps is not None and not self.adam_eps > 0:
            raise bad("adam_eps", f"must be positive, got {self.adam_eps}")
        if self.data_seed is not None and self.data_seed < 0:
            raise bad("data_seed", f"must be >= 0, got {self.data_seed}")
        k = self.replication_interval
        if k != AUTO and (not isinstance(k, int) or isinstance(k, bool)
                          or not 0 <= k <= MAX_REPLICATION_INTERVAL):
            raise bad(
                "replication_interval",
                f"must be {AUTO!r} or 0 (off) .. {MAX_REPLICATION_INTERVAL} steps, got "
                f"{str(k)[:40]!r}",
            )

    def interval_choice(self) -> int | str:
        """The interval the user chose: ``auto`` where a plan's interval was resolved
        from it, else the interval itself."""
        return AUTO if self.replication_interval_auto else self.replication_interval

    @property
    def replicated(self) -> bool:
        """Whether ring replicas are kept: any interval but 0 (``auto`` resolves to at
        least 1)."""
        return self.replication_interval != 0

    def optimizer_settings(self) -> dict[str, Any]:
        """The optimizer's keyword arguments with defaults filled in: ``sgd``: ``lr``;
        ``momentum``: ``lr``, ``momentum``; ``adam``: ``lr``, ``betas``, ``eps``."""
        lr = DEFAULT_LEARNING_RATE if self.learning_rate is None else self.learning_rate
        if self.optimizer == "sgd":
            return {"lr": lr}
        if self.optimizer == "momentum":
            momentum = DEFAULT_MOMENTUM if self.momentum is None else self.momentum
            return {"lr": lr, "momentum": momentum}
        betas = DEFAULT_ADAM_BETAS if self.adam_betas is None else self.adam_betas
        eps = DEFAULT_ADAM_EPS if self.adam_eps is None else self.adam_eps
        return {"lr": lr, "betas": tuple(betas), "eps": eps}

    @property
    def seed(self) -> int:
        """Seed of the data order (docs/executor.md, sampler)."""
        return DEFAULT_DATA_SEED if self.data_seed is None else self.data_seed

    def micro_batch_sizes(self) -> list[int]:
        """Candidate micro-batch sizes that divide the global batch into at most
        ``MAX_MICRO_BATCHES`` micro-batches, ascending."""
        cands: Iterable[int]
        if self.micro_batch_candidates is None:
            cands = range(1, min(self.global_batch, DEFAULT_MAX_MICRO_BATCH) + 1)
        else:
            cands = sorted(set(self.micro_batch_candidates))
        return [
            b
            for b in cands
            if self.global_batch % b == 0 and self.global_batch // b <= MAX_MICRO_BATCHES
        ]

    def warmup_depth(self, stage: int, num_stages: int, num_micro_batches: int) -> int:
        """In-flight micro-batches K_p of 0-based ``stage`` (reference/asteroid.md §3.1, §5).

        1F1B: Asteroid's ``2(P-p)-1`` (links count as pipeline steps) or classic ``P-p``,
        clamped to the micro-batch count M. GPipe keeps all M in flight.
        """
        if self.schedule == "gpipe":
            return num_micro_batches
        depth = 2 * (num_stages - stage) - 1 if self.warmup == "asteroid" else num_stages - stage
        return min(depth, num_micro_batches)

    @property
    def optimizer_state_factor(self) -> int:
        return OPTIMIZER_STATE[self.optimizer]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": 1,
            "kind": KIND,
            "global_batch": self.global_batch,
            "optimizer": self.optimizer,
            "schedule": self.schedule,
            "warmup": self.warmup,
        }
        if self.micro_batch_candidates is not None:
            out["micro_batch_candidates"] = list(self.micro_batch_candidates)
        if self.max_stages is not None:
            out["max_stages"] = self.max_stages
        # optimizer fields only when set, so configs (and plan ids) without them are unchanged
        for key in ("learning_rate", "momentum", "adam_eps", "data_seed"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.adam_betas is not None:
            out["adam_betas"] = list(self.adam_betas)
        # always written: a config without it means auto, a plan's without it 1 (the
        # plan's id leaves out an interval of 1: planner.plan.content_id)
        out["replication_interval"] = self.replication_interval
        if self.replication_interval_auto:  # only when set: other plans' ids are unchanged
            out["replication_interval_auto"] = True
        return out

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<training config>", *,
                  interval: int | str = AUTO) -> TrainingConfig:
        """The config of ``doc``; ``interval``: the replication interval when ``doc``
        names none (a plan's config, written before the key existed, passes 1)."""
        validate(doc, KIND, source)
        cands = doc.get("micro_batch_candidates")
        try:
            return cls(
                global_batch=doc["global_batch"],
                micro_batch_candidates=tuple(cands) if cands is not None else None,
                optimizer=doc.get("optimizer", "momentum"),
                schedule=doc.get("schedule", "1f1b"),
                warmup=doc.get("warmup", "asteroid"),
                max_stages=doc.get("max_stages"),
                learning_rate=doc.get("learning_rate"),
                momentum=doc.get("momentum"),
                adam_betas=tuple(doc["adam_betas"]) if "adam_betas" in doc else None,
                adam_eps=doc.get("adam_eps"),
                data_seed=doc.get("data_seed"),
                replication_interval=doc.get("replication_interval", interval),
                replication_interval_auto=doc.get("replication_interval_auto", False),
            )
        except InputError as exc:
            raise InputError(source, exc.path, exc.problem) from None

    @classmethod
    def load(cls, path: str | Path) -> TrainingConfig:
        return cls.from_dict(load_document(path, KIND), str(path))
