"""Print the README's first two commands (its first indented code block), one per line.

`.ci/run` runs exactly these lines, so CI and a newcomer run the same thing: a README edit that
breaks the install or the test command breaks CI.
"""

import pathlib
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_commands(text: str) -> list[str]:
    """The lines of the README's first indented block (4 spaces) that follow the title."""
    commands: list[str] = []
    for line in text.splitlines()[1:]:
        if line.startswith("    ") and line.strip():
            commands.append(line.strip())
        elif commands:
            break
    return commands


if __name__ == "__main__":
    lines = readme_commands(README.read_text(encoding="utf-8"))
    if len(lines) != 2:
        sys.exit(f"README.md: expected 2 commands in its first block, found {len(lines)}")
    print("\n".join(lines))
