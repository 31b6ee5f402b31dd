"""Fused Triton kernels (RMSNorm, RoPE, SwiGLU) with eager fallbacks."""
