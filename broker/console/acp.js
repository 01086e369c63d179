// ACP v2 over one WebSocket: JSON-RPC calls with deadlines, the broker's requests to the
// client, notifications, and reconnection with a growing pause. The console uses the same
// public `/acp` endpoint as every other client; nothing here is private to it.

const PROTOCOL_VERSION = 2;
const CALL_TIMEOUT_MS = 30000;
const RECONNECT_MS = [250, 500, 1000, 2000, 4000];
export const SHARED_ASKS_META = "acpBroker/sharedAsks";
// Replays come many notifications to a frame (JSON-RPC batch arrays): a browser hands a
// page one message event at a time, and a 10,000-event history is 10,000 of them otherwise.
export const BATCHED_REPLAY_META = "acpBroker/batchedReplay";
// The broker tells a connection that asks when its tenant's session list changed (an ACP
// extension notification, coalesced to one per 250 ms), so the list is read again then
// rather than polled; it advertises the same key in its own capabilities' _meta.
export const LIST_CHANGED_META = "acpBroker/listChanged";
export const LIST_CHANGED_METHOD = "_acpBroker/session/list_changed";
// Who is attached to a session, as session_info_update changes (presence.js shows them).
export const PRESENCE_META = "acpBroker/presence";
export const TOKEN_SUBPROTOCOL = "acp-broker.bearer.";

export class RpcError extends Error {
  constructor(error) {
    super(error.message || "error");
    this.code = error.code;
    this.data = error.data;
  }
}

// Calls go out only once the connection is initialized; until then they wait (bounded by
// their own deadline), so a page that reconnects carries on where it was.
export class AcpClient extends EventTarget {
  constructor(url, token) {
    super();
    this.url = url;
    this.token = token || "";
    this.ws = null;
    this.ready = false;
    this.info = null;
    this.nextId = 1;
    this.pending = new Map();
    this.waiting = [];
    this.attempt = 0;
    this.stopped = false;
    this.timer = null;
    // Called with (method, params) for each notification: a plain call, not an event, as
    // a replay brings thousands at once.
    this.onNotification = () => {};
  }

  start() {
    this.stopped = false;
    this.open();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000, "page closed");
  }

  open() {
    const protocols = this.token ? [TOKEN_SUBPROTOCOL + this.token] : [];
    let ws;
    try {
      ws = new WebSocket(this.url, protocols);
    } catch (error) {
      this.emit("state", { state: "offline", reason: String(error) });
      this.retry();
      return;
    }
    this.ws = ws;
    this.emit("state", { state: this.attempt ? "reconnecting" : "connecting" });
    ws.onopen = () => {
      performance.mark("ws-open");
      this.initialize(ws);
    };
    ws.onmessage = (event) => this.receive(ws, event.data);
    ws.onclose = (event) => this.closed(ws, event);
  }

  async initialize(ws) {
    const params = {
      protocolVersion: PROTOCOL_VERSION,
      info: { name: "acp-broker-console", title: "acp-broker console", version: "0.1.0" },
      capabilities: {
        _meta: {
          [SHARED_ASKS_META]: true,
          [BATCHED_REPLAY_META]: true,
          [LIST_CHANGED_META]: true,
          [PRESENCE_META]: true,
        },
      },
    };
    try {
      this.info = await this.send(ws, "initialize", params);
    } catch (error) {
      this.emit("state", { state: "offline", reason: String(error.message || error) });
      ws.close(4000, "initialize failed");
      return;
    }
    this.attempt = 0;
    this.ready = true;
    this.emit("state", { state: "online" });
    this.emit("open", { info: this.info });
    const waiting = this.waiting;
    this.waiting = [];
    for (const go of waiting) go();
  }

  closed(ws, event) {
    if (this.ws !== ws) return;
    this.ws = null;
    this.ready = false;
    for (const [, entry] of this.pending) entry.reject(new Error("connection lost"));
    this.pending.clear();
    this.emit("close", { code: event.code });
    if (this.stopped) {
      this.emit("state", { state: "offline", reason: "closed" });
      return;
    }
    this.emit("state", { state: "offline", reason: `connection closed (${event.code})` });
    this.retry();
  }

  retry() {
    if (this.stopped) return;
    const pause = RECONNECT_MS[Math.min(this.attempt, RECONNECT_MS.length - 1)];
    this.attempt += 1;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.open(), pause);
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  // A call on the current connection once it is initialized, failed after `timeoutMs`.
  call(method, params, timeoutMs = CALL_TIMEOUT_MS) {
    return new Promise((resolve, reject) => {
      const deadline = setTimeout(() => reject(new Error(`${method}: no answer in time`)), timeoutMs);
      const go = () =>
        this.send(this.ws, method, params).then(
          (value) => {
            clearTimeout(deadline);
            resolve(value);
          },
          (error) => {
            clearTimeout(deadline);
            reject(error);
          },
        );
      if (this.ready) go();
      else this.waiting.push(go);
    });
  }

  send(ws, method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  notify(method, params) {
    if (this.ready) this.ws.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
  }

  respond(id, result) {
    if (this.ws) this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, result }));
  }

  respondError(id, code, message) {
    if (this.ws) this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, error: { code, message } }));
  }

  receive(ws, text) {
    let message;
    try {
      message = JSON.parse(text);
    } catch (error) {
      console.error("not JSON from the broker", error);
      return;
    }
    for (const one of Array.isArray(message) ? message : [message]) this.dispatch(ws, one);
  }

  dispatch(ws, message) {
    if (message.method === undefined) {
      const entry = this.pending.get(message.id);
      if (!entry) return;
      this.pending.delete(message.id);
      if (message.error) entry.reject(new RpcError(message.error));
      else entry.resolve(message.result);
    } else if (message.id !== undefined && message.id !== null) {
      this.emit("request", { id: message.id, method: message.method, params: message.params || {} });
    } else {
      this.onNotification(message.method, message.params || {});
    }
  }
}
