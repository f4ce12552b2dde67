"""The opgraph command (being written)."""


def main() -> int:
    return 0
