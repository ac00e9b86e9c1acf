"""The ``kope`` command: serve, tasks, doctor, demo."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Any

from kope_mcp.bench.command import add_bench_parser, run_bench_command

if TYPE_CHECKING:
    pass


def main(argv: list[str] | None = None) -> int:
    import kope_mcp

    parser = argparse.ArgumentParser(prog="kope", description="kope-mcp: an MCP workbench for kernel optimisation.")
    parser.add_argument("--version", action="version", version=f"kope-mcp {kope_mcp.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the MCP server (stdio for Claude Desktop and IDEs, or HTTP)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="http: address to listen on (non-loopback needs a token)")
    serve.add_argument("--port", type=_port, default=8765, help="http: port 0-65535 (0: any free port)")
    serve.add_argument("--token-file", help="http: file holding the bearer token (or set KOPE_TOKEN)")
    serve.add_argument("--allowed-host", action="append", default=[],
                       help="http: a Host header value clients use (required for non-loopback hosts; repeatable)")
    serve.add_argument("--allowed-origin", action="append", default=[], help="http: an allowed Origin (repeatable)")
    serve.add_argument("--no-daemon", action="store_true",
                       help="stdio: own the database in this process instead of sharing the home's daemon")
    serve.add_argument("--cluster", metavar="HOST:PORT",
                       help="also dispatch to the `kope worker` devices of this Ray cluster (sets KOPE_CLUSTER)")
    serve.add_argument("--cluster-token", metavar="FILE",
                       help="the cluster's Ray token file, mode 0600 (sets KOPE_CLUSTER_TOKEN; default "
                            "~/.kope-cluster-token)")
    worker = sub.add_parser("worker", help="join a Ray cluster and offer this machine's devices to its servers")
    worker.add_argument("--cluster", metavar="HOST:PORT", required=True, help="the Ray head's address")
    worker.add_argument("--name", help="this worker's name in device ids (default: the host name)")
    worker.add_argument("--cluster-token", metavar="FILE",
                        help="the cluster's Ray token file, mode 0600 (default: KOPE_CLUSTER_TOKEN, else "
                             "~/.kope-cluster-token)")
    worker.add_argument("--backend", action="append",
                        help="offer only this backend (repeatable; default: every backend that can time kernels here)")
    daemon = sub.add_parser("daemon", help="the process that owns KOPE_HOME's database for all clients")
    daemon.add_argument("action", choices=["status", "stop", "run"],
                        help="status: who owns this home; stop: ask it to exit; run: (internal) become it")
    tasks = sub.add_parser("tasks", help="list the task suite, or show one task")
    tasks.add_argument("action", nargs="?", choices=["show", "add", "import-kernelbench"],
                       help="'show ID' prints one task in full; 'add DIR' checks and installs a task folder; "
                            "'import-kernelbench PATH...' turns KernelBench problem files (or folders) into tasks")
    tasks.add_argument("task_id", nargs="*", help="a task id (show), a task folder (add), problem files (import)")
    tasks.add_argument("--replace", action="store_true", help="replace an installed task of that id")
    tasks.add_argument("--family", help="only this family")
    sub.add_parser("doctor", help="what this machine offers: compilers, OpenMP, ISA, caches, sandbox")
    view = sub.add_parser("view", help="print the address of the memory's page (or an attempt's session) in a browser")
    view.add_argument("kernel_id", nargs="?", help="an attempt ('k-...'): its session's page")
    demo = sub.add_parser("demo", help="play a short optimisation session through MCP against this server")
    demo.add_argument("--backend", choices=["c", "triton", "cuda"], default="c",
                      help="c (this CPU, any machine) or, on a machine with an NVIDIA GPU, triton or cuda")
    add_bench_parser(sub)
    memory = sub.add_parser("memory", help="inspect and move the experience memory under KOPE_HOME")
    memory.add_argument("action", choices=["stats", "show", "export", "import", "recover"],
                        help="recover: a memory that does not open is opened as of its last checkpoint (every file "
                             "kept in a copy)")
    memory.add_argument("target", nargs="?", help="an id for `show`, a .jsonl file for `export`/`import`")
    memory.add_argument("--reverify", action="store_true",
                        help="import: re-measure here every imported win (compile, run_tests and profile each in "
                             "the sandbox) and record the local verdict beside the imported one")
    args = parser.parse_args(argv)
    from kope_mcp.settings import InvalidSettingError, KopeSettings

    try:
        KopeSettings.from_env()  # a wrong KOPE_* value is one line here, not a traceback from deep inside
        return _dispatch(parser, args)
    except InvalidSettingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# The commands that work in the home: an unusable one is one line and exit 2 before anything else (a stdio
# `kope serve` instead answers every call with that line, so the client shows it: app/proxy.py).
USES_HOME = {"memory", "worker", "daemon", "tasks", "view"}


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command in USES_HOME or (args.command == "serve" and (
            args.transport == "http" or args.no_daemon or os.environ.get("KOPE_DAEMON", "on").lower() in
            ("off", "0", "no"))):
        from kope_mcp.errors import KopeError
        from kope_mcp.settings import KopeSettings, check_home

        try:
            check_home(KopeSettings.from_env().home)
        except KopeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.command == "memory":
        if args.reverify and args.action != "import":
            parser.error("--reverify goes with `kope memory import FILE`")
        from kope_mcp.app.cli_memory import memory_command

        return memory_command(args.action, args.target, args.reverify)
    if args.command == "serve":
        if args.cluster:
            os.environ["KOPE_CLUSTER"] = args.cluster
        if args.cluster_token:
            os.environ["KOPE_CLUSTER_TOKEN"] = args.cluster_token
        return _serve(args)
    if args.command == "worker":
        return _worker(args)
    if args.command == "daemon":
        return _daemon(args.action)
    if args.command == "tasks":
        if args.action == "import-kernelbench":
            return _import_kernelbench(args.task_id, args.replace)
        if len(args.task_id) > 1:
            parser.error(f"tasks {args.action or ''}: one task id or folder, got {len(args.task_id)}")
        return _tasks(args.action, args.task_id[0] if args.task_id else None, args.family, args.replace)
    if args.command == "bench":
        return run_bench_command(args)
    if args.command == "doctor":
        return _doctor()
    if args.command == "view":
        return _view(args.kernel_id)
    return _demo(args.backend)


def _worker(args: argparse.Namespace) -> int:
    import socket

    from kope_mcp.errors import KopeError
    from kope_mcp.settings import KopeSettings

    settings = KopeSettings.from_env()
    try:
        from kope_mcp.cluster.config import check_worker_name, token_path
        from kope_mcp.cluster.worker import run_worker

        name = check_worker_name(args.name or "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "-"
                                                      for c in socket.gethostname())[:40])
        token = token_path(args.cluster_token or settings.cluster_token)
        return run_worker(args.cluster, name, settings.home, token, args.backend)
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        print("error: the cluster needs Ray: pip install 'kope-mcp[cluster]'", file=sys.stderr)
        return 2
    except KopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535; 0 picks a free one)")
    return port


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kope_mcp.app import daemon
    from kope_mcp.app.logs import configure_logging
    from kope_mcp.settings import KopeSettings

    configure_logging(args.log_level)
    settings = KopeSettings.from_env()
    from kope_mcp.errors import KopeError
    from kope_mcp.experience.config import load_selection

    try:
        load_selection(settings.selection)
    except KopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.transport == "http":
        from kope_mcp.app.http_server import HttpOptions

        try:
            token = Path(args.token_file).read_text().strip() if args.token_file else os.environ.get("KOPE_TOKEN")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not text"
            print(f"error: cannot read the token file {args.token_file}: {why}", file=sys.stderr)
            return 2
        if args.token_file and not token:
            print(f"error: the token file {args.token_file} is empty; put a long random token in it "
                  "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)", file=sys.stderr)
            return 2
        # Named in a 401 to whoever asks: what kind of token, never where it is kept.
        source = "the token file it was started with" if args.token_file else "the KOPE_TOKEN it was started with"
        if not token:
            from kope_mcp.app.http_server import TOKEN_FILE, home_token

            try:
                settings.home.mkdir(parents=True, exist_ok=True)
                token, made = home_token(settings.home)
            except KopeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            where = settings.home / TOKEN_FILE
            # The token itself never goes to a log: whoever may use it reads the 0600 file.
            print(f"kope-mcp: {'made' if made else 'using'} a bearer token for HTTP clients, kept in {where} (0600); "
                  "clients send 'Authorization: Bearer <its contents>'", file=sys.stderr)
            source = "the token `kope serve` keeps in its home"
        options = HttpOptions(host=args.host, port=args.port, token=token, allowed_hosts=args.allowed_host,
                              allowed_origins=args.allowed_origin, token_source=source)
        return _own_and_serve_http(settings, options, on_demand=False)
    if args.no_daemon or os.environ.get("KOPE_DAEMON", "on").lower() in ("off", "0", "no"):
        from kope_mcp.app.server import build_server

        ownership = daemon.claim(settings.home)
        if ownership is None:
            print(_held_by(settings.home), file=sys.stderr)
            return 2
        ownership.publish(daemon.DaemonState(pid=os.getpid(), url="", token=None, started_at=time.time(),
                                             on_demand=False))
        try:
            build_server(settings).run("stdio")
        finally:
            ownership.release()
        return 0
    from kope_mcp.app.proxy import run_stdio_proxy

    try:
        run_stdio_proxy(settings.home)
    except daemon.DaemonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _held_by(home: Any) -> str:
    from kope_mcp.app import daemon

    state = daemon.read_state(home)
    return (f"error: {home} is already served by {daemon.describe(state) if state else 'another process'}; "
            "connect to it, or stop it with `kope daemon stop`")


def _own_and_serve_http(settings: Any, options: Any, on_demand: bool) -> int:
    """Become the home's owner and serve HTTP; publish where once it is ready, withdraw on exit."""

    from kope_mcp.app import daemon
    from kope_mcp.app.http_server import bind, serve_http
    from kope_mcp.errors import KopeError

    settings.home.mkdir(parents=True, exist_ok=True)
    ownership = daemon.claim(settings.home)
    if ownership is None:
        if on_demand:
            return 0  # another daemon won the race: it serves everyone
        print(_held_by(settings.home), file=sys.stderr)
        return 2
    try:
        options.validate()
        sock = bind(options.host, options.port)
    except KopeError as exc:
        ownership.release()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    host = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{host}:{port}"

    def ready() -> None:
        ownership.publish(daemon.DaemonState(pid=os.getpid(), url=url, token=options.token, started_at=time.time(),
                                             on_demand=on_demand, settings=settings.client_visible()))
        print(f"kope-mcp serving {settings.home} at {url}/mcp (bearer token required)", file=sys.stderr,
              flush=True)

    try:
        serve_http(settings, options, sock, on_ready=ready)
    finally:
        ownership.release()
    return 0


