"""Read the pip install steps out of a Dockerfile and a Makefile, to compare them.

A Dockerfile is read instruction by instruction (continuation lines joined, comments dropped,
ARG defaults substituted); a Makefile's variables (`=`, `:=`, `?=`) are substituted in its
recipe lines. Every `pip install` (also `$(PIP) install`, `python -m pip install`) becomes a
PipInstall, in file order.
"""

from __future__ import annotations

import enum
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

PIP_INSTALL = re.compile(r"(?:^|\s)(?:\S*/)?(?:pip3?|python3?(?:\.\d+)? -m pip) install (.*)$")
OPTIONS_WITH_VALUE = frozenset(
    {
        "-r",
        "--requirement",
        "-c",
        "--constraint",
        "-i",
        "--index-url",
        "--extra-index-url",
        "-f",
        "--find-links",
        "--target",
        "-t",
        "--prefix",
        "--root",
        "--platform",
        "--python-version",
    }
)
NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # FROM, RUN, ...
    argument: str  # the rest, continuation lines joined with spaces


class Target(enum.Enum):
    """What one requirement of a pip install names."""

    LOCAL_PROJECT = "local project"
    PACKAGE = "package"


@dataclass(frozen=True)
class Requirement:
    target: Target
    name: str  # normalised package name; the path for a local project
    spec: str  # '==2.13.0', '' when unpinned
    extras: frozenset[str]


@dataclass(frozen=True)
class PipInstall:
    requirements: tuple[Requirement, ...]
    options: frozenset[str]  # flags without values: --no-deps, -e, -q, --upgrade ...

    def names(self) -> set[str]:
        return {r.name for r in self.requirements if r.target is Target.PACKAGE}

    def installs_project(self) -> bool:
        return any(r.target is Target.LOCAL_PROJECT for r in self.requirements)

    def requirement(self, name: str) -> Requirement:
        return next(r for r in self.requirements if r.name == name)


def dockerfile_instructions(path: Path) -> list[Instruction]:
    """The instructions of a Dockerfile, ARG defaults substituted into later ones."""
    instructions = []
    args: dict[str, str] = {}
    for line in _logical_lines(path.read_text()):
        keyword, _, argument = line.partition(" ")
        instruction = Instruction(keyword.upper(), _substitute(argument.strip(), args, "${}"))
        if instruction.keyword == "ARG" and "=" in instruction.argument:
            name, _, default = instruction.argument.partition("=")
            args[name.strip()] = default.strip()
        instructions.append(instruction)
    return instructions


def dockerfile_pip_installs(path: Path) -> list[PipInstall]:
    runs = [i.argument for i in dockerfile_instructions(path) if i.keyword == "RUN"]
    return [pip for run in runs for command in _shell_commands(run) for pip in _pip(command)]


def makefile_pip_installs(path: Path) -> list[PipInstall]:
    text = path.read_text()
    variables = dict(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)\s*[:?]?=\s*(.*?)\s*$", text, re.MULTILINE))
    recipes = [line.strip().lstrip("@-") for line in _logical_lines(text) if line.startswith("\t")]
    expanded = [_substitute(line, variables, "$()") for line in recipes]
    return [pip for line in expanded for command in _shell_commands(line) for pip in _pip(command)]


def parse_requirement(word: str) -> Requirement:
    if word.startswith((".", "/")):
        path, extras = _split_extras(word)
        return Requirement(Target.LOCAL_PROJECT, path, "", extras)
    base, extras = _split_extras(word)
    match = NAME.match(base)
    if match is None:
        raise ValueError(f"cannot read requirement {word!r}")
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    return Requirement(Target.PACKAGE, name, base[match.end() :].strip(), extras)


def _logical_lines(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    lines = (line.rstrip() for line in joined.splitlines())
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _substitute(text: str, variables: dict[str, str], style: str) -> str:
    opening, closing = style[:2], style[2]
    for _ in range(5):  # variables may refer to variables
        for name, value in variables.items():
            text = text.replace(f"{opening}{name}{closing}", value)
            if opening == "${":
                text = re.sub(rf"\${name}\b", value, text)
    return text


def _shell_commands(line: str) -> list[str]:
    line = re.sub(r"--mount=\S+", "", line)
    return [part.strip() for part in re.split(r"&&|\|\||;", line) if part.strip()]


def _pip(command: str) -> list[PipInstall]:
    match = PIP_INSTALL.search(command)
    if match is None:
        return []
    words = shlex.split(match.group(1))
    options, positional = _split_options(words)
    return [PipInstall(tuple(parse_requirement(w) for w in positional), frozenset(options))]


def _split_options(words: list[str]) -> tuple[list[str], list[str]]:
    options, positional = [], []
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
        elif word in OPTIONS_WITH_VALUE:
            skip_next = True
        elif word.startswith("-"):
            options.append(word.split("=", 1)[0])
        else:
            positional.append(word)
    return options, positional


def _split_extras(word: str) -> tuple[str, frozenset[str]]:
    match = re.match(r"^(.*?)\[([^\]]*)\](.*)$", word)
    if match is None:
        return word, frozenset()
    extras = frozenset(e.strip() for e in match.group(2).split(",") if e.strip())
    return match.group(1) + match.group(3), extras
