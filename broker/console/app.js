// The console: sign-in, the session list, one open session, live over ACP v2.
//
// Where the WebSocket is: the page's <meta name="acp-broker-ws">, which the serving node
// fills in (same origin `/acp` behind a load balancer, the node's own WebSocket port when
// the page comes straight from a node). A reconnect goes to the same URL, so behind a load
// balancer it reaches whichever node that gives, and resumes from the last position seen.
import { AcpClient, LIST_CHANGED_META, LIST_CHANGED_METHOD, RpcError } from "./acp.js";
import { SessionList, sessionHash } from "./sessions.js";
import { SessionSide } from "./presence.js";
import { Transcript, loadMarkdown } from "./transcript.js";

performance.mark("app-start");
const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "acp-broker-token";
const POSITION_META = "acpBroker/position";
// Titles and statuses of sessions not open here change elsewhere (a change moves a session
// to the top of the newest-activity order, so the first page holds every change). The
// broker says when the tenant's list changed (LIST_CHANGED_METHOD, asked for at initialize),
// and the first page is read again then. A slow poll stays as the fallback, since such a
// notice may be lost (Redis pub/sub is at most once); against a broker that does not
// advertise the notification, the poll is the old 3 s. Hidden tabs read nothing: a change
// heard while hidden is read when the tab is shown again.
const POLL_LIST_MS = 30000;
const POLL_LIST_UNPUSHED_MS = 3000;
const CWD_LOOKUPS = 10;
const STATE_TEXT = { idle: "idle", running: "running", requires_action: "waiting for permission" };

const state = {
  client: null,
  list: null,
  transcript: null,
  side: null, // presence, queued prompts, pending interactions (presence.js)
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  session: null, // { id, cwd, epoch, seq }
  opened: false,
  agents: [],
  listPushed: false, // whether the broker advertised LIST_CHANGED_META
  listStale: false, // a change was told while the tab was hidden
};

function meta(name) {
  return document.querySelector(`meta[name="${name}"]`)?.content || "";
}

function wsUrl() {
  const url = new URL(meta("acp-broker-ws") || "/acp", location.href);
  if (url.protocol === "http:") url.protocol = "ws:";
  if (url.protocol === "https:") url.protocol = "wss:";
  return url.href;
}

async function fetchRest(path) {
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  const response = await fetch(new URL(path, location.href), { headers, cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.detail || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

function showError(text) {
  $("session-error").textContent = text || "";
}

// -- sign-in ------------------------------------------------------------------------------

function boot() {
  if (meta("acp-broker-auth") === "on" && !state.token) {
    showSignIn("");
    return;
  }
  start();
}

function showSignIn(message) {
  $("main").hidden = true;
  $("signin").hidden = false;
  $("connection").textContent = "Signed out";
  $("signin-error").textContent = message;
  $("signin-token").focus();
}

async function signIn(event) {
  event.preventDefault();
  const token = $("signin-token").value.trim();
  state.token = token;
  try {
    await fetchRest("v1/sessions?limit=1");
  } catch (error) {
    state.token = "";
    const refused = error.status === 401 || error.status === 403;
    showSignIn(refused ? "The broker refused this token." : `Could not check the token: ${error.message}`);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $("signin-token").value = "";
  $("signin").hidden = true;
  start();
}

// -- connection -----------------------------------------------------------------------------

function start() {
  $("main").hidden = false;
  const client = new AcpClient(wsUrl(), state.token);
  state.client = client;
  state.transcript = new Transcript($("transcript"));
  state.transcript.onTitle = (title) => setTitle(title);
  state.transcript.onState = (value) => setRunState(value);
  state.side = new SessionSide({ present: $("present"), queue: $("queued"), pending: $("pending"), fetchRest });
  state.list = new SessionList({
    root: $("sessions"),
    sentinel: $("sessions-more"),
    client,
    fetchRest,
    onOpen: (id) => openSession(id),
  });
  client.addEventListener("state", (e) => connectionState(e.detail));
  client.addEventListener("open", (e) => connected(e.detail.info));
  client.addEventListener("close", () => clearPermissions());
  client.onNotification = (method, params) => notified(method, params);
  client.addEventListener("request", (e) => requested(e.detail));
  client.start();
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && state.listStale) listChanged();
  });
}

// The fallback: the first page again every POLL_LIST_MS (while the tab is in view), from
// the first connection's initialize on (the list's first read).
function pollList() {
  setTimeout(
    () => {
      if (!document.hidden) state.list.refreshSoon(0);
      pollList();
    },
    state.listPushed ? POLL_LIST_MS : POLL_LIST_UNPUSHED_MS,
  );
}

function listChanged() {
  if (document.hidden) {
    state.listStale = true;
    return;
  }
  state.listStale = false;
  state.list.refreshSoon();
}

function connectionState({ state: value, reason }) {
  const text = {
    connecting: "Connecting…",
    reconnecting: "Reconnecting…",
    online: "Online",
    offline: "Offline: reconnecting",
  }[value];
  $("connection").textContent = text || value;
  $("connection").dataset.state = value;
  if (value === "offline" && reason) $("connection").title = reason;
}

function connected(info) {
  performance.mark("acp-initialized");
  const extra = info?._meta || {};
  $("tenant").textContent = extra["acpBroker/tenant"] ? `Tenant: ${extra["acpBroker/tenant"]}` : "";
  const agents = extra["acpBroker/agents"] || [];
  state.listPushed = info?.capabilities?._meta?.[LIST_CHANGED_META] === true;
  if (!state.opened) {
    state.opened = true;
    pollList();
    fillAgents(agents);
    state.list.reset().finally(() => loadMarkdown());
    openFromHash();
    return;
  }
  listChanged(); // what changed while this page was away was not told to it
  if (state.session) resumeFromPosition(state.session);
}

function fillAgents(agents) {
  const select = $("new-agent");
  select.replaceChildren(
    ...agents.map((agent) => {
      const option = document.createElement("option");
      option.value = agent.name;
      option.textContent = agent.kind ? `${agent.name} (${agent.kind})` : agent.name;
      return option;
    }),
  );
}

// -- sessions -----------------------------------------------------------------------------

function openFromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const id = params.get("session");
  if (id && id !== state.session?.id) openSession(id, params.get("cwd"));
}

