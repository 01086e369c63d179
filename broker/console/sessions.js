// The session list: pages read with the broker's cursors as the user scrolls.
//
// Two sources, both public: ACP `session/list` over the WebSocket (newest activity first,
// optionally one working directory), and, when the user searches (id prefix, metadata
// words, status, kind), `GET /v1/sessions` on the same origin, which REST and MCP share
// (newest created first). Both say each session's agent and status (`session/list` in
// `SessionInfo._meta`, under `acpBroker/agent` and `acpBroker/status`). Each session is
// one row however often it is seen (a session that moves up between two pages stays where
// it was first shown).

const PAGE_LIMIT = 50;
// Asks to read the first page again within this long are one read (the broker coalesces
// its list_changed notifications already; this joins them to the page's own reasons).
const REFRESH_DEBOUNCE_MS = 50;

/** What a row says of the broker's session status (REST's and `session/list`'s words). */
const STATUS_TEXT = { RUNNING: "agent running", STOPPED: "stopped", ERROR: "agent failed", DELETED: "deleted" };

/** A `session/list` entry as a row: the broker says agent and status in `_meta`. */
export function rowOfSessionInfo(info) {
  const meta = info._meta || {};
  return { ...info, agent: meta["acpBroker/agent"], status: meta["acpBroker/status"] };
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The page address of a session: its id, and its cwd (which resuming it needs). */
export function sessionHash(sessionId, cwd) {
  const params = new URLSearchParams({ session: sessionId });
  if (cwd) params.set("cwd", cwd);
  return `#${params}`;
}

export function relativeTime(iso) {
  if (!iso) return "";
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return iso;
  const seconds = Math.round((Date.now() - then) / 1000);
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return new Date(then).toLocaleDateString();
}

export class SessionList {
  constructor({ root, sentinel, client, fetchRest, onOpen }) {
    this.root = root;
    this.sentinel = sentinel;
    this.client = client;
    this.fetchRest = fetchRest;
    this.onOpen = onOpen;
    this.rows = new Map();
    this.filter = { cwd: "", q: "", status: "", kind: "" };
    this.cursor = null;
    this.done = true; // nothing to read until reset() starts a listing
    this.loading = null;
    this.generation = 0;
    this.selected = null;
    this.refreshTimer = null; // a refresh asked for, not yet begun
    this.refreshing = false; // a refresh under way
    this.refreshOwed = false; // asked for since the refresh under way read its page
    this.observer = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.more();
    });
    this.observer.observe(sentinel);
  }

  get searching() {
    return Boolean(this.filter.q || this.filter.status || this.filter.kind);
  }

  reset(filter) {
    if (filter) this.filter = { ...this.filter, ...filter };
    this.generation += 1;
    this.rows.clear();
    this.root.replaceChildren();
    this.cursor = null;
    this.done = false;
    this.loading = null;
    return this.more();
  }

  // The next page, once (calls while one is being read wait for it).
  more() {
    if (this.done) return Promise.resolve();
    if (this.loading) return this.loading;
    const generation = this.generation;
    this.sentinel.textContent = "Loading…";
    this.loading = this.readPage()
      .then(({ sessions, next }) => {
        if (generation !== this.generation) return;
        for (const info of sessions) this.upsert(info, false);
        this.cursor = next;
        this.done = !next;
        this.sentinel.textContent = this.done ? (this.rows.size ? "" : "No sessions") : "";
      })
      .catch((error) => {
        if (generation === this.generation) this.sentinel.textContent = `Could not list: ${error.message}`;
      })
      .finally(() => {
        if (generation !== this.generation) return;
        this.loading = null;
        if (!this.done && this.sentinelVisible()) this.more();
      });
    return this.loading;
  }

  sentinelVisible() {
    const box = this.sentinel.getBoundingClientRect();
    const view = this.root.closest("nav")?.getBoundingClientRect();
    const bottom = Math.min(view ? view.bottom : window.innerHeight, window.innerHeight);
    return box.top < bottom + 200;
  }

  async readPage() {
    if (this.searching) {
      const query = new URLSearchParams({ limit: String(PAGE_LIMIT) });
      for (const key of ["q", "status", "kind", "cwd"]) if (this.filter[key]) query.set(key, this.filter[key]);
      if (this.cursor) query.set("after", this.cursor);
      const page = await this.fetchRest(`v1/sessions?${query}`);
      return {
        sessions: page.data.map((s) => ({ ...s, sessionId: s.id })),
        next: page.has_more ? page.next_cursor : null,
      };
    }
    const params = {};
    if (this.filter.cwd) params.cwd = this.filter.cwd;
    if (this.cursor) params.cursor = this.cursor;
    const page = await this.client.call("session/list", params);
    return { sessions: (page.sessions || []).map(rowOfSessionInfo), next: page.nextCursor || null };
  }

  // Show a session (a new one goes first), or update the row it has.
  upsert(info, first) {
    let row = this.rows.get(info.sessionId);
    if (!row) {
      const node = el("li", "session-row");
      const link = el("a");
      link.href = sessionHash(info.sessionId, info.cwd);
      const title = el("span", "row-title");
      const meta = el("span", "row-meta");
      link.append(title, meta);
      node.append(link);
      row = { node, title, meta, info: {} };
      this.rows.set(info.sessionId, row);
      if (first) this.root.prepend(node);
      else this.root.append(node);
    }
    Object.assign(row.info, info);
    this.paint(row);
    if (this.done && this.sentinel.textContent === "No sessions") this.sentinel.textContent = "";
    row.node.classList.toggle("selected", info.sessionId === this.selected);
  }

  paint(row) {
    const info = row.info;
    row.title.textContent = info.title || "Untitled session";
    // A turn in progress (the open session's) says more than the agent process's status.
    const status = info.turn || STATUS_TEXT[info.status] || info.status;
    const parts = [info.cwd, info.agent, status, relativeTime(info.updatedAt)].filter(Boolean);
    row.meta.textContent = parts.join(" · ");
  }

  retitle(sessionId, title) {
    const row = this.rows.get(sessionId);
    if (row) {
      row.info.title = title;
      this.paint(row);
    }
  }

  touch(sessionId, fields) {
    const row = this.rows.get(sessionId);
    if (row) {
      Object.assign(row.info, fields);
      this.paint(row);
    }
  }

  remove(sessionId) {
    const row = this.rows.get(sessionId);
    if (row) {
      row.node.remove();
      this.rows.delete(sessionId);
    }
  }

  select(sessionId) {
    this.selected = sessionId;
    for (const [id, row] of this.rows) row.node.classList.toggle("selected", id === sessionId);
  }

  // Read the first page again soon (the list changed elsewhere): asks within a moment are
  // one read, and an ask while a read is under way is one more read after it, since what
  // changed may have come after that read's page was taken. Never two reads at once.
  refreshSoon(delayMs = REFRESH_DEBOUNCE_MS) {
    this.refreshOwed = true;
    if (this.refreshTimer !== null || this.refreshing) return;
    this.refreshTimer = setTimeout(() => this.runRefreshes(), delayMs);
  }

  async runRefreshes() {
    this.refreshTimer = null;
    this.refreshing = true;
    try {
      while (this.refreshOwed) {
        this.refreshOwed = false;
        while (this.loading) await this.loading; // a page being read by scrolling goes first
        await this.refreshHead().catch(() => {}); // the next change, or the poll, reads again
      }
    } finally {
      this.refreshing = false;
    }
  }

  // New and retitled sessions elsewhere: read the first page again and merge it.
  async refreshHead() {
    if (this.searching || this.loading) return;
    const generation = this.generation;
    const params = this.filter.cwd ? { cwd: this.filter.cwd } : {};
    const page = await this.client.call("session/list", params);
    if (generation !== this.generation) return;
    const sessions = (page.sessions || []).map(rowOfSessionInfo);
    const fresh = sessions.filter((s) => !this.rows.has(s.sessionId)).reverse();
    for (const info of sessions) if (this.rows.has(info.sessionId)) this.upsert(info, false);
    for (const info of fresh) this.upsert(info, true);
  }
}
