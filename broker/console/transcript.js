// One session's transcript: ACP v2 `session/update`s in, DOM out.
//
// Messages, tool calls and plans are upserts keyed by their ids, shown in the order they
// first appeared. Markdown is rendered at most once per animation frame per message, and
// not at all while a replay is being received (`hold()` … `release()`): a 10,000-event
// history is laid out once, at its end.
//
// Markdown (marked and DOMPurify: most of the page's script) is run when first needed, or
// once the first page of the list is shown, not before the page starts: the list and the
// WebSocket do not wait for it (the page preloads its files). What is to be rendered before
// it is there waits for it.
let renderMarkdown = null;
let markdownLoaded = null;

export function loadMarkdown() {
  markdownLoaded ||= import("./markdown.js").then((module) => {
    renderMarkdown = module.renderMarkdown;
  });
  return markdownLoaded;
}

const STATUS_TEXT = { pending: "pending", in_progress: "running", completed: "completed", failed: "failed" };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function textOf(content) {
  if (!content) return "";
  if (Array.isArray(content)) return content.map(textOf).join("");
  if (content.type === "text") return content.text || "";
  if (content.type === "resource_link") return `[${content.name || content.uri}]`;
  if (content.type === "resource") return content.resource?.text || "";
  if (content.type === "image") return "[image]";
  return "";
}

export class Transcript {
  constructor(root) {
    this.root = root;
    this.items = new Map();
    this.dirty = new Set();
    this.frame = 0;
    this.holding = false;
    this.heldState = null;
    this.following = false;
    this.onTitle = () => {};
    this.onState = () => {};
  }

  clear() {
    this.root.replaceChildren();
    this.items.clear();
    this.dirty.clear();
  }

  hold() {
    loadMarkdown(); // while the history comes
    this.holding = true;
    this.heldState = null;
  }

  // The replay is in: lay it out once, and say the run state it ended in (a history has a
  // state change per turn; each would repaint the page's header and the list's row).
  release() {
    this.holding = false;
    this.flush();
    if (this.heldState) this.onState(...this.heldState);
    this.heldState = null;
    this.root.scrollTop = this.root.scrollHeight;
  }

  // Keep the newest in view while the reader is at the end (not while they scroll back).
  follow() {
    const root = this.root;
    if (this.holding || this.following) return;
    if (root.scrollHeight - root.scrollTop - root.clientHeight > 80) return;
    this.following = true;
    requestAnimationFrame(() => {
      this.following = false;
      root.scrollTop = root.scrollHeight;
    });
  }

  apply(update) {
    this.follow();
    switch (update.sessionUpdate) {
      case "user_message":
        this.message(update.messageId, "user", textOf(update.content), true);
        break;
      case "user_message_chunk":
        this.message(update.messageId, "user", textOf(update.content), false);
        break;
      case "agent_message":
        this.message(update.messageId, "agent", textOf(update.content), true);
        break;
      case "agent_message_chunk":
        this.message(update.messageId, "agent", textOf(update.content), false);
        break;
      case "agent_thought_chunk":
        this.message(update.messageId, "thought", textOf(update.content), false);
        break;
      case "tool_call_update":
        this.toolCall(update);
        break;
      case "plan_update":
        this.plan(update.plan || {});
        break;
      case "state_update":
        if (this.holding) this.heldState = [update.state, update.stopReason];
        else this.onState(update.state, update.stopReason);
        break;
      case "session_info_update":
        if ("title" in update) this.onTitle(update.title);
        break;
      case "config_option_update":
        this.note(`Configuration: ${configText(update.configOptions)}`);
        break;
      case "current_mode_update":
        this.note(`Mode: ${update.currentModeId}`);
        break;
      default:
        break; // commands, usage: nothing to show in the transcript
    }
  }

  item(id, kind, make) {
    const key = `${kind}:${id}`;
    let item = this.items.get(key);
    if (!item) {
      item = make();
      item.kind = kind;
      this.items.set(key, item);
      this.root.append(item.node);
    }
    return item;
  }

