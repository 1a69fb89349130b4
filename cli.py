"""coda-agent command line (placeholder until the CLI lands)."""


def main() -> int:
    print("coda-agent")
    return 0
