"""Fine-tuning from a Hugging Face model directory: its `*.safetensors` (sharded or not) are
read one tensor at a time straight into the training state's own storage — the host tiles of
the working set or the resident model's parameters — so loading never holds a second full
copy of the model in host memory.

    stream_into(host.weight_views(), Path(spec.model.path))
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open

log = logging.getLogger(__name__)


def stream_into(views: dict[str, torch.Tensor], directory: Path) -> int:
    """Copy every tensor of the directory's safetensors files into `views` (Hugging Face
    names); returns the bytes read. ValueError names missing, unexpected or misshapen ones."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} holds no *.safetensors file; fine-tuning needs the "
                         "weights next to config.json (save_pretrained writes both)")
    seen: set[str] = set()
    nbytes = 0
    with torch.no_grad():
        for path in files:
            with safe_open(str(path), framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if name not in views:
                        raise ValueError(f"{path.name} holds {name!r}, which a model of this "
                                         "config.json does not have; is config.json the one "
                                         "these weights were saved with?")
                    tensor = shard.get_tensor(name)  # one tensor in memory at a time
                    if tuple(tensor.shape) != tuple(views[name].shape):
                        raise ValueError(f"{path.name}: {name!r} has shape "
                                         f"{tuple(tensor.shape)}, the config implies "
                                         f"{tuple(views[name].shape)}")
                    views[name].copy_(tensor)
                    nbytes += tensor.numel() * tensor.element_size()
                    seen.add(name)
    missing = sorted(set(views) - seen)
    if missing:
        raise ValueError(f"{directory} lacks {len(missing)} weights, e.g. {missing[:3]}")
    log.info("loaded %d tensors (%.2f GB) from %s", len(seen), nbytes / 1e9, directory)
    return nbytes
