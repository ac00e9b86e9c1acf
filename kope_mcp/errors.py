"""The error tree for calls a model can fix.

Every message starts with a stable code (``unknown_task: ...``) and says what is valid, so the calling model can
correct its next call without guessing. Outcomes such as a compile error or a wrong answer are *not* errors: they
come back as normal results.
"""

from __future__ import annotations

from collections.abc import Iterable


class KopeError(Exception):
    """A call the model can fix; the message reaches the model verbatim."""

    code = "kope_error"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.code}: {detail}")
        self.detail = detail


def rebuild_error(cls: type[KopeError], detail: str) -> KopeError:
    """A ``cls`` error with ``detail``, whatever its constructor takes (a device's error read back by name)."""
    error = cls.__new__(cls)
    Exception.__init__(error, f"{cls.code}: {detail}")
    error.detail = detail
    return error


def _choices(valid: Iterable[str], limit: int = 60) -> str:
    items = sorted(valid)
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


class UnknownTaskError(KopeError):
    code = "unknown_task"

    def __init__(self, task_id: str, valid: Iterable[str]) -> None:
        super().__init__(f"no task {task_id!r}; valid task ids: {_choices(valid)}")


class UnknownFamilyError(KopeError):
    code = "unknown_family"

    def __init__(self, family: str, valid: Iterable[str]) -> None:
        super().__init__(f"no family {family!r}; valid families: {_choices(valid)}")


class UnknownKernelError(KopeError):
    code = "unknown_kernel"

    def __init__(self, kernel_id: str) -> None:
        super().__init__(
            f"no kernel {kernel_id!r}; kernel ids are returned by compile_kernel (they look like 'k-1a2b3c4d5e6f')"
        )


class UnknownSessionError(KopeError):
    code = "unknown_session"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"no session {session_id!r}; omit session_id to start a new one, or pass one returned by compile_kernel"
        )


class UnknownExperienceError(KopeError):
    code = "unknown_experience"

    def __init__(self, item_id: str) -> None:
        super().__init__(
            f"no experience {item_id!r}; ids look like 'k-...' (attempts), 'x-...' (lessons) or 's-...' (sessions)"
        )


class UnknownBackendError(KopeError):
    code = "unknown_backend"

    def __init__(self, backend: str, valid: Iterable[str]) -> None:
        super().__init__(f"no backend {backend!r}; valid backends: {_choices(valid)}")


class SourceTooLargeError(KopeError):
    code = "source_too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the source is {size:,} bytes; the limit is {limit:,} bytes ({limit / 1024:g} KiB): send "
                         "one kernel file")


class RefusedFlagError(KopeError):
    code = "refused_flag"

    def __init__(self, flag: str, reason: str, allowed: str) -> None:
        super().__init__(f"{flag!r} is refused: {reason}. Allowed: {allowed}")


class TaskMismatchError(KopeError):
    code = "task_mismatch"


class NotTestedError(KopeError):
    code = "not_tested"


class NotCompiledError(KopeError):
    code = "not_compiled"


class FailedTestsError(KopeError):
    code = "tests_failed"


class DeterministicUnavailableError(KopeError):
    code = "deterministic_unavailable"


class InvalidTaskError(KopeError):
    """A task folder that cannot be loaded; names the file and the field."""

    code = "invalid_task"


class SandboxUnavailableError(KopeError):
    """No isolation layer works on this machine and the user did not opt out."""

    code = "sandbox_unavailable"


class BuildTamperedError(KopeError):
    """A cached build's library no longer matches the sha256 recorded when it was built."""

    code = "build_tampered"


class TargetUnavailableError(KopeError):
    """The target exists but its toolchain is not installed or does not work here."""

    code = "target_unavailable"


class TaskNotOnTargetError(KopeError):
    """The task has no signature (and no baseline) in that target's language."""

    code = "task_not_on_target"


class NoDeviceError(KopeError):
    """The target compiles here but running or timing needs a device this machine does not have."""

    code = "no_device"


class DeviceUnavailableError(KopeError):
    """The server has a GPU but could not initialise it for this run: the server's fault, not the kernel's; nothing
    of the call is recorded against the kernel."""

    code = "device_unavailable"


class BaselineFailedError(KopeError):
    """The baseline or the reference crashed, failed to load or broke the protocol at the profiling size: the
    server's (or the task's) fault, not the candidate's; nothing of the profile is recorded against the kernel."""

    code = "baseline_failed"


class TargetMismatchError(KopeError):
    code = "target_mismatch"


class EmptySourceError(KopeError):
    code = "empty_source"


class TooLongError(KopeError):
    """A text argument over its documented cap: refused, never silently cut."""

    code = "too_long"

    def __init__(self, argument: str, length: int, cap: int) -> None:
        super().__init__(f"`{argument}` has {length:,} characters; at most {cap:,} are accepted. Shorten it: "
                         "a strategy is a name ('unroll by 4'), a lesson or rationale a paragraph")


MAX_STRATEGY_CHARS = 200  # also opt_layer and hardware: names, not prose
MAX_AGENT_CHARS = 80
MAX_TEXT_CHARS = 4000


def check_length(argument: str, value: str | None, cap: int) -> None:
    if value is not None and len(value) > cap:
        raise TooLongError(argument, len(value), cap)


class ServerStoppingError(KopeError):
    """The server was asked to stop (``kope daemon stop``, a memory command) while the call ran."""

    code = "server_stopping"

    def __init__(self, tool: str) -> None:
        super().__init__(f"the server was asked to stop during {tool}; its run was ended and nothing was recorded: "
                         "call it again (the next call is served by a new server)")


class UnknownDeviceError(KopeError):
    code = "unknown_device"

    def __init__(self, device: str, valid: Iterable[str]) -> None:
        super().__init__(f"no device {device!r}; devices now: {_choices(valid) or 'none'} (list_devices shows them "
                         "with their backends and hardware)")


class DeviceLostError(KopeError):
    """A cluster device stopped answering during a call: its state is unknown, so nothing of the call counts."""

    code = "device_lost"


class CancelledCallError(KopeError):
    """The client cancelled the call (``notifications/cancelled``, or it went away): its runs were ended."""

    code = "cancelled"

    def __init__(self, tool: str) -> None:
        super().__init__(f"{tool} was cancelled by its client; its runs were ended and nothing was recorded")


class HomeUnusableError(KopeError):
    """KOPE_HOME cannot be created or written: nothing can be served from it."""

    code = "home_unusable"
