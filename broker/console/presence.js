// Beside the open session: who is present, its queued prompts, its pending interactions.
//
// All three come as session_info_update's _meta, live and in a replay:
// - presence ("acpBroker/presence": joined, left, state; asked for at initialize): the
//   page reads the whole snapshot (GET /v1/sessions/{id}/presence) when it opens a session
//   and after each change (a change's revision past the snapshot's), so a replayed old change
//   never shows;
// - the prompt queue ("acpBroker/promptQueue": queued, withdrawn): FIFO, so a turn that
//   starts (a user_message) while prompts wait is the first of them;
// - interactions ("acpBroker/interaction"): the open and claimed ones are pending.
import { PRESENCE_META } from "./acp.js";

const QUEUE_META = "acpBroker/promptQueue";
const INTERACTION_META = "acpBroker/interaction";
const PENDING = new Set(["open", "claimed"]);
const RELOAD_MS = 150;

function textOf(content) {
  return (content || []).map((block) => (block && block.type === "text" ? block.text : "")).join("");
}

function item(text, className) {
  const li = document.createElement("li");
  li.className = className;
  li.textContent = text;
  return li;
}

export class SessionSide {
  constructor({ present, queue, pending, fetchRest }) {
    this.lists = { present, queue, pending };
    this.fetchRest = fetchRest;
    this.reset(null);
  }

  reset(sessionId) {
    this.sessionId = sessionId;
    this.revision = -1;
    this.participants = [];
    this.queued = []; // { id, text }
    this.interactions = new Map(); // id -> record
    this.timer = 0;
    this.render();
    if (sessionId) this.reload();
  }

  apply(update) {
    if (update.sessionUpdate === "user_message" && this.queued.length) {
      this.queued.shift();
      this.render();
      return;
    }
    if (update.sessionUpdate !== "session_info_update") return;
    const meta = update._meta || {};
    const presence = meta[PRESENCE_META];
    if (presence && Number(presence.presenceRevision) > this.revision) this.reloadSoon();
    const queue = meta[QUEUE_META];
    if (queue) this.queueChange(queue);
    const record = meta[INTERACTION_META];
    if (record && record.interactionId) {
      if (PENDING.has(record.state?.type)) this.interactions.set(record.interactionId, record);
      else this.interactions.delete(record.interactionId);
      this.render();
    }
  }

  queueChange(change) {
    if (change.change === "queued") {
      this.queued.push({ id: change.activityId, text: textOf(change.prompt) });
    } else if (change.change === "withdrawn") {
      this.queued = this.queued.filter((q) => q.id !== change.activityId);
    }
    this.render();
  }

  reloadSoon() {
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = 0;
      this.reload();
    }, RELOAD_MS);
  }

  async reload() {
    const sessionId = this.sessionId;
    try {
      const body = await this.fetchRest(`v1/sessions/${encodeURIComponent(sessionId)}/presence`);
      if (sessionId !== this.sessionId || Number(body.presenceRevision) < this.revision) return;
      this.revision = Number(body.presenceRevision);
      this.participants = body.participants || [];
      this.render();
    } catch {
      // Advisory: the next change (or reopening the session) reads it again.
    }
  }

  render() {
    const { present, queue, pending } = this.lists;
    present.replaceChildren(
      ...this.participants.map((p) =>
        item(`${p.displayName || "someone"} (${p.roles.join(", ")}) · ${p.state}`, `presence-${p.state}`),
      ),
    );
    queue.replaceChildren(...this.queued.map((q) => item(q.text || "(a prompt)", "queued")));
    pending.replaceChildren(
      ...[...this.interactions.values()].map((r) => {
        const title = r.request?.toolCall?.title || r.request?.message || r.kind;
        return item(`${r.kind}: ${title} · ${r.state.type}`, "pending");
      }),
    );
  }
}
