"""Settings every wstrain process that talks to Redis shares (env prefix WSTRAIN_); each
process's own settings class extends it and is built once in its main().

    WSTRAIN_REDIS_URL (or REDIS_URL)  redis://127.0.0.1:6379/0
    WSTRAIN_KEY_PREFIX                wstrain (namespace of every Redis key)
    WSTRAIN_STATE_DIR                 wstrain-state (job dirs: specs, plans, checkpoints, logs);
                                      `wstrain serve --state-dir X` sets it for the API, the
                                      agent and its workers alike
    WSTRAIN_DATA_ROOTS                JSON list of directories jobs may read data and models
                                      from (["."]); the state dir is never readable by jobs,
                                      and a root inside it is refused at start
    WSTRAIN_FAIRSHARE_HALF_LIFE_S     604800 (7 days): how fast past usage stops counting
    WSTRAIN_OWNER_SHARES              JSON {owner: share}; an owner not named has 1
    WSTRAIN_OWNER_QUOTAS              JSON {owner: {"max_jobs", "max_device_gib",
                                      "max_host_gib"}}; an owner not named has none
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wstrain.contracts.access import DataAccess
from wstrain.policy import (
    DEFAULT_GROW_AFTER_S,
    DEFAULT_GROW_MIN_GAIN,
    DEFAULT_HALF_LIFE_S,
    PolicyConfig,
    Quota,
)


class OwnerQuota(BaseModel):
    """One owner's ceiling on what it holds at once (docs/OPERATIONS.md, Scheduling policy)."""

    model_config = ConfigDict(extra="forbid")
    max_jobs: int | None = Field(default=None, ge=0, le=100_000)
    max_device_gib: float | None = Field(default=None, ge=0, le=1 << 20)
    max_host_gib: float | None = Field(default=None, ge=0, le=1 << 20)


class SharedSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WSTRAIN_", extra="ignore", populate_by_name=True)

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("WSTRAIN_REDIS_URL", "REDIS_URL"),
    )
    key_prefix: str = "wstrain"
    state_dir: Path = Path("wstrain-state")
    data_roots: list[str] = Field(default_factory=lambda: ["."], min_length=1, max_length=64)
    # the scheduling policy (policy/): every agent and the API's queue view read
    # the same, so set them alike everywhere
    fairshare_half_life_s: float = Field(default=DEFAULT_HALF_LIFE_S, gt=0, le=366 * 86400)
    owner_shares: dict[str, float] = Field(default_factory=dict, max_length=10_000)
    owner_quotas: dict[str, OwnerQuota] = Field(default_factory=dict, max_length=10_000)
    # a ranged job grows back (restarts higher in its range) only after running this long
    # since its last start, and only by this much more predicted tokens/s
    # (policy/budgets.py choose_growth)
    grow_after_s: float = Field(default=DEFAULT_GROW_AFTER_S, ge=0, le=366 * 86400)
    grow_min_gain: float = Field(default=DEFAULT_GROW_MIN_GAIN, ge=0, le=100)

    @field_validator("owner_shares")
    @classmethod
    def _shares_bounded(cls, shares: dict[str, float]) -> dict[str, float]:
        for owner, share in shares.items():
            if not 0 <= share <= 1e6:
                raise ValueError(f"owner_shares[{owner!r}] = {share}: give a share in 0..1e6")
        return shares

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            half_life_s=self.fairshare_half_life_s,
            shares=dict(self.owner_shares),
            grow_after_s=self.grow_after_s,
            grow_min_gain=self.grow_min_gain,
            quotas={
                o: Quota.from_gib(q.max_jobs, q.max_device_gib, q.max_host_gib)
                for o, q in self.owner_quotas.items()
            },
        )

    @model_validator(mode="after")
    def _roots_outside_state(self) -> SharedSettings:
        self.access()  # raises ValueError for a root inside the state dir
        return self

    def access(self) -> DataAccess:
        """What jobs may read: the data roots, less the state dir."""
        return DataAccess.of(self.data_roots, self.state_dir)

    def child_env(self) -> dict[str, str]:
        """These shared settings as the WSTRAIN_* variables of a child process (`wstrain
        serve`'s agent, which hands the state dir and roots on to its workers), so every
        process reads the same state dir and data roots as the one that built them."""
        dumped = self.model_dump(mode="json", include=set(SharedSettings.model_fields))
        return {
            f"WSTRAIN_{name.upper()}": v if isinstance(v, str) else json.dumps(v)
            for name, v in dumped.items()
        }
