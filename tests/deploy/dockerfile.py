"""A small reader of the repository's Dockerfile, for the deploy tests.

Only what the tests need: instructions (continuation lines joined,
comments dropped), grouped by stage, with ARG defaults substituted in FROM.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    value: str

    def exec_form(self) -> list[str]:
        """The JSON (exec) form's argv, e.g. of ENTRYPOINT."""
        parsed = json.loads(self.value)
        assert isinstance(parsed, list), f"{self.keyword} is not in exec form: {self.value}"
        return [str(item) for item in parsed]


@dataclass(slots=True)
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"no {keyword} in stage {self.name or self.image}"
        return found[-1]

    def copies(self) -> list[tuple[list[str], str, dict[str, str]]]:
        """(sources, destination, --options) of every COPY."""
        result = []
        for item in self.all("COPY"):
            words = shlex.split(item.value)
            options = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
            paths = [w for w in words if not w.startswith("--")]
            result.append((paths[:-1], paths[-1], options))
        return result

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for item in self.all("ENV"):
            for word in shlex.split(item.value):
                key, _, value = word.partition("=")
                values[key] = value
        return values


def instructions(text: str) -> list[Instruction]:
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        current += line
        logical.append(current)
        current = ""
    if current:
        logical.append(current)
    result = []
    for line in logical:
        keyword, _, value = line.partition(" ")
        result.append(Instruction(keyword.upper(), value.strip()))
    return result


def stages(path: Path = DOCKERFILE) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages in order)."""
    args: dict[str, str] = {}
    result: list[Stage] = []
    for item in instructions(path.read_text()):
        if item.keyword == "ARG" and not result:
            key, _, default = item.value.partition("=")
            args[key] = default
            continue
        if item.keyword == "FROM":
            words = item.value.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(image, name))
            continue
        assert result, f"{item.keyword} before FROM"
        result[-1].instructions.append(item)
    return args, result
