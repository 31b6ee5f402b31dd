"""Settings every wstrain process that talks to Redis shares (env prefix WSTRAIN_); each
process's own settings class extends it and is built once in its main().

    WSTRAIN_REDIS_URL (or REDIS_URL)  redis://127.0.0.1:6379/0
    WSTRAIN_KEY_PREFIX                wstrain (namespace of every Redis key)
    WSTRAIN_STATE_DIR                 wstrain-state (job dirs: specs, plans, checkpoints, logs)
    WSTRAIN_DATA_ROOTS                JSON list of directories jobs may read data and models
                                      from (["."]); the state dir is never readable by jobs,
                                      and a root inside it is refused at start
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wstrain.scheduler.contracts.access import DataAccess


class SharedSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WSTRAIN_", extra="ignore", populate_by_name=True)

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("WSTRAIN_REDIS_URL", "REDIS_URL"),
    )
    key_prefix: str = "wstrain"
    state_dir: Path = Path("wstrain-state")
    data_roots: list[str] = Field(default_factory=lambda: ["."], min_length=1, max_length=64)

    @model_validator(mode="after")
    def _roots_outside_state(self) -> SharedSettings:
        self.access()  # raises ValueError for a root inside the state dir
        return self

    def access(self) -> DataAccess:
        """What jobs may read: the data roots, less the state dir."""
        return DataAccess.of(self.data_roots, self.state_dir)