def _daemon(action: str) -> int:
    import secrets

    from kope_mcp.app import daemon
    from kope_mcp.app.http_server import HttpOptions
    from kope_mcp.app.logs import configure_logging
    from kope_mcp.settings import KopeSettings

    settings = KopeSettings.from_env()
    if action == "run":
        configure_logging("INFO")
        from kope_mcp.settings import positive_number

        idle = positive_number("KOPE_DAEMON_IDLE_S", float, "a positive number of seconds", 600.0)
        options = HttpOptions(host="127.0.0.1", port=0, token=secrets.token_urlsafe(32), idle_exit_s=idle,
                              token_source="the on-demand daemon's, which stdio clients of its home read themselves")
        return _own_and_serve_http(settings, options, on_demand=True)
    if action == "stop":
        try:
            stopped = daemon.stop(settings.home)
        except daemon.DaemonError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"stopped pid {stopped.pid}" if stopped else f"nothing serves {settings.home}")
        return 0
    state = daemon.running(settings.home)
    print(daemon.describe(state) if state else f"nothing serves {settings.home}")
    return 0 if state else 1


def _view(kernel_id: str | None) -> int:
    """The page's address on the home's daemon (started if none runs), its token in the fragment: a browser keeps
    a fragment to itself, so the token reaches the daemon only in the page's own requests' headers."""
    from urllib.parse import quote

    from kope_mcp.app import daemon
    from kope_mcp.app.http_server import VIEW_PREFIX
    from kope_mcp.settings import KopeSettings

    home = KopeSettings.from_env().home
    try:
        state = daemon.ensure(home)
    except daemon.DaemonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not state.url or not state.token:
        print(f"error: {home} is served by a process without HTTP (`kope serve --no-daemon`, pid {state.pid}); "
              "its pages are there only while a daemon or `kope serve --transport http` serves it", file=sys.stderr)
        return 1
    base = state.url.split("/mcp", 1)[0].rstrip("/")
    where = f"session/{quote(kernel_id, safe='')}" if kernel_id else "memory"
    print(f"{base}{VIEW_PREFIX}{where}#token={state.token}")
    print("(the address carries the home's token: open it yourself, do not paste it anywhere else)", file=sys.stderr)
    return 0


