"""Runtime settings, read from ``KOPE_*`` environment variables."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from kope_mcp.errors import HomeUnusableError, KopeError

MEMORY_FILE = "memory.kuzu"  # the graph database in KOPE_HOME

class InvalidSettingError(KopeError):
    code = "invalid_setting"


_SWITCH = {"on": True, "1": True, "true": True, "yes": True, "off": False, "0": False, "false": False, "no": False}


def positive_number(name: str, kind: type[int] | type[float], what: str, default: float) -> float:
    """A positive int or float KOPE_* variable; unset: ``default``."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = kind(text.strip())
    except ValueError:
        value = -1
    if value <= 0:
        raise InvalidSettingError(f"{name}={text!r} is not {what}; unset it for the default ({default})")
    return value


def switch(name: str, default: bool) -> bool:
    """An on/off KOPE_* variable (on, off, 1, 0, true, false, yes, no); unset: ``default``."""
    text = os.environ.get(name)
    if text is None:
        return default
    if text.strip().lower() not in _SWITCH:
        raise InvalidSettingError(f"{name}={text!r} is not on or off (also 1/0, true/false, yes/no); unset it for "
                                  f"the default ({'on' if default else 'off'})")
    return _SWITCH[text.strip().lower()]


class KopeSettings(BaseModel):
    home: Path = Field(description="Where everything is kept: builds, kernel records, logs (KOPE_HOME).")
    max_source_bytes: int = Field(256 * 1024, description="Largest accepted kernel source (KOPE_MAX_SOURCE_BYTES).")
    compile_timeout_s: float = Field(60.0, description="Wall-clock cap for one compilation.")
    test_timeout_s: float = Field(30.0, description="Wall-clock cap for one run_tests child process.")
    profile_time_cap_s: float = Field(3.0, description="Measurement time cap of profile_kernel (KOPE_PROFILE_S); "
                                      "a noisy profile samples on up to 3 times it.")
    memory_limit_bytes: int = Field(4 * 1024**3, description="Address-space limit of a kernel child process.")
    compiler: str = Field("gcc", description="C compiler for the c backend (KOPE_CC).")
    gpu: int = Field(0, ge=0, description="The GPU the triton and cuda backends run and time on, by its index in PCI "
                     "order, /dev/nvidia<N> (KOPE_GPU); runs see that device alone.")
    embeddings: bool = Field(True, description="Semantic search with all-MiniLM-L6-v2 (KOPE_EMBEDDINGS=off).")
    selection: str = Field("", description="query_experience's weights: a preset name or a JSON file of "
                           "SelectionConfig fields (KOPE_SELECTION; default: the 'evidence' preset).")
    remeasure_every_s: float = Field(300.0, ge=0, description="How often the server looks for a noisy result to "
                                     "measure again while the machine is quiet, in the background (KOPE_REMEASURE_S; "
                                     "0: never).")
    cluster: str = Field("", description="The Ray cluster whose `kope worker` devices this server dispatches to, "
                         "as HOST:PORT (KOPE_CLUSTER; empty: this machine only, no Ray).")
    cluster_token: str = Field("", description="A file (mode 0600) holding the cluster's Ray auth token "
                               "(KOPE_CLUSTER_TOKEN; default ~/.kope-cluster-token).")

    @classmethod
    def from_env(cls, **overrides: object) -> KopeSettings:
        env = os.environ
        values: dict[str, object] = {
            "home": Path(env.get("KOPE_HOME", "~/.kope")).expanduser(),
            "compiler": env.get("KOPE_CC", "gcc"),
            "embeddings": switch("KOPE_EMBEDDINGS", True),
            "selection": env.get("KOPE_SELECTION", ""),
            "cluster": env.get("KOPE_CLUSTER", "").strip(),
            "cluster_token": env.get("KOPE_CLUSTER_TOKEN", ""),
        }
        if "KOPE_MAX_SOURCE_BYTES" in env:
            values["max_source_bytes"] = positive_number("KOPE_MAX_SOURCE_BYTES", int,
                                                         "a positive whole number of bytes", 256 * 1024)
        if "KOPE_GPU" in env:
            text = env["KOPE_GPU"].strip()
            if not text.isdigit():
                raise InvalidSettingError(f"KOPE_GPU={text!r} is not a GPU index (0, 1, ... as in /dev/nvidia<N>); "
                                          "unset it for the default (0)")
            values["gpu"] = int(text)
        if "KOPE_PROFILE_S" in env:
            values["profile_time_cap_s"] = positive_number("KOPE_PROFILE_S", float, "a positive number of seconds",
                                                           3.0)
        if "KOPE_REMEASURE_S" in env:
            text = env["KOPE_REMEASURE_S"].strip()
            values["remeasure_every_s"] = 0.0 if text == "0" else positive_number(
                "KOPE_REMEASURE_S", float, "a positive number of seconds, or 0 for never", 300.0)
        values.update(overrides)
        return cls.model_validate(values)

    def client_visible(self) -> dict[str, str]:
        """The settings a client sets through its environment, as ``KOPE_*`` values: compared between a stdio
        client and the daemon that serves its home (the daemon's win)."""
        return {
            "KOPE_CC": self.compiler,
            "KOPE_CLUSTER": self.cluster,
            "KOPE_EMBEDDINGS": "on" if self.embeddings else "off",
            "KOPE_GPU": str(self.gpu),
            "KOPE_MAX_SOURCE_BYTES": str(self.max_source_bytes),
            "KOPE_PROFILE_S": f"{self.profile_time_cap_s:g}",
            "KOPE_SELECTION": self.selection,
            "KOPE_TASKS_PATH": os.environ.get("KOPE_TASKS_PATH", ""),
            "KOPE_UNSAFE_NO_SANDBOX": "1" if os.environ.get("KOPE_UNSAFE_NO_SANDBOX") == "1" else "0",
        }

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, home: Path) -> Path:
        # Kernels run in a sandbox with another working directory: a relative home would not be found there.
        return home.expanduser().resolve()

    @property
    def builds_dir(self) -> Path:
        return self.home / "builds"

    @property
    def scratch_dir(self) -> Path:
        return self.home / "scratch"

    def ensure_home(self) -> list[str]:
        """Create the home and its build cache 0700, tightening them when found looser; what was tightened."""
        warnings = []
        for path in (self.home, self.builds_dir, self.scratch_dir):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                path.chmod(0o700)
                warnings.append(f"{path} was mode {mode:04o} (other users could read kernels and the memory); "
                                "it is now 0700")
        return warnings

    @property
    def memory_path(self) -> Path:
        return self.home / MEMORY_FILE


