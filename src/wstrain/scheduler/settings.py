"""Settings every wstrain process that talks to Redis shares (env prefix WSTRAIN_); each
process's own settings class extends it and is built once in its main().

    WSTRAIN_REDIS_URL (or REDIS_URL)  redis://127.0.0.1:6379/0
    WSTRAIN_KEY_PREFIX                wstrain (namespace of every Redis key)
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RedisSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WSTRAIN_", extra="ignore", populate_by_name=True)

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("WSTRAIN_REDIS_URL", "REDIS_URL"),
    )
    key_prefix: str = "wstrain"