def _tasks(action: str | None, task_id: str | None, family: str | None, replace: bool = False) -> int:
    from pathlib import Path

    from kope_mcp.errors import KopeError
    from kope_mcp.settings import KopeSettings
    from kope_mcp.tasks.registry import TaskRegistry

    settings = KopeSettings.from_env()
    if action == "add":
        from kope_mcp.services.task_admin import add_task

        if not task_id:
            print("usage: kope tasks add DIR [--replace]", file=sys.stderr)
            return 2
        try:
            added = add_task(settings, Path(task_id), replace)
        except KopeError as exc:
            print(exc, file=sys.stderr)
            return 2
        print(f"{'replaced' if added.replaced else 'added'} task {added.task_id}: {added.prototype}\n"
              f"its baseline passed its {added.baseline_cases_passed} cases; installed at {added.installed_at}")
        print(SERVED_NEXT_CALL)
        return 0
    registry = TaskRegistry.default(settings.home)
    for problem in registry.problems:
        print(f"warning: {problem}", file=sys.stderr)
    try:
        if action == "show":
            if not task_id:
                print("usage: kope tasks show TASK_ID", file=sys.stderr)
                return 2
            _print_task(registry.get(task_id))
            return 0
        found = registry.list(family)
    except KopeError as exc:
        print(exc, file=sys.stderr)
        return 2
    width = max([14, *(len(t.id) for t in found)])
    print(f"{'id':<{width}} {'family':<14} {'lvl':<3} summary")
    for t in found:
        print(f"{t.id:<{width}} {t.spec.family:<14} {t.spec.level:<3} {t.spec.summary}")
    print(f"\n{len(found)} task(s). `kope tasks show ID` prints one in full.")
    return 0