async function cwdOf(id, given) {
  if (given) return given;
  const row = state.list.rows.get(id);
  if (row?.info.cwd) return row.info.cwd;
  try {
    // A live view link names a session this page has not listed: ask for it by id.
    const session = await fetchRest(`v1/sessions/${encodeURIComponent(id)}`);
    if (session.cwd) return session.cwd;
  } catch (error) {
    if (error.status !== 404) throw error;
  }
  // The index may lag a just-created session by a moment: look a few times, then give up.
  for (let attempt = 0; attempt < CWD_LOOKUPS; attempt++) {
    const page = await fetchRest(`v1/sessions?q=${encodeURIComponent(id)}&limit=5`);
    const found = page.data.find((s) => s.id === id);
    if (found) return found.cwd;
    await new Promise((resolve) => setTimeout(resolve, 300));
  }
  throw new Error("no such session");
}

async function openSession(id, givenCwd) {
  showError("");
  const previous = state.session;
  let cwd;
  performance.mark("session-open");
  try {
    cwd = await cwdOf(id, givenCwd);
    performance.mark("session-cwd");
  } catch (error) {
    showError(`Cannot open ${id}: ${error.message}`);
    return;
  }
  if (previous && previous.id !== id) {
    state.client.call("session/close", { sessionId: previous.id }).catch(() => {});
  }
  const session = { id, cwd, epoch: null, seq: 0 };
  if (!state.list.rows.has(id)) state.list.upsert({ sessionId: id, cwd }, true); // shown, so listed
  showSession(session, state.list.rows.get(id).info.title);
  state.transcript.hold();
  try {
    const reply = await state.client.call("session/resume", {
      sessionId: id,
      cwd,
      replayFrom: { type: "start" },
    });
    performance.mark("session-replayed");
    showConfig(reply?.configOptions);
  } catch (error) {
    showError(`Cannot open the session: ${error.message}`);
  } finally {
    if (state.session === session) {
      state.transcript.release();
      performance.mark("session-rendered");
    }
  }
}

async function resumeFromPosition(session) {
  const replayFrom = session.epoch
    ? { type: "_acpbroker_position", seq: session.seq + 1, epoch: session.epoch }
    : { type: "start" };
  if (!session.epoch) state.transcript.clear();
  try {
    await state.client.call("session/resume", { sessionId: session.id, cwd: session.cwd, replayFrom });
  } catch (error) {
    if (error instanceof RpcError && error.code === -32602 && state.session === session) {
      // The log was replaced (another epoch): show it whole again rather than a gap.
      session.epoch = null;
      session.seq = 0;
      state.transcript.clear();
      await state.client.call("session/resume", {
        sessionId: session.id,
        cwd: session.cwd,
        replayFrom: { type: "start" },
      });
    } else {
      showError(`Could not resume: ${error.message}`);
    }
  }
}

