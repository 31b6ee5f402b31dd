"""Settings of the API process (env prefix WSTRAIN_), built once in main() / create_app().

    WSTRAIN_REDIS_URL, WSTRAIN_KEY_PREFIX  see scheduler/settings.py
    WSTRAIN_DATA_ROOTS                JSON list of directories jobs may read data/models from
    WSTRAIN_API_TOKENS                JSON object {token: owner}; empty turns auth off
"""

from __future__ import annotations

from pydantic import Field

from wstrain.scheduler.settings import RedisSettings


class ServiceSettings(RedisSettings):
    data_roots: list[str] = Field(default_factory=lambda: ["."])
    api_tokens: dict[str, str] = Field(default_factory=dict)
