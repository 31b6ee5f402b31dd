"""How the `wstrain` CLI reaches the server: which URL and token (flag, environment, config
file, default), the HTTP client, and one call that turns every failure into a message.

    conn = resolve(flag_server, flag_token)     # --server/--token, WSTRAIN_URL/_TOKEN, file
    with client(conn) as c:
        job = call(c, "GET", f"/v1/jobs/{job_id}")

Precedence, first found wins: the flag (before or after the subcommand), the environment
(WSTRAIN_URL, WSTRAIN_TOKEN), the config file, the default (http://127.0.0.1:8000, no
token). The config file is $WSTRAIN_CONFIG, else $XDG_CONFIG_HOME/wstrain/config.toml
(~/.config/wstrain/config.toml), TOML:

    server = "https://wstrain.lab.example:8443"
    token = "..."           # keep the file private: chmod 600 (a warning says otherwise)

Used by cli.py and its command modules (cli_spec.py, cli_watch.py, cli_tables.py).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

DEFAULT_SERVER = "http://127.0.0.1:8000"
REQUEST_TIMEOUT_S = 30.0  # a submission plans within WSTRAIN_PLAN_TIMEOUT_S (2 s) on the API
_URL_PATTERN = r"^https?://[^\s/]+(/\S*)?$"


class CliError(Exception):
    """A failure the CLI reports as `wstrain: <message>` and exit status 1."""


class ApiError(CliError):
    """The server answered an error (`status`), or could not be reached (status None)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class FileConfig(BaseModel):
    """The config file's keys; any other key is refused with the file's name."""

    model_config = ConfigDict(extra="forbid")
    server: str | None = Field(default=None, pattern=_URL_PATTERN)
    token: str | None = Field(default=None, min_length=1, max_length=4096)


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None
    server_from: str  # where the URL came from, for messages: "--server", "WSTRAIN_URL", ...


def config_path(env: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file to read and whether it was named explicitly ($WSTRAIN_CONFIG)."""
    if named := env.get("WSTRAIN_CONFIG"):
        return Path(named).expanduser(), True
    base = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "wstrain" / "config.toml", False


def load_config(path: Path, explicit: bool) -> FileConfig:
    """The file's settings; an absent default file is no settings, an absent named one an
    error (a typo in WSTRAIN_CONFIG would otherwise talk to the default server)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if explicit:
            raise CliError(
                f"config file {path} (WSTRAIN_CONFIG) does not exist; create it with "
                "server = ... and token = ..., or unset WSTRAIN_CONFIG"
            ) from None
        return FileConfig()
    except OSError as exc:
        raise CliError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"config file {path} is not valid TOML: {exc}") from exc
    try:
        config = FileConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in exc.errors()
        )
        raise CliError(
            f"config file {path}: {problems}; it may set only server (an http(s) URL) and token"
        ) from exc
    if config.token and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(
            f"wstrain: warning: {path} holds a token and is readable by others; chmod 600 {path}",
            file=sys.stderr,
        )
    return config


def resolve(
    flag_server: str | None, flag_token: str | None, env: Mapping[str, str] | None = None
) -> Connection:
    """The server and token by precedence: flag > environment > config file > default."""
    env = os.environ if env is None else env
    file: FileConfig | None = None

    def from_file() -> FileConfig:
        nonlocal file
        if file is None:
            file = load_config(*config_path(env))
        return file

    if flag_server:
        server, server_from = flag_server, "--server"
    elif env.get("WSTRAIN_URL"):
        server, server_from = env["WSTRAIN_URL"], "WSTRAIN_URL"
    elif from_file().server:
        server, server_from = str(from_file().server), str(config_path(env)[0])
    else:
        server, server_from = DEFAULT_SERVER, "the default"
    token = flag_token or env.get("WSTRAIN_TOKEN") or from_file().token
    if not server.startswith(("http://", "https://")):
        raise CliError(
            f"server {server!r} (from {server_from}) is not an http(s) URL; "
            f"pass one like {DEFAULT_SERVER}"
        )
    return Connection(server.rstrip("/"), token, server_from)


def client(conn: Connection) -> httpx.Client:
    headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}
    return httpx.Client(base_url=conn.server, headers=headers, timeout=REQUEST_TIMEOUT_S)


def unreachable(c: httpx.Client, exc: Exception) -> ApiError:
    return ApiError(
        f"cannot reach the wstrain server at {c.base_url}: {exc}; start it with "
        "`wstrain serve`, or point --server / WSTRAIN_URL / the config file at it",
        None,
    )


def error_of(resp: httpx.Response) -> ApiError:
    """The server's `detail` of an error response, pydantic field errors joined."""
    try:
        body = resp.json()
    except ValueError:
        body = {"detail": resp.text}
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # field errors, the schema's or several failed checks'
        lines = [
            f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}"
            for e in detail
            if isinstance(e, dict)
        ]
        # one a line when there are several: the checks' messages hold "; " themselves
        several = f"{len(lines)} errors:\n  " + "\n  ".join(lines)
        detail = several if len(lines) > 1 else "".join(lines)
    extra = f" (minimum budget: {body['min_budget']})" if "min_budget" in body else ""
    if resp.status_code == 401:
        extra += "; pass --token, set WSTRAIN_TOKEN, or put token = ... in the config file"
    return ApiError(f"{resp.status_code}: {detail}{extra}", resp.status_code)


def call(c: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    """The JSON of a successful answer; ApiError with the server's message otherwise."""
    try:
        resp = c.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise unreachable(c, exc) from exc
    if resp.status_code >= 400:
        raise error_of(resp)
    return resp.json()
