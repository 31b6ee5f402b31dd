"""Fine-tuning a Hugging Face checkpoint: a model written by `save_pretrained` (sharded, with
an index) loads into wstrain's runtimes, trains a few steps, is saved, and
`from_pretrained` on the result gives the same logits as wstrain's own model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.worker.hf_models import hf_causal_lm, hub_state, perturb_norms
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.model_dims import PRESETS, resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.build import build_runtime
from wstrain.worker.io import checkpoint
from wstrain.worker.io.data import TokenStream
from wstrain.worker.models.dense import LlamaModel


@pytest.mark.parametrize("runtime", ["working_set", "resident"])
@pytest.mark.parametrize(
    "preset", ["micro-llama", "tiny-qwen3", "tiny-olmoe", "tiny-qwen3-moe", "tiny-qwen2-moe"]
)
def test_save_pretrained_checkpoint_fine_tunes_and_round_trips(
    tmp_path: Path, runtime: str, preset: str
) -> None:
    torch.manual_seed(0)
    hf = hf_causal_lm(PRESETS[preset])
    perturb_norms(hf, seed=1)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()  # really sharded
    spec = JobSpec.model_validate(
        {
            "name": "ft",
            "model": {"path": str(tmp_path / "hf")},
            "data": {"kind": "synthetic"},
            "seq_len": 32,
            "global_batch": 4,
            "steps": 3,
            "precision": "fp32",
            "budget": {"device_gib": 1, "host_gib": 2},
            "optimizer": {"lr": 1e-3},
            "overrides": {"runtime": runtime},
        }
    )
    dims = resolve_dims(spec.model)
    assert dims == PRESETS[preset]
    rt = build_runtime(spec, make_plan(spec, dims, DEFAULT_PROFILE))
    start, hub = rt.state_tensors(), hub_state(hf)  # Hub names: experts one by one
    assert set(start) == set(hub)
    for name, p in hub.items():  # the runtime starts from the checkpoint
        assert torch.equal(start[name].cpu(), p), name
    data = TokenStream.open(
        spec.data, dims.vocab_size, spec.seq_len, spec.seed, global_batch=spec.global_batch
    )
    for step in range(3):
        rt.train_step(data, step)
    trained = {k: v.cpu() for k, v in rt.state_tensors().items()}
    assert any(not torch.equal(trained[n], p) for n, p in hub.items())
    path = checkpoint.save(
        tmp_path / "ckpt",
        checkpoint.TrainerState(3, 3),
        trained,
        rt.optimizer_state(),
        dims.to_hf_config(),
    )
    theirs = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float()
    ours = LlamaModel(dims)
    ours.load_state_dict(trained)
    tokens = torch.randint(0, dims.vocab_size, (2, 20))
    with torch.no_grad():
        want, got = theirs(input_ids=tokens).logits, ours(tokens)
    assert float((got - want).norm() / want.norm()) < 1e-5
    # the held-out evaluation path agrees with the reference's loss too
    x, y = data.eval_batch(3) if data.heldout is not None else data.batch(99, 0, 3)
    with torch.no_grad():
        ref_logits = theirs(input_ids=x).logits
    ref_loss = float(
        torch.nn.functional.cross_entropy(ref_logits.reshape(-1, dims.vocab_size), y.reshape(-1))
    )
    assert abs(rt.eval_loss(x, y) - ref_loss) < 1e-5 * ref_loss


def test_missing_and_unexpected_weights_are_named(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from wstrain.worker.io.hf_load import stream_into

    views = {"a": torch.zeros(2), "b": torch.zeros(3)}
    save_file({"a": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match="lacks 1 weights"):
        stream_into(views, tmp_path)
    save_file(
        {"a": torch.ones(2), "b": torch.ones(3), "c": torch.ones(1)},
        str(tmp_path / "m.safetensors"),
    )
    with pytest.raises(ValueError, match="'c'"):
        stream_into(views, tmp_path)
    with pytest.raises(ValueError, match=r"no \*.safetensors"):
        stream_into(views, tmp_path / "nowhere")


@pytest.mark.parametrize(
    "file_dtype,state_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)]
)
def test_other_file_dtypes_convert_in_bounded_pieces(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
    file_dtype: torch.dtype,
    state_dtype: torch.dtype,
) -> None:
    """A checkpoint in another dtype than the training state converts through a small
    buffer (here 1 KiB: many pieces per tensor), equal to a plain dtype cast."""
    from safetensors.torch import save_file

    from wstrain.worker.io import hf_load

    monkeypatch.setattr(hf_load, "CONVERT_BYTES", 1024)
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(37, 29, generator=g).to(file_dtype),
        "b": torch.randn(1000, generator=g).to(file_dtype),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    views = {n: torch.empty(t.shape, dtype=state_dtype) for n, t in tensors.items()}
    hf_load.stream_into(views, tmp_path)
    for n, t in tensors.items():
        assert torch.equal(views[n], t.to(state_dtype)), n


def test_a_safetensors_header_is_capped_and_never_quoted(tmp_path: Path) -> None:
    """The header length a file claims is checked before anything is allocated, and a
    header that does not parse is named without quoting it."""
    import struct

    from wstrain.worker.io.hf_load import stream_into

    views = {"a": torch.zeros(2)}
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", 1 << 62) + b"MARKER-st-1")
    with pytest.raises(ValueError, match="header length is not between 1 and 100000000"):
        stream_into(views, tmp_path)
    header = b'{"a": {"dtype": "MARKER-st-2", "shape": [2]}}'
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(ValueError, match="is not a safetensors header") as caught:
        stream_into(views, tmp_path)
    assert "MARKER" not in str(caught.value)
