"""Rule 23 against the real `fastmcp-tasks` (Docket on a real redis-server): a keyed
task-augmented call under `IdempotencyMiddleware` creates one task, a re-send gets the same task
(marked replayed), other arguments are -32011, and the re-send's task id resolves through
`tasks/get` to the one execution's result. Then the body against a Docket redelivery, with
the worker a process of its own (`tasks_server.py`, over streamable HTTP) SIGKILLed at an exact
point and a second server process's worker taking the execution over: killed after the body
returned (its result stored) before Docket completed the execution, the redelivery replays it
(one ledger line, the task completed with it); killed mid-body after its effect, the
redelivery finds the body's record UNKNOWN (-32012, the task failed, one ledger line) and
`mcp-once keys settle` settles it. Without the fence both redeliveries run the body again.
Last, two replicas (`tasks_server.py` as frontends) behind a local nginx, round-robin, with the
bodies in a Docket worker process of their own: a keyed call whose `CreateTaskResult` is lost
(`orchestrator.chaos`), re-sent so that it provably lands on the other replica (nginx's access
log and each replica's own log of the requests it answered), gets the same task; one task, one
line in the fsynced ledger (written by the worker process), and `tasks/get` on the replica that
did not create the task answers its result. Then the same through `mcp-once proxy --listen`
(the CLI process) on the redis-server in front of `tasks_server.py` WITHOUT mcp-once (a plain
upstream, its bodies in a worker process): the lost `CreateTaskResult` re-sent through the proxy
gets the same task, replayed; one Docket run, one ledger line; `tasks/get` through the proxy
answers the result (`--proxy-pass-through`: only that check, the proxy passing `deploy`
through, which must fail it).

fastmcp-tasks 4.1.6 is not on PyPI, so this runs in the suite's environment with the sdist's
`fastmcp_tasks/` on the path (as `run.py` does; `--source` as there, filled by `run.py`):

    cd tests/envs/fastmcp-suite && uv sync --frozen
    uv run --frozen python tasks_check.py [--source /tmp/fastmcp-4.1.6] [--proxy-pass-through]

Exit status 0 when every check holds; each check's outcome is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

KEY = "check-1"
#: tests/, for the suite's nginx harness (`nginx_server.NginxServer`, the deployed location block).
TESTS = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def check(url: str) -> list[tuple[str, bool, str]]:
    from fastmcp import Client, FastMCP
    from fastmcp_tasks import TasksExtension

    from idempotency import open_store, wire
    from idempotency.fastmcp import IdempotencyMiddleware

    effects: list[str] = []
    server: FastMCP[Any] = FastMCP("works")
    store = open_store(f"{url}?prefix=keys:")
    server.add_middleware(IdempotencyMiddleware(store))
    server.add_extension(TasksExtension(url=url, name="works-check"))

    @server.tool(task=True)
    async def deploy(env: str) -> str:
        effects.append(env)
        return f"deployed {env}"

    def status(answer: Any) -> str | None:
        return ((answer.meta or {}).get(wire.IDEMPOTENCY_META) or {}).get("status")

    meta = {wire.KEY_META: KEY}
    args = {"env": "prod"}
    async with Client(server) as client:
        session = client.session
        first = await session.call_tool("deploy", args, meta=meta, allow_claimed=True)
        again = await session.call_tool("deploy", args, meta=meta, allow_claimed=True)
        # The claim's resolver polls tasks/get for the (replayed) task to its result.
        resolved = await client.call_tool("deploy", args, meta=meta)
        try:
            await session.call_tool("deploy", {"env": "staging"}, meta=meta, allow_claimed=True)
            refused = None
        except Exception as exc:  # the JSON-RPC error
            refused = getattr(getattr(exc, "error", None), "code", None)
    await store.aclose()
    return [
        refusal(),
        ("one task for the key", first.task_id == again.task_id, f"{first.task_id[:12]}…"),
        (
            "executed, then replayed",
            [status(first), status(again)] == ["executed", "replayed"],
            f"{status(first)}, {status(again)}",
        ),
        (
            "the replayed task resolves to the one execution",
            effects == ["prod"] and resolved.data == "deployed prod",
            f"effects={effects}",
        ),
        ("other arguments: -32011", refused == wire.KEY_REUSED, f"{refused}"),
    ]


def refusal() -> tuple[str, bool, str]:
    """A `fastmcp-tasks` whose bodies the middleware cannot fence is refused when it is built."""
    from fastmcp_tasks import components

    from idempotency import MemoryKeyStore
    from idempotency.fastmcp import IdempotencyMiddleware

    installed = components.reentrant_task_fn
    del components.reentrant_task_fn
    try:
        IdempotencyMiddleware(MemoryKeyStore())
        detail = "built"
    except RuntimeError as exc:
        detail = str(exc)
    finally:
        components.reentrant_task_fn = installed
    return (
        "no reentrant_task_fn: the middleware refuses",
        "reentrant_task_fn" in detail,
        detail[:60] + "…",
    )


def serve(port: int, env: dict[str, str], *, wait: bool = True) -> subprocess.Popen[bytes]:
    """`tasks_server.py` on `port` (its Docket worker inside), once it accepts connections
    (`wait=False`: at once, for processes started side by side)."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("tasks_server.py")), str(port)],
        env={**os.environ, **env},
    )
    if wait:
        wait_for_port(port, process)
    return process


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until `process` listens on `port` (raises if it exits first, or after 90 s: a server
    process imports FastMCP and Docket, which took over 30 s with three starting at once on a
    loaded 2-core machine)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited ({process.returncode})") from None
            anyio.run(anyio.sleep, 0.05)
    raise RuntimeError(f"{process.args}: nothing listening on {port}")


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def keys(*args: str) -> str:
    """`mcp-once keys ARGS` (this environment's mcp-once, the working tree's)."""
    command = [str(Path(sys.executable).with_name("mcp-once")), "keys", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mcp-once keys {args[0]}: exit {done.returncode}: {done.stderr}")
    return done.stdout


def redelivery(url: str, folder: Path, kill: str) -> list[tuple[str, bool, str]]:
    """A keyed task whose worker process SIGKILLs itself at `kill`; the next server process's
    worker gets the execution from Docket."""
    from fastmcp import Client
    from fastmcp.client.client import CallToolResult

    from idempotency import wire

    ledger = folder / f"ledger-{kill}"
    env = {
        "TASKS_CHECK_REDIS": url,
        "TASKS_CHECK_DOCKET": f"works-{kill}",
        "TASKS_CHECK_LEDGER": str(ledger),
        "TASKS_CHECK_GO": str(folder / f"go-{kill}"),
        "PYTHONPATH": os.pathsep.join([*sys.path[:1], os.environ.get("PYTHONPATH", "")]),
    }
    meta = {wire.KEY_META: f"redelivery-{kill}"}
    args = {"env": "prod"}
    port = free_port()
    first = serve(port, {**env, "TASKS_CHECK_KILL": kill})

    async def create() -> str:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            task = await client.session.call_tool("deploy", args, meta=meta, allow_claimed=True)
            return str(task.task_id)

    try:
        task_id = anyio.run(create)
        Path(env["TASKS_CHECK_GO"]).touch()
        killed = first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    effects_at_kill = lines(ledger)
    port = free_port()
    second = serve(port, env)

    async def resolve() -> tuple[str, CallToolResult]:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            again = await client.session.call_tool("deploy", args, meta=meta, allow_claimed=True)
            # The claim's resolver polls tasks/get to the task's end: its result, or for a
            # failed task its JSON-RPC error as an error result.
            with anyio.fail_after(60):
                outcome = await client.call_tool("deploy", args, meta=meta, raise_on_error=False)
            return str(again.task_id), outcome

    try:
        again, outcome = anyio.run(resolve)
    finally:
        second.terminate()
        second.wait()
    checks = [
        (
            f"[{kill}] the worker process SIGKILLed",
            killed == -9 and effects_at_kill == 1,
            f"exit {killed}, {effects_at_kill} ledger line",
        ),
        (f"[{kill}] the re-send gets the same task", again == task_id, f"{task_id[:12]}…"),
    ]
    text = " ".join(getattr(block, "text", "") for block in outcome.content)
    if kill == "completed":
        data = outcome.data
        return [
            *checks,
            (
                "[completed] the redelivered body replays, not runs again",
                lines(ledger) == 1 and data == "deployed prod",
                f"{lines(ledger)} ledger line(s), {data!r}",
            ),
        ]
    store = f"{url}?prefix=keys:"
    unknown = json.loads(keys("list", "--state", "unknown", "--json", "--store", store) or "[]")
    names = [row["key"] for row in unknown if str(row.get("tool", "")).endswith("#task-body")]
    if len(names) == 1:
        keys("settle", names[0], "--result-text", "deployed prod", "--store", store)
    settled = json.loads(keys("list", "--state", "completed", "--json", "--store", store) or "[]")
    return [
        *checks,
        (
            "[effect] the redelivered body is OUTCOME_UNKNOWN, not run again",
            lines(ledger) == 1 and outcome.is_error and "outcome of the call" in text,
            f"{lines(ledger)} ledger line(s), {text[:60]!r}…",
        ),
        (
            "[effect] mcp-once keys settle settles the body's record",
            len(names) == 1 and any(row["key"] == names[0] for row in settled),
            f"{len(names)} UNKNOWN body record(s)",
        ),
    ]


def worker_process(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`tasks_server.py`'s Docket worker as a process of its own (fastmcp-tasks' worker CLI)."""
    command = [sys.executable, "-m", "fastmcp_tasks.worker_cli", "worker", "tasks_server.py"]
    with log.open("ab") as sink:
        return subprocess.Popen(
            command,
            env={**os.environ, **env},
            cwd=Path(__file__).parent,
            stdout=sink,
            stderr=sink,
        )


def arrivals(path: Path) -> list[dict[str, Any]]:
    """A replica's own log: one JSON object per request it answered."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines()]


def replicas(url: str, folder: Path) -> list[tuple[str, bool, str]]:
    """Two frontends behind nginx, one worker process: the lost creation re-sent on the other
    replica gets the same task; `tasks/get` there answers the task's result."""
    sys.path.insert(0, str(TESTS))
    from fastmcp import Client
    from fastmcp_tasks.client import _send_get
    from nginx_server import NginxServer, nginx_binary
    from redis import Redis

    from idempotency import wire
    from orchestrator.chaos import Chaos, Fault, FaultPlan
    from orchestrator.fastmcp import SDKStreamTransport

    binary = nginx_binary()
    if binary is None:
        return [("[replicas] nginx is installed", False, "no nginx on PATH or in /usr/sbin")]
    ledger = folder / "ledger-replicas"
    env = {
        "TASKS_CHECK_REDIS": url,
        "TASKS_CHECK_DOCKET": "works-replicas",
        "TASKS_CHECK_LEDGER": str(ledger),
        "PYTHONPATH": os.pathsep.join([*sys.path[1:2], os.environ.get("PYTHONPATH", "")]),
    }
    meta = {wire.KEY_META: "replicas-1"}
    args = {"env": "prod"}
    worker = worker_process(env, folder / "worker.log")
    ports = [free_port(), free_port()]
    logs = [folder / f"arrivals-{n}" for n in range(2)]
    frontends: list[subprocess.Popen[bytes]] = []
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"deploy"}), seed=44)
    try:
        for port, log in zip(ports, logs, strict=True):
            frontend = {"TASKS_CHECK_CONCURRENCY": "0", "TASKS_CHECK_ARRIVALS": str(log)}
            frontends.append(serve(port, {**env, **frontend}, wait=False))
        for port, process in zip(ports, frontends, strict=True):
            wait_for_port(port, process)
        upstreams = [f"127.0.0.1:{port}" for port in ports]
        with NginxServer(binary, upstreams) as nginx:

            async def logged(count: int) -> list[str]:
                """The upstream of each request nginx logged, once it has logged `count`."""
                with anyio.fail_after(30):
                    while len(requests := nginx.requests()) < count:  # noqa: ASYNC110
                        await anyio.sleep(0.02)  # (nginx, another process, writes the log)
                return [request.upstreams[-1] for request in requests]

            async def landed(method: str, since: int) -> str:
                """The upstream of the first `method` request nginx logged after `since`."""

                def of(method: str) -> list[Any]:
                    return [r for r in nginx.requests()[since:] if f'"{method}"' in r.body]

                with anyio.fail_after(30):
                    while not (found := of(method)):  # noqa: ASYNC110
                        await anyio.sleep(0.02)  # (nginx, another process, writes the log)
                return found[0].upstreams[-1]

            async def after(upstream: str, client: Client[Any]) -> None:
                """Until the last request nginx logged went to `upstream`: round-robin then sends
                the next one to the other replica (pings, themselves round-robin, in between)."""
                for _ in range(len(ports) + 1):
                    seen = await logged(len(nginx.requests()))
                    if seen[-1] == upstream:
                        return
                    await client.ping()
                    await logged(len(seen) + 1)
                raise RuntimeError(f"nginx did not alternate: {seen}")

            async def run() -> tuple[str, str, str, Any, str]:
                transport = SDKStreamTransport(lambda: chaos.wrap(nginx.url))
                async with Client(transport) as client:
                    count = len(nginx.requests())
                    try:
                        with anyio.fail_after(5):
                            await client.session.call_tool(
                                "deploy", args, meta=meta, allow_claimed=True
                            )
                        lost = "answered"
                    except TimeoutError:
                        lost = "lost"
                    # The lost call's request, once nginx logged it (the replica answered).
                    creator = await landed("tools/call", count)
                    await after(creator, client)
                    count = len(nginx.requests())
                    again = await client.session.call_tool(
                        "deploy", args, meta=meta, allow_claimed=True
                    )
                    resent = await landed("tools/call", count)
                    task_id = str(again.task_id)
                    with anyio.fail_after(60):
                        # Polling tasks/get is the protocol's way to wait (SEP-2663).
                        while (await _send_get(client.session, task_id)).status != "completed":  # noqa: ASYNC110
                            await anyio.sleep(0.05)
                    await after(creator, client)
                    count = len(nginx.requests())
                    got = await _send_get(client.session, task_id)
                    getter = await landed("tasks/get", count)
                    status = ((again.meta or {}).get(wire.IDEMPOTENCY_META) or {}).get("status")
                    return lost, creator, resent, (task_id, status, got), getter

            lost, creator, resender, (task_id, status, got), getter = anyio.run(run)
    finally:
        for process in [*frontends, worker]:
            process.terminate()
            process.wait()
    # One Docket execution (a "runs" hash per task) on the shared queue: one task, not two.
    runs = list(Redis.from_url(url).scan_iter(f"{env['TASKS_CHECK_DOCKET']}:runs:*"))
    where = {f"127.0.0.1:{port}": n for n, port in enumerate(ports)}
    own = [[e for e in arrivals(log) if e["method"] == "tools/call"] for log in logs]
    first, second = where.get(creator), where.get(resender)
    text = "".join(c.get("text", "") for c in (got.result or {}).get("content", []))
    effects = ledger.read_text(encoding="utf-8").split() if ledger.exists() else []
    return [
        ("[replicas] the first CreateTaskResult lost", lost == "lost", lost),
        (
            "[replicas] the re-send reached the other replica (nginx's log)",
            None not in (first, second) and first != second,
            f"created on {first}, re-sent to {second}",
        ),
        (
            "[replicas] ... and each replica's own log",
            first is not None
            and second is not None
            and [e["task"] for e in own[first]] == [task_id]
            and [e["task"] for e in own[second]] == [task_id],
            f"replica {first}: {own[first] if first is not None else '?'}; "
            f"replica {second}: {own[second] if second is not None else '?'}",
        ),
        ("[replicas] the re-send gets the same task, replayed", status == "replayed", task_id),
        (
            "[replicas] one task, one effect (by the worker process)",
            len(runs) == 1 and effects == ["prod", str(worker.pid)],
            f"{len(runs)} Docket run(s), ledger {effects}, worker pid {worker.pid}",
        ),
        (
            "[replicas] tasks/get on the other replica answers the result",
            where.get(getter) == second and got.status == "completed" and text == "deployed prod",
            f"replica {where.get(getter)}: {got.status}, {text!r}",
        ),
    ]


