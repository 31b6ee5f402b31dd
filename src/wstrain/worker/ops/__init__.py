"""Attention and MLP forwards that save a lean set for a custom backward (the working set's
saved-activation levels)."""
