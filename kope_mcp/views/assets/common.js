"use strict";
// A kope view's link to its data. Inside an MCP client (MCP Apps: the view is a ui:// resource in the host's
// sandboxed iframe) the host hands it the tool's result and reads resources for it. Opened in a browser from the
// daemon (`kope view`), it reads the same resources from the daemon's MCP endpoint, with the token from the
// address's fragment (a fragment never leaves the browser). Nothing else is fetched: no CDN, no second API.
const kope = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const inHost = window.parent !== window;
  const pending = new Map();
  const resultHandlers = [];
  let nextId = 1;
  let hostCapabilities = {};
  let lastResult = null;

  function post(message) { window.parent.postMessage({ jsonrpc: "2.0", ...message }, "*"); }
  function hostRequest(method, params) {
    const id = nextId++;
    return new Promise((resolve, reject) => { pending.set(id, { resolve, reject }); post({ id, method, params }); });
  }
  window.addEventListener("message", (event) => {
    if (!inHost || event.source !== window.parent) return;
    const m = event.data;
    if (!m || m.jsonrpc !== "2.0") return;
    if (m.method === undefined && pending.has(m.id)) {
      const waiter = pending.get(m.id);
      pending.delete(m.id);
      if (m.error) waiter.reject(new Error(m.error.message || "the host refused")); else waiter.resolve(m.result);
    } else if (m.method === "ui/notifications/tool-result") {
      lastResult = m.params || {};
      resultHandlers.forEach((handler) => handler(lastResult));
    } else if (m.method === "ui/notifications/host-context-changed") {
      theme((m.params || {}).theme);
    } else if (m.method === "ui/resource-teardown" && m.id !== undefined) {
      post({ id: m.id, result: {} });
    } else if (m.method !== undefined && m.id !== undefined) {
      post({ id: m.id, error: { code: -32601, message: `kope's view does not handle ${m.method}` } });
    }
  });

  function theme(name) { if (name) document.documentElement.dataset.theme = name; }

  // --- the daemon's MCP endpoint (browser) ---------------------------------------------------------------------
  // Only in a browser: a host's sandboxed iframe has no storage (reaching for it throws) and no token.
  const token = inHost ? null
    : new URLSearchParams(location.hash.slice(1)).get("token") || sessionStorage.getItem("kope-token");
  if (token) {
    sessionStorage.setItem("kope-token", token);  // this tab's next page finds it; the address bar forgets it
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  }
  let mcpSession = null;
  async function mcpPost(body) {
    const headers = { "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                      "Authorization": `Bearer ${token}` };
    if (mcpSession) Object.assign(headers, { "Mcp-Session-Id": mcpSession.id,
                                             "MCP-Protocol-Version": mcpSession.version });
    const response = await fetch("/mcp", { method: "POST", headers, body: JSON.stringify(body) });
    if (response.status === 401) throw new Error("the daemon refused the token: open the address `kope view` prints");
    if (!response.ok && response.status !== 202) throw new Error(`the daemon answered HTTP ${response.status}`);
    const text = await response.text();
    const type = response.headers.get("content-type") || "";
    const messages = type.includes("text/event-stream")
      // An event stream: one message per `data:` line (the resumable stream's priming event has none).
      ? text.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trim())
        .filter(Boolean).map((line) => JSON.parse(line))
      : text ? [JSON.parse(text)] : [];
    return { response, message: messages.find((m) => m.id === body.id) };
  }
  async function mcp(method, params) {
    if (!token) throw new Error("no token: open the address `kope view` prints (it carries one)");
    if (!mcpSession) {
      const init = { jsonrpc: "2.0", id: nextId++, method: "initialize", params: {
        protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "kope-view", version: "1" } } };
      const { response, message } = await mcpPost(init);
      if (!message || message.error) throw new Error((message && message.error.message) || "no answer to initialize");
      mcpSession = { id: response.headers.get("mcp-session-id"), version: message.result.protocolVersion };
      await mcpPost({ jsonrpc: "2.0", method: "notifications/initialized" });
    }
    const { message } = await mcpPost({ jsonrpc: "2.0", id: nextId++, method, params });
    if (!message) throw new Error(`no answer to ${method}`);
    if (message.error) throw new Error(message.error.message);
    return message.result;
  }

  async function readResource(uri) {
    if (inHost && !hostCapabilities.serverResources) {
      throw new Error("this client does not let views read the server's resources");
    }
    const result = inHost ? await hostRequest("resources/read", { uri }) : await mcp("resources/read", { uri });
    return JSON.parse(result.contents[0].text);
  }

  // The view's entry: `render(result)` gets the tool's structuredContent in a client, null in a browser.
  async function start(name, render) {
    const shown = (result) => Promise.resolve(render(result)).catch(fail);
    if (!inHost) { shown(null); return; }
    resultHandlers.push((params) => shown(params.structuredContent || null));
    try {
      const answer = await hostRequest("ui/initialize", {
        protocolVersion: "2026-01-26", appInfo: { name: `kope ${name} view`, version: "1" },
        appCapabilities: { availableDisplayModes: ["inline"] } });
      hostCapabilities = answer.hostCapabilities || {};
      theme((answer.hostContext || {}).theme);
      post({ method: "ui/notifications/initialized", params: {} });
    } catch (error) { fail(error); }
    new ResizeObserver(() => post({ method: "ui/notifications/size-changed", params: {
      width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight } }))
      .observe(document.body);
  }

  function fail(error) {
    const box = document.getElementById("status");
    box.className = "error";
    box.textContent = String(error && error.message ? error.message : error);
  }

  // --- drawing helpers ------------------------------------------------------------------------------------------
  function el(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) if (value !== undefined) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function html(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    for (const child of children) node.append(child);
    return node;
  }
  const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
  const short = (id) => (id || "").slice(0, 8);
  const clip = (text, n) => (!text ? "" : text.length > n ? text.slice(0, n - 1) + "…" : text);

  return { start, readResource, inHost, token: () => token, el, html, fmt, short, clip };
})();
