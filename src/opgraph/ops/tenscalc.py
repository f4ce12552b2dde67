"""TensCalc op kinds (being written)."""