def check_home(home: Path, create: bool = True) -> None:
    """Raise HomeUnusableError (one line: what is wrong and what to do) unless ``home`` is, or can be made, a
    folder this user can write; ``create=False`` judges without making it."""
    fix = "point KOPE_HOME at a folder you can write (the default is ~/.kope)"
    blocker = next((p for p in home.parents if p.exists() and not p.is_dir()), None)
    if home.exists() and not home.is_dir():
        raise HomeUnusableError(f"KOPE_HOME {home} is a file, not a folder: {fix}")
    if blocker is not None:
        raise HomeUnusableError(f"KOPE_HOME {home} cannot be made: {blocker} is a file, not a folder; {fix}")
    if not create and not home.exists():
        parent = next(p for p in home.parents if p.exists())
        if not os.access(parent, os.W_OK | os.X_OK):
            raise HomeUnusableError(f"KOPE_HOME {home} cannot be made: {parent} is not writable by this user "
                                    f"(uid {os.geteuid()}); {fix}")
        return
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        why = exc.strerror.lower() if exc.strerror else str(exc)
        raise HomeUnusableError(f"KOPE_HOME {home} cannot be made: {why} ({exc.filename or home}); {fix}") from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise HomeUnusableError(f"KOPE_HOME {home} is not writable by this user (uid {os.geteuid()}): {fix}")
