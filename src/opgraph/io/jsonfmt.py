"""The JSON form (being written)."""