def _import_kernelbench(paths: list[str], replace: bool) -> int:
    from pathlib import Path

    from kope_mcp.services.kernelbench_import import import_kernelbench
    from kope_mcp.settings import KopeSettings

    if not paths:
        print("usage: kope tasks import-kernelbench PATH... [--replace]  (problem files or folders of them)",
              file=sys.stderr)
        return 2
    report = import_kernelbench(KopeSettings.from_env(), [Path(p) for p in paths], replace)
    for done in report.imported:
        print(f"{'replaced' if done.replaced else 'imported'} {done.task_id} from {done.source}: scaled "
              f"{done.scale}, {done.cases} cases, tolerance {done.tolerance:g}\n    {done.prototype}")
    for skipped in report.skipped:
        print(f"skipped {skipped.source}: {skipped.reason}", file=sys.stderr)
    print(f"{len(report.imported)} imported, {len(report.skipped)} skipped")
    if report.imported:
        print(SERVED_NEXT_CALL)
    return 0 if report.imported or not report.skipped else 1


SERVED_NEXT_CALL = ("running servers of this home (the daemon included) serve it from their next call, within a "
                    "second; no restart needed")


def _print_task(task: Any) -> None:
    spec = task.spec
    print(f"# {spec.id} ({spec.family}, level {spec.level})\n\n{spec.description.strip()}\n")
    print(f"Prototype:\n    {spec.prototype};\n")
    print("Cases: " + "; ".join(f"{c.name} {c.sizes}" for c in spec.cases))
    print(f"Profile: {spec.profile.name} {spec.profile.sizes}")
    print("Tolerance: " + ", ".join(f"{d} atol={t.atol:g} rtol={t.rtol:g}" for d, t in spec.tolerance.items()))
    print(f"FLOPs: {spec.flops}   bytes: {spec.bytes}\n")
    print("Rules:\n" + "\n".join(textwrap.fill(r, 100, initial_indent="  - ", subsequent_indent="    ")
                                  for r in spec.all_rules()))
    print(f"\nReference (Python):\n{textwrap.indent(task.reference_source, '    ')}")
    if task.baseline_source is None:
        print("Baseline: none (speedups are measured against the reference)")
    else:
        print(f"Baseline (C):\n{textwrap.indent(task.baseline_source, '    ')}")


