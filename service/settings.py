"""Settings of the API process (env prefix WSTRAIN_), built once in main() / create_app().

    WSTRAIN_REDIS_URL (or REDIS_URL)  redis://127.0.0.1:6379/0
    WSTRAIN_KEY_PREFIX                wstrain (namespace of every Redis key)
    WSTRAIN_DATA_ROOTS                JSON list of directories jobs may read data/models from
    WSTRAIN_API_TOKENS                JSON object {token: owner}; empty turns auth off
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WSTRAIN_", extra="ignore", populate_by_name=True)

    redis_url: str = Field(default="redis://127.0.0.1:6379/0",
                           validation_alias=AliasChoices("WSTRAIN_REDIS_URL", "REDIS_URL"))
    key_prefix: str = "wstrain"
    data_roots: list[str] = Field(default_factory=lambda: ["."])
    api_tokens: dict[str, str] = Field(default_factory=dict)
