"""The host-side training state of the working-set runtime: per-layer flat tiles of weights,
gradients and AdamW moments in one accounted `HostArena`, plus the embedding and the head
group, and the CPU AdamW that updates them group by group (worker/host_optim.py runs it
beside the next step's forward).

    host = HostState.create(dims, "bf16", pin=torch.cuda.is_available())
    host.load_state_dict(hf_named_tensors); ...; host.step_group(k, lr, clip_coef, spec)
"""

from __future__ import annotations

import torch

from scheduler.contracts import OptimizerSpec
from scheduler.model_dims import ModelDims
from worker.arena import HostArena, LayerLayout

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class HostState:
    def __init__(self, dims: ModelDims, precision: str, arena: HostArena,
                 fused_adamw: bool = False) -> None:
        self.dims, self.precision, self.arena = dims, precision, arena
        self.layout = LayerLayout.decoder(dims)
        self.embed_layout = LayerLayout.embedding(dims)
        self.head_layout = LayerLayout.head(dims)
        dtype = DTYPES[precision]
        L = dims.num_layers

        def tiles(kind: str, layout: LayerLayout, prefix: str, n: int) -> list[torch.Tensor]:
            return [arena.alloc(f"{prefix}{i}.{kind}", layout.numel, dtype, kind)
                    for i in range(n)]

        self.weights = tiles("weights", self.layout, "layer", L)
        self.grads = tiles("gradients", self.layout, "layer", L)
        self.embed_w, self.embed_g, self.head_w, self.head_g = (
            tiles(kind, layout, name, 1)[0]
            for kind, layout, name in (("weights", self.embed_layout, "embed"),
                                       ("gradients", self.embed_layout, "embed"),
                                       ("weights", self.head_layout, "head"),
                                       ("gradients", self.head_layout, "head")))
        groups = [*zip(self.weights, self.grads), (self.embed_w, self.embed_g),
                  (self.head_w, self.head_g)]
        self.params: list[torch.nn.Parameter] = []
        self.optimizers: list[torch.optim.AdamW] = []
        for i, (w, g) in enumerate(groups):
            p = torch.nn.Parameter(w, requires_grad=True)  # shares the tile's storage
            p.grad = g
            opt = torch.optim.AdamW([p], fused=fused_adamw or None)
            # AdamW's moments live in the arena too, not in torch's own allocations.
            opt.state[p] = {"step": torch.tensor(0.0),
                            "exp_avg": arena.alloc(f"group{i}.m", w.numel(), dtype, "moments"),
                            "exp_avg_sq": arena.alloc(f"group{i}.v", w.numel(), dtype, "moments")}
            self.params.append(p)
            self.optimizers.append(opt)

    @classmethod
    def create(cls, dims: ModelDims, precision: str, pin: bool,
               fused_adamw: bool = False) -> HostState:
        """fused_adamw: torch's fused CPU AdamW (several times faster; rounds differently)."""
        return cls(dims, precision, HostArena(pin), fused_adamw)

    # ------------------------------------------------------------ named tensors (HF names)

    def _named_views(self, grads: bool = False) -> dict[str, torch.Tensor]:
        layers, embed, head = ((self.grads, self.embed_g, self.head_g) if grads
                               else (self.weights, self.embed_w, self.head_w))
        out = {}
        for k, w in enumerate(layers):
            for n, v in self.layout.hub_views(w).items():
                out[f"model.layers.{k}.{n}"] = v
        out.update(self.embed_layout.views(embed))
        out.update(self.head_layout.views(head))
        return out

    def weight_views(self) -> dict[str, torch.Tensor]:
        """Weight views under Hugging Face parameter names (no copies)."""
        return self._named_views()

    def named_grads(self) -> dict[str, torch.Tensor]:
        """Gradient views under Hugging Face parameter names (no copies)."""
        return self._named_views(grads=True)

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        views = self._named_views()
        missing = sorted(set(views) - set(tensors))
        if missing:
            raise KeyError(f"state dict lacks {missing[:4]}{'...' if len(missing) > 4 else ''}")
        with torch.no_grad():
            for n, v in views.items():
                v.copy_(tensors[n])


    def optimizer_state(self) -> dict[str, object]:
        return {"adamw": [{k: v.clone() if k == "step" else v for k, v in o.state[p].items()}
                          for o, p in zip(self.optimizers, self.params)]}

    def load_optimizer_state(self, extra: dict[str, object]) -> None:
        for o, p, saved in zip(self.optimizers, self.params, extra["adamw"]):  # type: ignore[call-overload]
            state = o.state[p]
            state["step"].copy_(saved["step"])
            state["exp_avg"].copy_(saved["exp_avg"])
            state["exp_avg_sq"].copy_(saved["exp_avg_sq"])

    # ------------------------------------------------------------ optimizer

    def step_group(self, group: int, lr: float, clip_coef: float, spec: OptimizerSpec) -> None:
        """AdamW on one group's tiles (layer k = k; embedding L; head L + 1), its gradient
        first scaled by the global-norm clipping factor."""
        p, opt = self.params[group], self.optimizers[group]
        fused, clipped = bool(opt.defaults.get("fused")), clip_coef < 1.0
        if clipped and not fused:
            p.grad.mul_(clip_coef)
        # the fused kernel divides the gradient by `grad_scale` as it reads it: clipping
        # then costs no pass of its own over the gradient (a fifth of the update's traffic)
        scale = torch.tensor(1.0 / clip_coef) if clipped and fused else None
        opt.grad_scale = scale  # type: ignore[attr-defined]
        for g in opt.param_groups:
            g.update(lr=lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay)
        opt.step()
