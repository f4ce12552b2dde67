"""linalg ops (being written)."""