def _doctor() -> int:
    from kope_mcp.hardware import detect_hardware, probe_compiler
    from kope_mcp.runtime.sandbox import UNSAFE_ENV, capabilities, unsafe_opt_out
    from kope_mcp.settings import KopeSettings

    settings = KopeSettings.from_env()
    hw = detect_hardware()
    print("kope doctor\n")
    print(f"CPU        {hw.cpu_model} ({hw.arch}), {hw.cores} logical CPU(s) available")
    print(f"ISA        {' '.join(hw.isa) or '(none detected)'}")
    print("Caches     " + ", ".join(f"L{c.level} {c.type} {c.size_kib} KiB" for c in hw.caches))
    print(f"Hardware   {hw.key}")
    working = 0
    for name in dict.fromkeys([settings.compiler, "gcc", "clang"]):
        info = probe_compiler(name)
        if info.path is None:
            print(f"Compiler   {name}: not found")
            continue
        working += info.version is not None
        print(f"Compiler   {name}: {info.version or 'does not run'} at {info.path}; "
              f"OpenMP {'yes' if info.openmp else 'no'}" + ("  (used by the c backend)" if name == settings.compiler
                                                           else ""))
    caps = capabilities()
    if caps.isolated:
        print(f"Sandbox    isolated ({caps.mode}): every compile and run in its own sandbox")
    elif unsafe_opt_out():
        print(f"Sandbox    NOT ISOLATED, and {UNSAFE_ENV}=1: kernels run with this user's rights")
    else:
        print(f"Sandbox    NOT AVAILABLE: compile_kernel, run_tests and profile_kernel refuse (sandbox_unavailable)."
              f"\n           missing: {caps.missing}")
    for layer in caps.layers:
        print(f"           {'active ' if layer.active else 'MISSING'}  {layer.name}: {layer.detail}")
    from kope_mcp.targets.registry import load_targets

    targets = load_targets(settings)
    for name, target in targets.items():
        status = target.status()
        can = [w for w, on in (("compile", status.compile), ("run", status.run), ("profile", status.profile)) if on]
        print(f"Target     {name} ({target.language}): {status.summary}; {', '.join(can) or 'unavailable'}")
        if status.why_not:
            print(f"           {'not available' if not status.compile else 'limits'}: {status.why_not}")
        for detail in status.details:
            print(f"           {detail}")
        print(f"           hardware key {target.hardware().key}")
    from kope_mcp.targets.gpu import check_device_in_sandbox, detect_gpu

    if detect_gpu() is not None and caps.isolated:
        works, detail = check_device_in_sandbox(settings)
        print(f"GPU run    {'works' if works else 'FAILS (device_unavailable)'}: GPU {settings.gpu} (KOPE_GPU): "
              f"{detail}")
    from kope_mcp.errors import HomeUnusableError
    from kope_mcp.settings import check_home

    try:
        check_home(settings.home, create=False)
        unusable = None
        print(f"KOPE_HOME  {settings.home}")
    except HomeUnusableError as exc:
        unusable = str(exc)
        print(f"KOPE_HOME  {settings.home}: UNUSABLE\n           {unusable}")
    from kope_mcp.runtime.sandbox_files import scratch_root

    runs = scratch_root(settings.scratch_dir)
    print(f"Scratch    {runs}: " + ("the home's own; a run's mount table shows this path (no tmpfs or temporary folder "
                                    "with 1 GiB free)" if runs == settings.scratch_dir else
                                    "a run's mount table names this folder, not the home or the server"))
    if unusable is not None:
        print(f"\nNothing can be served from this home: {unusable}", file=sys.stderr)
        return 1
    c_target = targets.get("c")
    if c_target is not None and not c_target.status().compile:
        # The default backend: a server whose `c` cannot compile fails most calls a client makes.
        print(f"\nThe c backend cannot compile: {c_target.status().why_not}. Install gcc (Debian/Ubuntu: "
              "apt-get install gcc) or point KOPE_CC at a working C compiler.", file=sys.stderr)
        return 1
    if not any(t.status().compile for t in targets.values()):
        print("\nNo backend can compile on this machine.", file=sys.stderr)
        return 1
    return 0


def _demo(backend: str) -> int:
    from kope_mcp.app.demo import run_demo

    return run_demo(backend)
