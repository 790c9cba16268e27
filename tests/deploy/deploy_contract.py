"""The CLI contract of deploy/README.md, and how the manifests use it.

README.md lists the flags in tables under '### Global flags' (before the subcommand), '### Common
flags', '### Router flags' and '### Worker flags'; a row's first cell is the flag in backquotes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from k8s_render import Manifest, pod_templates

ROLES = ("router", "prefill", "decode")
FLAG_ROW = re.compile(r"^\|\s*`(--[a-z0-9-]+)`", re.MULTILINE)
SECTION = re.compile(r"^### (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Invocation:
    """One `pdserve [--global=value ...] ROLE --flag=value ...` command line of a manifest."""

    where: str
    role: str
    flags: dict[str, str]
    global_flags: dict[str, str]


def readme_sections(readme: Path) -> dict[str, set[str]]:
    """Section title -> flags listed in that section's table."""
    text = readme.read_text()
    heads = list(SECTION.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return {h.group(1).strip(): set(FLAG_ROW.findall(text, h.end(), end)) for h, end in zip(heads, ends, strict=True)}


def documented_flags(readme: Path) -> dict[str, set[str]]:
    """Role -> every flag README.md allows after it; 'global' -> flags allowed before it."""
    sections = readme_sections(readme)
    common = sections["Common flags (router, prefill, decode)"]
    workers = sections["Worker flags (prefill, decode)"]
    return {
        "global": sections["Global flags (before the subcommand)"],
        "router": common | sections["Router flags"],
        "prefill": common | workers,
        "decode": common | workers,
    }


def parse_command(where: str, words: list[str]) -> Invocation:
    """['--log-level=info', 'prefill', '--port=50061', ...] -> Invocation.

    Every flag must be written --name=value, so that a flag and its value cannot come apart."""
    position = next(i for i, word in enumerate(words) if not word.startswith("-"))
    return Invocation(where, words[position], _flags(where, words[position + 1 :]), _flags(where, words[:position]))


def _flags(where: str, words: list[str]) -> dict[str, str]:
    flags = {}
    for word in words:
        name, equals, value = word.partition("=")
        if not (name.startswith("--") and equals):
            raise ValueError(f"{where}: write flags as --name=value, got {word!r}")
        flags[name] = value
    return flags


def k8s_invocations(manifests: Iterable[Manifest]) -> Iterator[tuple[Manifest, Invocation]]:
    """(container, invocation) for every container running the pdserve image."""
    for workload, pod in pod_templates(manifests):
        for container in pod["containers"]:
            if is_pdserve_image(container["image"]):
                where = f"{workload['kind']}/{workload['metadata']['name']}"
                yield container, parse_command(where, container["args"])


def is_pdserve_image(image: str) -> bool:
    return image.rpartition("/")[2].split(":")[0] == "pdserve"


def referenced_variables(text: str) -> set[str]:
    """Kubernetes $(VAR) references (not the escaped $$(VAR))."""
    return set(re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", text))


# Secret name -> keys, as deploy/k8s/secrets/generate.sh writes them (checked by a test).
GENERATED_SECRET_KEYS = {
    "pdserve-tls": frozenset({"tls.crt", "tls.key", "ca.crt"}),
    "pdserve-tokens": frozenset({"cluster-token", "api-token"}),
}
