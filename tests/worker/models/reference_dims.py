"""Small random model configurations that the decoder tests compare with transformers:
dense (GQA, MHA, MQA, Qwen3, Llama 3.1 RoPE scaling) and mixture-of-experts (OLMoE,
Qwen3-MoE, Qwen2-MoE)."""

from __future__ import annotations

from wstrain.contracts.model_dims import ModelDims

CONFIGS = [
    ModelDims(97, 48, 80, 2, 4, 2, 12, 1e-5, 10000.0, 256),  # GQA 2:1
    ModelDims(64, 32, 96, 3, 4, 4, 8, 1e-6, 500000.0, 256),  # MHA, Llama-3 theta
    ModelDims(50, 64, 64, 1, 8, 1, 16, 1e-5, 10000.0, 256),  # MQA, head_dim*heads != hidden
    ModelDims(97, 48, 80, 2, 4, 2, 16, 1e-6, 1000000.0, 256, model_type="qwen3"),
    # Llama 3.1 RoPE scaling, with a short original context so every band is exercised
    ModelDims(97, 48, 80, 2, 4, 2, 12, 1e-5, 500000.0, 256, rope_llama3=(8.0, 1.0, 4.0, 64)),
]
# OLMoE (q/k norm over whole projections, top-k weights as routed) and Qwen3-MoE (per-head
# q/k norm, renormalised top-k, GQA), each with the load-balancing loss
MOE = [
    ModelDims(
        97,
        48,
        0,
        2,
        4,
        4,
        12,
        1e-5,
        10000.0,
        256,
        model_type="olmoe",
        num_experts=6,
        experts_per_token=2,
        moe_intermediate_size=20,
        router_aux_loss_coef=0.01,
    ),
    ModelDims(
        97,
        48,
        0,
        2,
        4,
        2,
        16,
        1e-6,
        1000000.0,
        256,
        model_type="qwen3_moe",
        num_experts=8,
        experts_per_token=3,
        moe_intermediate_size=24,
        norm_topk_prob=True,
        router_aux_loss_coef=0.05,
    ),
    # Qwen2-MoE: q/k/v biases, a sigmoid-gated shared expert beside the routed ones
    ModelDims(
        97,
        48,
        0,
        2,
        4,
        2,
        12,
        1e-6,
        1000000.0,
        256,
        model_type="qwen2_moe",
        num_experts=6,
        experts_per_token=2,
        moe_intermediate_size=20,
        router_aux_loss_coef=0.02,
        shared_expert_intermediate_size=40,
        qkv_bias=True,
    ),
]