def proxied(url: str, folder: Path, *, guard: bool = True) -> list[tuple[str, bool, str]]:
    """`mcp-once proxy --listen` (the CLI, a process of its own) in front of `tasks_server.py`
    unguarded (no mcp-once in it, its bodies in a Docket worker process): a keyed creation whose
    `CreateTaskResult` is lost, re-sent by `RetryingSession` through the proxy, gets the same task
    (replayed); one Docket run, one ledger line; `tasks/get` through the proxy answers the result.
    `guard=False` (`--proxy-pass-through`) runs the proxy with a policy that passes `deploy`
    through, to see these checks fail when the proxy guards nothing."""
    import fastmcp_tasks
    from mcp import Client
    from redis import Redis

    from idempotency import wire
    from orchestrator import RetryingSession, RetryPolicy, TaskCreated, TasksExtension
    from orchestrator.chaos import Chaos, Fault, FaultPlan

    ledger = folder / "ledger-proxied"
    env = {
        "TASKS_CHECK_REDIS": url,
        "TASKS_CHECK_DOCKET": "works-proxied",
        "TASKS_CHECK_LEDGER": str(ledger),
        "TASKS_CHECK_PLAIN": "1",
        # The sdist's folder that holds `fastmcp_tasks/` (main() put it on the path).
        "PYTHONPATH": os.pathsep.join(
            [str(Path(fastmcp_tasks.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    worker = worker_process(env, folder / "worker-proxied.log")
    port, listen = free_port(), free_port()
    upstream = serve(port, {**env, "TASKS_CHECK_CONCURRENCY": "0"}, wait=False)
    command = [
        str(Path(sys.executable).with_name("mcp-once")),
        "proxy",
        "--listen",
        f"127.0.0.1:{listen}",
        "--store",
        f"{url}?prefix=proxy:",
        "--upstream",
        f"http://127.0.0.1:{port}/mcp",
    ]
    if not guard:
        policy = folder / "pass-through.toml"
        policy.write_text('[tools."deploy"]\nguard = false\n', encoding="utf-8")
        command += ["--policy", str(policy)]
    processes = [worker, upstream]
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"deploy"}), seed=44)
    # The pass-through proxy lists `deploy` as a plain tool: the override re-sends it anyway.
    policy = RetryPolicy(attempt_timeout=5, overrides={} if guard else {"deploy": "idempotent"})

    def connect() -> Client:
        return Client(chaos.wrap(f"http://127.0.0.1:{listen}/mcp"), extensions=[TasksExtension()])

    async def run() -> tuple[Any, Any, str]:
        async with RetryingSession(connect=connect, policy=policy) as session:
            created = await session.create_task("deploy", {"env": "prod"}, idempotency_key="px-1")
            report = session.last_report
            assert isinstance(created, TaskCreated), created
            with anyio.fail_after(60):
                result = await session.task_result(created.task_id)
            text = " ".join(getattr(block, "text", "") for block in result.content)
            return created, report, text

    try:
        wait_for_port(port, upstream)
        with (folder / "proxy.log").open("ab") as log:
            proxy = subprocess.Popen(command, stdout=log, stderr=log)
        processes.append(proxy)
        wait_for_port(listen, proxy)
        created, report, text = anyio.run(run)
    finally:
        for process in processes:
            process.terminate()
            process.wait()
    runs = list(Redis.from_url(url).scan_iter(f"{env['TASKS_CHECK_DOCKET']}:runs:*"))
    effects = ledger.read_text(encoding="utf-8").split() if ledger.exists() else []
    status = ((created.meta or {}).get(wire.IDEMPOTENCY_META) or {}).get("status")
    lost = [record.kind for record in chaos.faults]
    return [
        (
            "[proxy] the first CreateTaskResult lost, re-sent with the key",
            lost == [Fault.LOST_ACK] and report is not None and len(report.attempts) == 2,
            f"faults {[str(f) for f in lost]}, {len(report.attempts) if report else '?'} attempts",
        ),
        (
            "[proxy] the re-send gets the same task, replayed",
            status == "replayed" and report is not None and report.replayed,
            f"{created.task_id[:12]}…, {status}",
        ),
        (
            "[proxy] one task, one effect (by the worker process)",
            len(runs) == 1 and effects == ["prod", str(worker.pid)],
            f"{len(runs)} Docket run(s), ledger {effects}, worker pid {worker.pid}",
        ),
        (
            "[proxy] tasks/get through the proxy answers the result",
            text == "deployed prod",
            repr(text),
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path("/tmp/fastmcp-4.1.6"))
    parser.add_argument(
        "--proxy-pass-through",
        action="store_true",
        help="only the proxy check, with `deploy` passed through: its checks must fail",
    )
    options = parser.parse_args()
    tasks = options.source / "fastmcp_tasks"
    if not tasks.is_dir():
        print(f"no {tasks}: run `python run.py` once (it unpacks the sdist there)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(tasks))
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server is not on PATH", file=sys.stderr)
        return 2
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        redis = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder],
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, redis)
            url = f"redis://127.0.0.1:{port}/0"
            if options.proxy_pass_through:
                results = proxied(url, Path(folder), guard=False)
            else:
                results = anyio.run(check, url)
                for kill in ("completed", "effect"):
                    results += redelivery(url, Path(folder), kill)
                results += replicas(url, Path(folder))
                results += proxied(url, Path(folder))
        finally:
            redis.terminate()
            redis.wait()
    for name, held, detail in results:
        print(f"{'ok  ' if held else 'FAIL'} {name} ({detail})")
    return 0 if all(held for _, held, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