  message(id, role, text, replace) {
    const item = this.item(id, role, () => {
      if (role === "thought") {
        const node = el("details", "msg thought");
        node.append(el("summary", null, "Thought"));
        const body = el("div", "body");
        node.append(body);
        return { node, body, text: "" };
      }
      const node = el("article", `msg ${role}`);
      node.setAttribute("aria-label", role === "user" ? "You" : "Agent");
      node.append(el("div", "who", role === "user" ? "Prompt" : "Agent"));
      const body = el("div", "body");
      node.append(body);
      return { node, body, text: "" };
    });
    item.text = replace ? text : item.text + text;
    if (role === "user") item.body.textContent = item.text; // never HTML: shown as typed
    else this.markDirty(item);
  }

  markDirty(item) {
    this.dirty.add(item);
    if (!this.holding && !this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  flush() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    if (!renderMarkdown) {
      loadMarkdown().then(() => this.flush());
      return;
    }
    const root = this.root;
    const atEnd = root.scrollHeight - root.scrollTop - root.clientHeight <= 80;
    for (const item of this.dirty) renderMarkdown(item.body, item.text);
    this.dirty.clear();
    if (atEnd && !this.holding) root.scrollTop = root.scrollHeight; // the text grew: follow it
  }

  toolCall(update) {
    const item = this.item(update.toolCallId, "tool", () => {
      const node = el("section", "tool");
      const head = el("div", "tool-head");
      const title = el("span", "tool-title");
      const status = el("span", "tool-status");
      head.append(title, status);
      const locations = el("ul", "tool-locations");
      const content = el("div", "tool-content");
      node.append(head, locations, content);
      node.setAttribute("aria-label", "Tool call");
      return { node, title, status, locations, content, state: {} };
    });
    Object.assign(item.state, update);
    const state = item.state;
    item.title.textContent = state.title || state.kind || "Tool call";
    item.status.textContent = STATUS_TEXT[state.status] || state.status || "pending";
    item.node.dataset.status = state.status || "pending";
    if ("locations" in update) {
      item.locations.replaceChildren(
        ...(update.locations || []).map((loc) => el("li", null, loc.line ? `${loc.path}:${loc.line}` : loc.path)),
      );
    }
    if ("content" in update) {
      item.content.replaceChildren(...(update.content || []).map((part) => this.toolContent(part)));
    }
  }

  plan(plan) {
    const item = this.item(plan.planId || "plan", "plan", () => {
      const node = el("section", "plan");
      node.setAttribute("aria-label", "Plan");
      node.append(el("div", "who", "Plan"));
      const list = el("ol");
      node.append(list);
      return { node, list };
    });
    item.list.replaceChildren(
      ...(plan.entries || []).map((entry) => {
        const li = el("li", `plan-${entry.status || "pending"}`, entry.content || "");
        li.append(el("span", "plan-status", ` (${(entry.status || "pending").replace("_", " ")})`));
        return li;
      }),
    );
  }

  note(text) {
    this.root.append(el("div", "note", text));
  }

  // A tool call's content: diffs and terminals as text, text content as Markdown (rendered
  // with the messages, in the next frame or when a replay ends).
  toolContent(part) {
    if (part.type === "diff") {
      const box = el("div", "diff");
      const paths = (part.changes || []).map((c) => `${c.operation} ${c.path}`).join(", ");
      box.append(el("div", "diff-paths", paths || part.path || ""));
      const text = part.patch?.text ?? part.newText ?? "";
      box.append(el("pre", null, text));
      return box;
    }
    if (part.type === "terminal") return el("div", "terminal", `terminal ${part.terminalId}`);
    const body = el("div", "tool-text");
    this.markDirty({ body, text: textOf(part.content) });
    return body;
  }
}

function configText(options) {
  return (options || [])
    .map((o) => `${o.name || o.configId} = ${o.currentValue ?? ""}`)
    .join(", ");
}
