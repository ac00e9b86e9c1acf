"""Every knob of the cluster in one place: how devices are named and found, how long each wait may last, and the
environment Ray must run with for timings to mean anything."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kope_mcp.errors import KopeError
from kope_mcp.runtime.sandbox_setup import identity_prefix

NAMESPACE = "kope"
# A node's custom resource: a worker's devices are placed on the node that `kope worker --name NAME` started.
NODE_RESOURCE = "kope-node:{name}"
DEFAULT_TOKEN_FILE = "~/.kope-cluster-token"


class ClusterSettingError(KopeError):
    code = "invalid_setting"


@dataclass(frozen=True)
class ClusterConfig:
    address: str
    # KOPE_CLUSTER_TOKEN or --cluster-token; "" for RAY_AUTH_TOKEN_PATH, then DEFAULT_TOKEN_FILE (token_path).
    # Read at each connection: a token fixed on disk is taken without a restart.
    token: str = ""
    connect_timeout_s: float = 30.0
    # After the cluster could not be reached (or refused the token), calls are answered with that at once, and it
    # is tried again only after this long, doubling up to backoff_max_s while it keeps failing.
    backoff_s: float = 5.0
    backoff_max_s: float = 120.0
    # Listing devices asks every actor for its description; a worker that does not answer within this is left
    # out (it is shown again once it answers).
    describe_timeout_s: float = 5.0
    # The roster of devices is re-read at most this often (a worker that joins shows up within it).
    roster_ttl_s: float = 5.0
    # Beyond the call's own wall-clock cap: the transfer of inputs and outputs, a queue on the actor.
    call_margin_s: float = 60.0


def device_id(backend: str, worker: str) -> str:
    """The id clients pass as ``device``: the backend and the worker that owns it (two workers on one machine are
    two devices)."""
    return f"{backend}@{worker}"


def actor_name(worker: str, backend: str) -> str:
    return f"device/{worker}/{backend}"


def check_worker_name(name: str) -> str:
    if not name or len(name) > 40 or not all((c.isascii() and c.isalnum()) or c in "-_." for c in name):
        raise ClusterSettingError(f"worker name {name!r} is not 1-40 letters, digits, '-', '_' or '.'")
    return name


def token_source(setting: str) -> tuple[Path, str]:
    """The token file and what named it: the kope setting, else Ray's own RAY_AUTH_TOKEN_PATH (what the docs' head
    command sets), else the default."""
    if setting:
        return Path(setting).expanduser(), "KOPE_CLUSTER_TOKEN / --cluster-token"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return Path(os.environ["RAY_AUTH_TOKEN_PATH"]).expanduser(), "RAY_AUTH_TOKEN_PATH"
    return Path(DEFAULT_TOKEN_FILE).expanduser(), "the default"


def token_path(setting: str) -> Path:
    """The token file, which must exist and be readable by its owner only: without a token Ray runs with no
    authentication at all, and a readable one lets anyone on the machine submit code to every node."""
    path, named_by = token_source(setting)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        raise ClusterSettingError(
            f"no cluster token at {path} ({named_by}): create one (`python -c \"import secrets; "
            f"print(secrets.token_hex(32))\" > {path} && chmod 600 {path}`), copy it to every machine of the "
            "cluster, and point KOPE_CLUSTER_TOKEN (or RAY_AUTH_TOKEN_PATH) at it") from None
    if mode & 0o077:
        raise ClusterSettingError(f"the cluster token {path} ({named_by}) is mode {mode:04o}: other users could "
                                  f"join the cluster and run code on every node; `chmod 600 {path}`")
    return path


def ray_environment(token: Path) -> dict[str, str]:
    """What every Ray process of ours (head, node, driver) runs with: token authentication, and workers at normal
    priority (Ray's default nice 15 would make timings depend on whatever else runs)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_worker_niceness": "0",
            "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass(frozen=True)
class DriverIdentity:
    """Who the server's Ray driver child runs as. A Ray driver must be able to open its node's sockets, which only
    the node's user can; and whoever holds the cluster token can run code as that user on this machine (a Ray task
    placed here). So the child runs as the node's user and is given nothing of the server's: no KOPE_* variable,
    the token by value (the server's token file may be unreadable to that user), ``/`` as its folder."""

    uid: int | None  # None: the server's own
    gid: int | None
    warning: str  # why the node's user can reach the server's home ("" when it cannot)

    def command(self, argv: list[str]) -> list[str]:
        if self.uid is None:
            return argv
        return [*identity_prefix("per-run-uid", self.uid, self.gid), *argv]

    def environment(self, token: Path | None, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not k.startswith(("KOPE_", "RAY_AUTH_"))}
        if token is not None:
            env.update(ray_environment(token))
            del env["RAY_AUTH_TOKEN_PATH"]
            env["RAY_AUTH_TOKEN"] = token.read_text().strip()
        if self.uid is not None:
            env["HOME"] = "/"
        return env


def node_socket(temp_dir: str | None = None) -> Path:
    """This machine's Ray node's raylet socket (Ray's default temporary folder unless RAY_TMPDIR says otherwise)."""
    root = Path(temp_dir or os.environ.get("RAY_TMPDIR") or "/tmp") / "ray" / "session_latest" / "sockets"
    return root / "raylet"


def driver_identity(socket_path: Path, server_uid: int, home: Path) -> DriverIdentity:
    try:
        info = socket_path.stat()
    except OSError:
        return DriverIdentity(None, None, "")  # no local node found: Ray's own error says so when it connects
    if info.st_uid == server_uid:
        return DriverIdentity(None, None, (
            "this machine's Ray node runs as the server's own user, so anyone with the cluster token can run code "
            "here with KOPE_HOME in reach: start this machine's node as another user (docs/cluster.md)"))
    if server_uid == 0:
        try:
            shared = bool(home.stat().st_mode & 0o077)
        except OSError:
            shared = False
        return DriverIdentity(info.st_uid, info.st_gid, (
            f"KOPE_HOME is open to other users, including this machine's Ray node's (uid {info.st_uid}): make it "
            "0700") if shared else "")
    # An ordinary server cannot become the node's user; the node's own sockets decide whether it can connect.
    return DriverIdentity(None, None, "")
