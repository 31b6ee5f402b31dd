"""Which files a job may read: anything under the data roots (WSTRAIN_DATA_ROOTS) except the
service's own state dir, which holds every user's checkpoints; and how a file a user named
is read: by descriptor, checked, and capped where it is parsed whole.

Checked on the file actually opened. `descriptor` opens the path (a directory, or a name
inside a directory already opened) and checks the path the kernel gives for the open
descriptor (/proc/self/fd/N), so a symlink swapped in between submit and open, or a
config.json inside a model directory that links elsewhere, cannot lead outside the roots.
Readers then use the descriptor, or /proc/self/fd/N, which is that same file whatever
happens to the path meanwhile. `check` (resolved path only) is for paths nothing reads.

Files the API parses whole are read by `read_bytes` under a cap (below): it fstat()s the
descriptor and refuses a larger file without reading a byte of it, so a 2 GiB config.json
costs the API nothing. Only regular files are opened (O_NONBLOCK, then fstat): a FIFO or a
device under a root would block a reader forever or never end.

    access = DataAccess.of(["/data"], state_dir="/srv/wstrain-state")
    access.check("/data/corpus.bin", "data.path")          # API: raises InvalidSpec
    with access.open("/data/corpus.bin", "data.path") as p:  # worker: p = /proc/self/fd/N
        tokens = np.memmap(p, dtype=np.uint16, mode="r")
    raw = access.read_bytes("/data/m/config.json", "model.path's config.json", CONFIG_MAX_BYTES)
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from wstrain.contracts.errors import InvalidSpec

_FD_DIR = Path("/proc/self/fd")

# Caps on the files read and parsed whole (the API holds one such file at a time per
# planning thread; JSON parsing takes ~8x the file's size in Python objects):
# a Hugging Face config.json is 0.5-5 KB (Llama 3 8B: 0.8 KB, Qwen3-30B-A3B: 1 KB); 1 MiB is
# 200x the largest and ~8 MiB of parsing.
CONFIG_MAX_BYTES = 1 << 20
# tokenizer.json: Llama 3's is 9 MB, Qwen3's 11 MB, OLMoE's 2 MB, Gemma 3's 33 MB (the
# largest common one); parsing 50 MiB took 1.8 s and 305 MiB (6x) on the dev VM, so 40 MiB
# keeps one parse near 250 MiB and within the plan deadline.
TOKENIZER_MAX_BYTES = 40 << 20
# a token file's header (NAME.json beside NAME.bin) is ~0.5 KB; 64 KiB is 100x that.
TOKEN_HEADER_MAX_BYTES = 64 << 10
# a .safetensors file's JSON header: the safetensors library's own limit (100 MB).
SAFETENSORS_HEADER_MAX_BYTES = 100_000_000

# pydantic error types whose message names the rule broken and never the input (e.g. "Input
# should be less than or equal to 1024", "Field required"); others are shown by type only.
_VALUE_FREE_TYPES = {
    "missing",
    "int_type",
    "int_parsing",
    "int_from_float",
    "float_type",
    "float_parsing",
    "bool_type",
    "bool_parsing",
    "string_type",
    "dict_type",
    "list_type",
    "model_type",
    "model_attributes_type",
    "literal_error",
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "too_long",
    "finite_number",
    "json_invalid",
}

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _size_text(n_bytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n_bytes >= 1 << shift:
            return f"{n_bytes / (1 << shift):.1f} {unit}"
    return f"{n_bytes} bytes"


@dataclass(frozen=True)
class DataAccess:
    roots: tuple[Path, ...]  # resolved
    state_dir: Path | None  # resolved; nothing under it is a job's data

    @classmethod
    def of(cls, roots: Sequence[str | Path], state_dir: str | Path | None) -> DataAccess:
        """Refuses a data root that is the state dir or lies inside it: every job could
        then read every other job's checkpoints."""
        real_roots = tuple(Path(os.path.realpath(r)) for r in roots)
        real_state = Path(os.path.realpath(state_dir)) if state_dir is not None else None
        for given, root in zip(roots, real_roots):
            if real_state is not None and _inside(root, real_state):
                raise ValueError(
                    f"data root {str(given)!r} is the state dir {str(real_state)!r} or lies "
                    "inside it, which holds every job's checkpoints; set WSTRAIN_DATA_ROOTS "
                    "to the directories that hold training data and models only"
                )
        return cls(real_roots, real_state)

    def check(self, path: str, field: str) -> Path:
        """`path` resolved, if it lies under a root and outside the state dir; else
        InvalidSpec naming the field, the value and the fix."""
        return self._allowed(Path(os.path.realpath(path)), path, field)

    def _allowed(self, real: Path, given: str, field: str) -> Path:
        if not any(_inside(real, r) for r in self.roots):
            roots = [str(r) for r in self.roots]
            raise InvalidSpec(
                f"{field}={given!r} lies outside the data roots {roots}; move the file under "
                "one of them or add its directory to WSTRAIN_DATA_ROOTS"
            )
        if self.state_dir is not None and _inside(real, self.state_dir):
            raise InvalidSpec(
                f"{field}={given!r} lies inside the service's state dir {str(self.state_dir)!r}"
                ", which jobs may not read; copy what you need under a data root"
            )
        return real

    @contextlib.contextmanager
    def descriptor(
        self, path: str | Path, field: str, *, directory: bool = False, shown: str | None = None
    ) -> Iterator[int]:
        """An open descriptor of `path`, checked on the file actually opened: under a root,
        outside the state dir, a regular file (or a directory with `directory`). InvalidSpec
        names the field, the path as the user gave it (`shown`, default `path`) and the fix.
        Closed when the block ends."""
        given = shown if shown is not None else str(path)
        flags = _READ_FLAGS | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            kind = "directory" if directory else "file"
            raise InvalidSpec(
                f"{field}={given!r} does not exist or cannot be opened as a {kind} "
                f"({exc.strerror}); give a readable {kind} under the data roots"
            ) from None
        try:
            if _FD_DIR.is_dir():
                self._allowed(Path(os.readlink(_FD_DIR / str(fd))), given, field)
            else:  # no /proc: resolve the path, and make sure it is the file we hold open
                real = self.check(str(path), field)
                if not os.path.samestat(os.fstat(fd), os.stat(real)):
                    raise InvalidSpec(f"{field}={given!r} changed while it was opened")
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
                raise InvalidSpec(
                    f"{field}={given!r} is not a "
                    + ("directory" if directory else "regular file (a FIFO, device or directory)")
                    + "; give a "
                    + ("directory" if directory else "file")
                    + " under the data roots"
                )
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def open(self, path: str | Path, field: str) -> Iterator[str]:
        """Open the regular file `path` for reading, check the file actually opened, and yield
        a path that names exactly that file (/proc/self/fd/N) while the block runs."""
        with self.descriptor(path, field) as fd:
            yield str(_FD_DIR / str(fd)) if _FD_DIR.is_dir() else f"/dev/fd/{fd}"

    def read_bytes(
        self,
        path: str | Path,
        field: str,
        max_bytes: int,
        *,
        shown: str | None = None,
        fix: str = "point it at a smaller file",
    ) -> bytes:
        """The whole regular file `path`, opened and checked as `descriptor` does, if it
        holds at most `max_bytes`; else InvalidSpec naming the field, the size and the cap,
        with nothing past the cap read (fstat first; a file growing meanwhile is cut off)."""
        given = shown if shown is not None else str(path)
        with self.descriptor(path, field, shown=shown) as fd:
            size = os.fstat(fd).st_size
            chunks, got = [], 0
            while size <= max_bytes and got <= max_bytes:
                chunk = os.read(fd, max_bytes + 1 - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        if size > max_bytes or got > max_bytes:
            raise InvalidSpec(
                f"{field}={given!r} is {_size_text(max(size, got))}, over the "
                f"{_size_text(max_bytes)} cap ({max_bytes} bytes) on what the service reads "
                f"of it; {fix}",
                max_bytes=max_bytes,
            )
        return b"".join(chunks)


def file_problems(exc: ValidationError, limit: int = 10) -> str:
    """A pydantic ValidationError of a file's contents (a config.json, a token-file header)
    told without the file's values: each error's field and rule. pydantic's messages for
    types and bounds hold no input; a validator's own ValueError shows its `safe` text if it
    has one (model_refs.ConfigProblem), else "invalid"; other types are named by type."""
    return "; ".join(_problem(e) for e in exc.errors(include_url=False)[:limit])


def _problem(error: ErrorDetails) -> str:
    if error["type"] == "extra_forbidden":  # its loc is the file's own key: not shown
        return "a field the format does not have"
    # only the model's own field names and list positions are shown, 80 characters at most
    loc = ".".join(str(p) for p in error["loc"] if isinstance(p, int) or p.isidentifier())
    loc = loc[:80] or "the file"
    if error["type"] == "value_error":
        safe = getattr(error.get("ctx", {}).get("error"), "safe", None)
        return f"{loc}: {safe}" if isinstance(safe, str) else f"{loc}: invalid"
    if error["type"] in _VALUE_FREE_TYPES:
        return f"{loc}: {error['msg']}"
    return f"{loc}: {error['type'].replace('_', ' ')}"
