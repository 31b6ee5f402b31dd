"""A job's memory budgets: device and host each a number of GiB or a range {min, max}, and
for a ranged budget the point the service chose; disk (spilled training state) a number
(JobSpec.budget). Every reader of a budget reads one
point, `device_gib` / `host_gib`; planners plan a copy fixed at a point (JobSpec.at_budget).
Pydantic only, as all of contracts/."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from wstrain.contracts.calibration import GIB
from wstrain.contracts.spec_fields import MAX_BUDGET_GIB, StrictModel


class GibRange(StrictModel):
    """A budget range in GiB: the job may run at any point from min to max (the service
    chooses where; more memory buys speed, less lets it start sooner or share a GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: float = Field(gt=0, le=MAX_BUDGET_GIB, description="the least GiB the job runs at")
    max: float = Field(gt=0, le=MAX_BUDGET_GIB, description="the most GiB it may be given")


class ChosenBudget(StrictModel):
    """The point of a ranged budget the job is planned and runs at, in GiB."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_gib: float = Field(gt=0, le=MAX_BUDGET_GIB)
    host_gib: float = Field(gt=0, le=MAX_BUDGET_GIB)


def _number_or_range(value: Any) -> str:
    return "range" if isinstance(value, dict | GibRange) else "number"


# One GiB figure, or a range: tagged by the value's shape, so an error names only the form
# that was sent (loc ["budget", "device_gib", "range", "min"]), not both forms' errors.
GibOrRange = Annotated[
    Annotated[float, Field(gt=0, le=MAX_BUDGET_GIB), Tag("number")]
    | Annotated[GibRange, Tag("range")],
    Discriminator(_number_or_range),
]


def _span(value: float | GibRange) -> tuple[float, float]:
    return (value.min, value.max) if isinstance(value, GibRange) else (value, value)


class Budget(StrictModel):
    """Hard device- and host-memory budgets, each a number of GiB or a range {min, max}.

    Every reader of a budget reads one point: `device_gib`/`host_gib` (and the `_bytes`
    beside them) are a fixed budget's numbers, and a ranged budget's `chosen` point, or its
    max before the service chose one. The JSON keeps what the user sent (`device_gib`,
    `host_gib`) plus, for a ranged budget, the `chosen` point the service set."""

    # the fields hold what was sent under the names the user writes; the names below them
    # (device/host) are internal, so `budget.device_gib` can be the chosen number
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)

    device: GibOrRange = Field(
        alias="device_gib",
        description="hard device-memory budget in GiB (per GPU), or a range {min, max} the "
        "service chooses a point of",
    )
    host: GibOrRange = Field(
        alias="host_gib",
        description="hard host-memory budget in GiB, or a range {min, max} the service "
        "chooses a point of",
    )
    disk_gib: float = Field(
        default=0.0,
        ge=0,
        le=MAX_BUDGET_GIB,
        exclude_if=lambda v: v == 0,
        description="hard disk budget in GiB for training state spilled past the host budget "
        "(the agent's spill directory, a local NVMe path): the planner puts the coldest state "
        "there first, AdamW moments from the last layer down; 0: none, all state in host "
        "memory",
    )
    chosen: ChosenBudget | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="set by the service for a ranged budget: the point in GiB the job is "
        "planned and runs at (absent: not chosen yet, read as the ranges' max); a value "
        "sent with a submission is replaced",
    )

    @field_validator("device", "host")
    @classmethod
    def _range_ordered(cls, value: float | GibRange, info: ValidationInfo) -> float | GibRange:
        if isinstance(value, GibRange) and value.min > value.max:
            field = "device_gib" if info.field_name == "device" else "host_gib"
            raise ValueError(
                f"budget.{field}: min={value.min:g} is above max={value.max:g}; give "
                f"{{min: {value.max:g}, max: {value.min:g}}}, or one number"
            )
        return value

    @model_validator(mode="after")
    def _chosen_in_range(self) -> Budget:
        if self.chosen is None:
            return self
        for name, (low, high), at in (
            ("device_gib", self.device_range_gib, self.chosen.device_gib),
            ("host_gib", self.host_range_gib, self.chosen.host_gib),
        ):
            if not low <= at <= high:
                raise ValueError(
                    f"budget.chosen.{name}={at:g} is outside budget.{name} "
                    f"({low:g}..{high:g}); leave budget.chosen out (the service sets it)"
                )
        return self

    @property
    def ranged(self) -> bool:
        """Whether either budget is a range."""
        return isinstance(self.device, GibRange) or isinstance(self.host, GibRange)

    @property
    def device_range_gib(self) -> tuple[float, float]:
        """(min, max) of the device budget; a fixed number x gives (x, x)."""
        return _span(self.device)

    @property
    def host_range_gib(self) -> tuple[float, float]:
        """(min, max) of the host budget; a fixed number x gives (x, x)."""
        return _span(self.host)

    @property
    def device_gib(self) -> float:
        """The device budget the job is planned at: the number, or the chosen point."""
        if isinstance(self.device, float | int):
            return float(self.device)
        return self.chosen.device_gib if self.chosen is not None else self.device.max

    @property
    def host_gib(self) -> float:
        """The host budget the job is planned at: the number, or the chosen point."""
        if isinstance(self.host, float | int):
            return float(self.host)
        return self.chosen.host_gib if self.chosen is not None else self.host.max

    @property
    def device_bytes(self) -> int:
        return int(self.device_gib * GIB)

    @property
    def host_bytes(self) -> int:
        return int(self.host_gib * GIB)

    @property
    def disk_bytes(self) -> int:
        return int(self.disk_gib * GIB)

    def at(self, device_gib: float, host_gib: float) -> Budget:
        """A fixed budget at this point of the ranges; ValueError outside them."""
        for name, (low, high), value in (
            ("device_gib", self.device_range_gib, device_gib),
            ("host_gib", self.host_range_gib, host_gib),
        ):
            if not low <= value <= high:
                raise ValueError(
                    f"budget.{name}={value:g} is outside the spec's range {low:g}..{high:g}"
                )
        return Budget(device_gib=device_gib, host_gib=host_gib, disk_gib=self.disk_gib)