function showSession(session, title) {
  state.session = session;
  state.transcript.clear();
  state.side.reset(session.id);
  clearPermissions();
  $("empty").hidden = true;
  $("session").hidden = false;
  $("session-cwd").textContent = session.cwd;
  $("rename-form").hidden = true;
  setTitle(title);
  setRunState("idle");
  state.list.select(session.id);
  const hash = sessionHash(session.id, session.cwd);
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

function setTitle(title) {
  const text = title || "Untitled session";
  $("session-title").textContent = text;
  document.title = `${text} · acp-broker`;
  if (state.session) state.list.retitle(state.session.id, title);
}

function setRunState(value) {
  $("session-state").textContent = STATE_TEXT[value] || value;
  $("session-state").dataset.state = value;
  $("cancel").disabled = value === "idle";
  if (state.session) state.list.touch(state.session.id, { turn: value === "idle" ? "" : STATE_TEXT[value] || value });
}

function showConfig(options) {
  // Config options are shown as they change in the transcript; nothing to lay out here.
  return options;
}

async function newSession(event) {
  event.preventDefault();
  showError("");
  const cwd = $("new-cwd").value.trim();
  const agent = $("new-agent").value;
  const params = { cwd, mcpServers: [] };
  if (agent) params._meta = { "acpBroker/agent": agent };
  const previous = state.session;
  try {
    const reply = await state.client.call("session/new", params);
    if (previous) state.client.call("session/close", { sessionId: previous.id }).catch(() => {});
    const session = { id: reply.sessionId, cwd, epoch: null, seq: 0 };
    state.list.upsert({ sessionId: reply.sessionId, cwd, agent, updatedAt: new Date().toISOString() }, true);
    showSession(session, "Untitled session");
    $("prompt").focus();
  } catch (error) {
    showError(`Could not start a session: ${error.message}`);
  }
}

// -- live updates ---------------------------------------------------------------------------

function notified(method, params) {
  if (method === LIST_CHANGED_METHOD) {
    listChanged();
  } else if (method === "session/update") {
    const update = params.update || {};
    const session = state.session;
    if (!session || params.sessionId !== session.id) {
      if (update.sessionUpdate === "session_info_update" && "title" in update) {
        state.list.retitle(params.sessionId, update.title);
      }
      return;
    }
    const position = params._meta?.[POSITION_META];
    if (position) {
      if (session.epoch === position.epoch && position.seq < session.seq) return; // seen
      session.epoch = position.epoch;
      session.seq = position.seq;
    }
    state.transcript.apply(update);
    state.side.apply(update);
  } else if (method === "$/cancel_request") {
    settled(params.requestId);
  }
}

function requested({ id, method, params }) {
  if (method !== "session/request_permission" || !state.session || params.sessionId !== state.session.id) {
    state.client.respondError(id, -32601, `the console does not answer ${method}`);
    return;
  }
  const box = document.createElement("section");
  box.className = "permission";
  box.dataset.requestId = String(id);
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", "Permission request");
  const title = document.createElement("p");
  title.className = "permission-title";
  title.textContent = params.title || "Permission requested";
  box.append(title);
  if (params.description) {
    const description = document.createElement("p");
    description.textContent = params.description;
    box.append(description);
  }
  for (const option of params.options || []) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = option.name;
    button.dataset.kind = option.kind || "";
    button.addEventListener("click", () => {
      state.client.respond(id, { outcome: { outcome: "selected", optionId: option.optionId } });
      box.remove();
    });
    box.append(button);
  }
  $("permissions").append(box);
  box.querySelector("button")?.focus();
}

function settled(requestId) {
  for (const box of $("permissions").querySelectorAll(".permission")) {
    if (box.dataset.requestId === String(requestId)) box.remove();
  }
}

function clearPermissions() {
  $("permissions").replaceChildren();
}

// -- actions ----------------------------------------------------------------------------------

async function sendPrompt(event) {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || !state.session) return;
  showError("");
  $("prompt").value = "";
  try {
    await state.client.call("session/prompt", {
      sessionId: state.session.id,
      prompt: [{ type: "text", text }],
    });
  } catch (error) {
    $("prompt").value = text;
    showError(`Not sent: ${error.message}`);
  }
}

function promptKey(event) {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("prompt-form").requestSubmit();
  }
}

function cancelTurn() {
  if (state.session) state.client.notify("session/cancel", { sessionId: state.session.id });
}

function startRename() {
  $("rename-form").hidden = false;
  $("rename-title").value = $("session-title").textContent;
  $("rename-title").focus();
}

async function rename(event) {
  event.preventDefault();
  const title = $("rename-title").value.trim();
  try {
    await state.client.call("session/set_title", { sessionId: state.session.id, title: title || null });
    $("rename-form").hidden = true;
  } catch (error) {
    showError(`Could not rename: ${error.message}`);
  }
}

async function deleteSession() {
  const session = state.session;
  if (!session || !confirm("Delete this session for everyone?")) return;
  try {
    await state.client.call("session/delete", { sessionId: session.id });
    state.list.remove(session.id);
    state.session = null;
    $("session").hidden = true;
    $("empty").hidden = false;
    history.replaceState(null, "", location.pathname);
  } catch (error) {
    showError(`Could not delete: ${error.message}`);
  }
}

function filter(event) {
  event.preventDefault();
  const form = new FormData($("filter"));
  state.list.reset({
    cwd: String(form.get("cwd") || "").trim(),
    q: String(form.get("q") || "").trim(),
    status: String(form.get("status") || ""),
    kind: String(form.get("kind") || ""),
  });
}

$("signin-form").addEventListener("submit", signIn);
$("new-session").addEventListener("submit", newSession);
$("filter").addEventListener("submit", filter);
$("prompt-form").addEventListener("submit", sendPrompt);
$("prompt").addEventListener("keydown", promptKey);
$("cancel").addEventListener("click", cancelTurn);
$("rename").addEventListener("click", startRename);
$("rename-form").addEventListener("submit", rename);
$("delete").addEventListener("click", deleteSession);
window.addEventListener("hashchange", () => state.client && openFromHash());
boot();
