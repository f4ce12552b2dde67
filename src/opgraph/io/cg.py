"""The TensCalc .cg binary format (being written)."""
