"""A cluster token for the services a test starts: closed internal plane, as in production."""

from __future__ import annotations

from pathlib import Path

from pdserve.rpc.security import write_cluster_token


def cluster_token_file(workdir: Path) -> Path:
    """The token file of `workdir` (a supervisor's), written once: every child reads the same."""
    path = Path(workdir) / "cluster-token"
    return path if path.exists() else write_cluster_token(path)


def cluster_flags(workdir: Path) -> list[str]:
    return ["--cluster-token-file", str(cluster_token_file(workdir))]


def cluster_metadata(workdir: Path) -> tuple[tuple[str, str], ...]:
    """What a test's own internal calls send."""
    return (("authorization", f"Bearer {cluster_token_file(workdir).read_text().strip()}"),)
