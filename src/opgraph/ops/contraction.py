"""contraction ops (being written)."""
