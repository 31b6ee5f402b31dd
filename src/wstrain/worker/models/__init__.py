"""Llama, Qwen3 and mixture-of-experts decoder layers as plain functions of their weights;
they know nothing of streaming."""
