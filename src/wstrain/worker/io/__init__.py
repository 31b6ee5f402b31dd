"""Reading and writing outside the process: token data, Hugging Face safetensors, checkpoints."""
