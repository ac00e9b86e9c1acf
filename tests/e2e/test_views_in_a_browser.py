"""The views where they run: a real session through a real daemon, its pages in headless Chromium (Playwright),
once as an MCP Apps host shows them (a sandboxed iframe fed by postMessage) and once opened from the daemon in a
browser (`kope view`). Each check reads what the page drew against the session's own data."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from kope_mcp.app import daemon
from tests.transports import http_client

pytestmark = pytest.mark.slow
playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium)", allow_module_level=True)
# Where the README's pictures are written (KOPE_SCREENSHOTS=docs/img); otherwise the test's own folder.
SHOTS = os.environ.get("KOPE_SCREENSHOTS")
# What a host's iframe gets: scripts, nothing else (no same origin, no network of its own).
HOST = """<!doctype html><html><body style="margin:0"><iframe id="view" sandbox="allow-scripts"
style="width:700px;height:900px;border:0"></iframe><script>
const frame = document.getElementById("view");
window.kopeHost = { initialized: false, reads: [], refused: [] };
window.addEventListener("message", (event) => {
  if (event.source !== frame.contentWindow) return;
  const m = event.data, send = (reply) => frame.contentWindow.postMessage({ jsonrpc: "2.0", ...reply }, "*");
  if (m.method === "ui/initialize") {
    send({ id: m.id, result: { protocolVersion: m.params.protocolVersion, hostInfo: { name: "test-host",
      version: "1" }, hostCapabilities: { serverResources: {} }, hostContext: { theme: "light" } } });
  } else if (m.method === "ui/notifications/initialized") {
    window.kopeHost.initialized = true;
    send({ method: "ui/notifications/tool-result", params: window.kopeResult });
  } else if (m.method === "resources/read") {
    window.kopeHost.reads.push(m.params.uri);
    const text = window.kopeResources[m.params.uri];
    if (text === undefined) { window.kopeHost.refused.push(m.params.uri);
      send({ id: m.id, error: { code: -32602, message: "unknown resource" } }); }
    else send({ id: m.id, result: { contents: [{ uri: m.params.uri, mimeType: "application/json", text }] } });
  }
});
</script></body></html>"""


async def a_session(home: Path) -> dict[str, Any]:
    """A small real session: the baseline, a child that compiles and is profiled, one that does not compile; a
    verified lesson, an unverified one; then the question the experience view shows."""
    async with http_client(home, "view-test") as client:
        task = (await client.call_tool("get_task", {"task_id": "vector_add"})).structured_content
        base = task["baseline_source"]
        first = (await client.call_tool("compile_kernel", {"task_id": "vector_add", "source": base,
                                                            "strategy": "the baseline as given"})).structured_content
        session, k1 = first["session_id"], first["kernel_id"]
        faster = base.replace("for", "#pragma omp simd\n    for", 1)
        k2 = (await client.call_tool("compile_kernel", {
            "task_id": "vector_add", "source": faster, "session_id": session, "parent_id": k1,
            "strategy": "omp simd on the loop", "flags": ["-fopenmp-simd"]})).structured_content["kernel_id"]
        k3 = (await client.call_tool("compile_kernel", {
            "task_id": "vector_add", "source": base.replace("{", "{ int broken = ;", 1), "session_id": session,
            "parent_id": k1, "strategy": "a typo"})).structured_content["kernel_id"]
        profiles = []
        for kernel in (k1, k2):
            assert not (await client.call_tool("run_tests", {"kernel_id": kernel})).is_error
            profiles.append((await client.call_tool("profile_kernel", {"kernel_id": kernel})).structured_content)
        await client.call_tool("record_experience", {"strategy": "omp simd on the loop", "kernel_id": k2,
                                                     "session_id": session, "lesson": "simd on a stream: memory "
                                                     "bound, little to gain"})
        await client.call_tool("record_experience", {"strategy": "unrolling", "task_id": "vector_add",
                                                     "lesson": "unrolling by 4 should help (untested)"})
        query = (await client.call_tool("query_experience", {"query": "make vector_add faster",
                                                             "task_id": "vector_add"})).structured_content
        views = {uri: (await client.read_resource(uri)).contents[0].text
                 for uri in ("ui://kope/session.html", "ui://kope/experience.html")}
        uri = f"kope://attempts/{k2}/session"
        session_json = (await client.read_resource(uri)).contents[0].text
        history = (await client.read_resource("kope://memory/history.json")).contents[0].text
    return {"kernels": [k1, k2, k3], "profile": profiles[-1], "query": query, "views": views,
            "session_uri": uri, "session": json.loads(session_json), "session_json": session_json,
            "history": json.loads(history)}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = tmp_path_factory.mktemp("views") / "home"
    saved = {k: os.environ.get(k) for k in ("KOPE_HOME", "KOPE_EMBEDDINGS", "KOPE_PROFILE_S")}
    os.environ.update(KOPE_HOME=str(home), KOPE_EMBEDDINGS="off", KOPE_PROFILE_S="0.3")
    try:
        data = anyio.run(a_session, home)
        state = daemon.running(home)
        assert state is not None and state.token
        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            try:
                yield {**data, "browser": browser, "url": state.url.rstrip("/"), "token": state.token}
            finally:
                browser.close()
    finally:
        daemon.stop(home)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def shot(page: Any, name: str, tmp_path: Path) -> None:
    page.screenshot(path=str(Path(SHOTS or tmp_path) / name), full_page=True)


def in_host(served: Any, view: str, result: dict[str, Any], resources: dict[str, str]) -> tuple[Any, Any, list[str]]:
    """The view as an MCP Apps host shows it: its HTML (as resources/read gave it) in a sandboxed iframe, the
    tool's result sent once it says it is initialized, its resource reads answered from the session's data."""
    page = served["browser"].new_page(viewport={"width": 720, "height": 920})
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda message: print("view:", message.text))
    page.on("pageerror", lambda error: print("view error:", error))
    page.set_content(HOST)
    page.evaluate("([result, resources]) => { window.kopeResult = result; window.kopeResources = resources; }",
                  [{"content": [], "structuredContent": result}, resources])
    page.evaluate("html => { document.getElementById('view').srcdoc = html; }", served["views"][view])
    frame = page.frame_locator("#view")
    page.wait_for_function("window.kopeHost.initialized", timeout=15_000)
    return page, frame, requests


def test_the_session_view_in_a_host_draws_the_sessions_curve_tree_and_roof(served: Any, tmp_path: Path) -> None:
    session = served["session"]
    page, frame, requests = in_host(served, "ui://kope/session.html", served["profile"],
                                    {served["session_uri"]: served["session_json"]})
    frame.locator("#tree g.node").first.wait_for(timeout=15_000)
    measured = [s for s in session["steps"] if s["speedup"] is not None]
    assert len(session["steps"]) == 3 and len(measured) == 2
    assert frame.locator("#curve circle.point").count() == len(measured)
    speedups = sorted(float(frame.locator("#curve circle.point").nth(i).get_attribute("data-speedup"))
                      for i in range(len(measured)))
    assert speedups == sorted(s["speedup"] for s in measured)
    assert frame.locator("#curve rect.fail").count() == 1  # the one that did not compile, on the axis
    assert frame.locator("#tree g.node").count() == 3
    assert frame.locator("#tree g.node[data-verdict=compile_error]").count() == 1
    edges = {(frame.locator("#tree path.edge").nth(i).get_attribute("data-parent"),
              frame.locator("#tree path.edge").nth(i).get_attribute("data-child"))
             for i in range(frame.locator("#tree path.edge").count())}
    k1, k2, k3 = served["kernels"]
    assert edges == {(k1, k2), (k1, k3)}
    assert "omp simd on the loop" in (frame.locator("#tree").text_content() or "")
    if served["profile"].get("gflops"):
        assert frame.locator("#roof [data-role=kernel]").count() == 1
        assert frame.locator("#roof [data-role=roof]").count() == 1
    assert frame.locator("#status.error").count() == 0
    assert all(url.startswith(("about:", "data:")) for url in requests), requests  # nothing fetched
    shot(page, "session-view.png", tmp_path)


def test_the_experience_view_in_a_host_shows_the_selection_with_its_provenance(served: Any, tmp_path: Path) -> None:
    query = served["query"]
    page, frame, requests = in_host(served, "ui://kope/experience.html", query, {})
    frame.locator("#items tr.item").first.wait_for(timeout=15_000)
    assert frame.locator("#items tr.item").count() == len(query["items"])
    ids = [frame.locator("#items tr.item").nth(i).get_attribute("data-id") for i in range(len(query["items"]))]
    assert ids == [item["id"] for item in query["items"]]
    marks = {frame.locator("[data-prov]").nth(i).get_attribute("data-prov")
             for i in range(frame.locator("[data-prov]").count())}
    expected = {"verified" if i.get("verified") else "unverified" if i.get("verified") is False else "local"
                for i in query["items"] if i["kind"] != "target" and not i.get("origin") and not i.get("about_agent")}
    assert expected and expected <= marks
    assert "agent" in marks  # who produced it
    budget = frame.locator(".budget")
    assert budget.get_attribute("data-used") == str(query["tokens_used"])
    assert budget.get_attribute("data-budget") == str(query["token_budget"])
    assert all(url.startswith(("about:", "data:")) for url in requests), requests
    shot(page, "experience-view.png", tmp_path)


def test_the_pages_open_in_a_browser_from_the_daemon_behind_its_token(served: Any, tmp_path: Path) -> None:
    page = served["browser"].new_page(viewport={"width": 720, "height": 900})
    k2 = served["kernels"][1]
    page.goto(f"{served['url']}/view/session/{k2}#token={served['token']}")
    page.locator("#tree g.node").first.wait_for(timeout=15_000)
    assert page.locator("#tree g.node").count() == 3
    assert "#token" not in page.url  # the address bar forgets the token
    page.goto(f"{served['url']}/view/memory")  # the tab keeps it for the next page
    page.locator("#items tr.item").first.wait_for(timeout=15_000)
    assert page.locator("#items tr.item").count() == len(served["history"]["items"])
    shot(page, "memory-page.png", tmp_path)
    stranger = served["browser"].new_page()
    stranger.goto(f"{served['url']}/view/memory")  # no token: the page loads, the memory does not
    stranger.locator("#status.error").wait_for(timeout=15_000)
    assert "token" in stranger.locator("#status").inner_text()
    assert stranger.locator("#items tr.item").count() == 0
