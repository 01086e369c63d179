#!/usr/bin/env node
// ACP clients written with the official TypeScript SDK (@agentclientprotocol/sdk), driven by
// acp-broker's tests: `client.ts v1|v2 ws|http|bridge URL`. `ws` connects to the broker over
// WebSocket (the SDK's WebSocket stream); `http` over Streamable HTTP (the SDK's
// createHttpStream: POST, SSE GET streams, DELETE); `bridge` runs the command in ACP_BRIDGE_COMMAND (a
// JSON array: `acp-broker connect URL`) and speaks ndjson over its stdio, as editors do.
//
// The scenario: new, prompt (answering the agent's permission request), set_title, list,
// fork (when offered), close, load/replay (v1) or resume with replayFrom (v2), resume,
// delete. The SDK checks every message it receives against its protocol types; this script
// checks what the broker answered and prints a JSON summary on stdout (exit 1 on failure).

import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";

import * as v1 from "@agentclientprotocol/sdk/unstable";
import * as v2 from "@agentclientprotocol/sdk/experimental/v2/unstable";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import { WebSocket } from "ws";

type Json = Record<string, any>;
type Stream = { readable: ReadableStream<any>; writable: WritableStream<any> };

const [version, transport, url] = process.argv.slice(2);
const summary: Json = { version, transport };

function check(condition: unknown, what: string): void {
  if (!condition) throw new Error(`check failed: ${what}`);
}

function open(): { stream: Stream; done: () => void } {
  if (transport === "ws") {
    return { stream: createWebSocketStream(url, { WebSocket }) as Stream, done: () => {} };
  }
  if (transport === "http") {
    const stream = createHttpStream(url) as Stream;
    return { stream, done: () => void stream.writable.close().catch(() => {}) };
  }
  const [command, ...args] = JSON.parse(process.env.ACP_BRIDGE_COMMAND ?? "[]");
  const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
  const stream = v1.ndJsonStream(
    Writable.toWeb(child.stdin) as WritableStream<Uint8Array>,
    Readable.toWeb(child.stdout) as ReadableStream<Uint8Array>,
  );
  return { stream, done: () => child.kill() };
}

/** Collects session/update notifications and answers permission requests with "allow". */
class Recorder {
  updates: Json[] = [];
  permissions: Json[] = [];
  private waiters: Array<{ test: () => boolean; resolve: () => void }> = [];

  onUpdate(params: Json): void {
    this.updates.push(params);
    this.waiters = this.waiters.filter((w) => (w.test() ? (w.resolve(), false) : true));
  }

  /** While set, a permission request waits for it (a turn the client cancels). */
  held: Promise<Json> | null = null;

  onPermission(params: Json): Json | Promise<Json> {
    this.permissions.push(params);
    this.waiters = this.waiters.filter((w) => (w.test() ? (w.resolve(), false) : true));
    return this.held ?? { outcome: { outcome: "selected", optionId: "allow" } };
  }

  of(sessionId: string, from = 0): Json[] {
    return this.updates.slice(from).filter((u) => u.sessionId === sessionId).map((u) => u.update);
  }

  text(sessionId: string, kind = "agent_message_chunk", from = 0): string {
    return this.of(sessionId, from)
      .filter((u) => u.sessionUpdate === kind)
      .map((u) => (u.content?.type === "text" ? u.content.text : ""))
      .join("");
  }

  until(test: () => boolean, what: string, ms = 15000): Promise<void> {
    if (test()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
      this.waiters.push({ test, resolve: () => (clearTimeout(timer), resolve()) });
    });
  }
}

function listed(reply: Json, sessionId: string): Json | undefined {
  return (reply.sessions as Json[]).find((s) => s.sessionId === sessionId);
}

async function runV1(stream: Stream): Promise<void> {
  const seen = new Recorder();
  const cwd = `/tmp/ts-v1-${transport}`;
  await v1
    .client({ name: "acp-broker-ts-test-client-v1" })
    .onRequest(v1.methods.client.session.requestPermission, (ctx) => seen.onPermission(ctx.params) as any)
    .onNotification(v1.methods.client.session.update, (ctx) => seen.onUpdate(ctx.params))
    .connectWith(stream as any, async (ctx) => {
      const init = await ctx.request(v1.methods.agent.initialize, {
        protocolVersion: 1,
        clientCapabilities: { session: { notices: {} } },
      });
      check(init.protocolVersion === 1, "v1 negotiated");
      const caps = init.agentCapabilities?.sessionCapabilities ?? {};
      summary.capabilities = init.agentCapabilities;

      const { sessionId } = await ctx.request(v1.methods.agent.session.new, { cwd, mcpServers: [] });
      const turn = await ctx.request(v1.methods.agent.session.prompt, {
        sessionId,
        prompt: [{ type: "text", text: "hello from ts v1" }],
      });
      check(turn.stopReason === "end_turn", `prompt ended: ${JSON.stringify(turn)}`);
      check(seen.permissions.length === 1, "one permission request");
      summary.reply = seen.text(sessionId);
      check(summary.reply === "TS agent heard: hello from ts v1 (edited)", `reply ${summary.reply}`);
      await ctx.request(v1.methods.agent.session.prompt, {
        sessionId,
        prompt: [{ type: "text", text: "/notice" }],
      });
      summary.notices = seen.of(sessionId).filter((u) => u.sessionUpdate === "notice");
      check(summary.notices.length === 1, "the agent's notice, passed through");

      // Cancel a turn while its permission request waits: the request is answered
      // "cancelled" and the turn ends "cancelled".
      let release: (answer: Json) => void = () => {};
      seen.held = new Promise((resolve) => (release = resolve));
      const asked = seen.permissions.length;
      const cancelled = ctx.request(v1.methods.agent.session.prompt, {
        sessionId,
        prompt: [{ type: "text", text: "cancel me" }],
      });
      await seen.until(() => seen.permissions.length > asked, "the permission request to cancel");
      await ctx.notify(v1.methods.agent.session.cancel, { sessionId });
      release({ outcome: { outcome: "cancelled" } });
      seen.held = null;
      summary.cancelled = (await cancelled).stopReason;
      check(summary.cancelled === "cancelled", `cancelled turn ended ${summary.cancelled}`);

      const titled = await ctx.request(v1.methods.agent.session.setTitle, {
        sessionId,
        title: "TS v1 title",
      });
      check(titled.title === "TS v1 title", `set_title answered ${JSON.stringify(titled)}`);
      const list = await ctx.request(v1.methods.agent.session.list, { cwd });
      check(listed(list, sessionId)?.title === "TS v1 title", "listed with its title");

      if (caps.fork) {
        const fork = await ctx.request(v1.methods.agent.session.fork, { sessionId, cwd, mcpServers: [] });
        summary.forked = fork.sessionId !== sessionId;
        check(listed(await ctx.request(v1.methods.agent.session.list, { cwd }), fork.sessionId), "fork listed");
        const second = await ctx.request(v1.methods.agent.session.prompt, {
          sessionId: fork.sessionId,
          prompt: [{ type: "text", text: "in the fork" }],
        });
        check(second.stopReason === "end_turn", "fork prompt ended");
        await ctx.request(v1.methods.agent.session.delete, { sessionId: fork.sessionId });
      }

      await ctx.request(v1.methods.agent.session.close, { sessionId });
      const mark = seen.updates.length;
      await ctx.request(v1.methods.agent.session.load, { sessionId, cwd, mcpServers: [] });
      summary.replayedUser = seen.text(sessionId, "user_message_chunk", mark);
      summary.replayedAgent = seen.text(sessionId, "agent_message_chunk", mark);
      check(summary.replayedUser.startsWith("hello from ts v1"), `load replayed ${summary.replayedUser}`);
      const replayedNotices = seen.of(sessionId, mark).filter((u) => u.sessionUpdate === "notice");
      check(replayedNotices.length === 0, "notices are not replayed");
      const resumed = await ctx.request(v1.methods.agent.session.resume, { sessionId, cwd });
      check(resumed !== undefined, "resumed");

      await ctx.request(v1.methods.agent.session.delete, { sessionId });
      check(!listed(await ctx.request(v1.methods.agent.session.list, { cwd }), sessionId), "deleted");
      summary.updates = seen.updates.length;
    });
}

async function runV2(stream: Stream): Promise<void> {
  const seen = new Recorder();
  const cwd = `/tmp/ts-v2-${transport}`;
  const idle = (sessionId: string, from: number) => () =>
    seen.of(sessionId, from).some((u) => u.sessionUpdate === "state_update" && u.state === "idle");
  await v2
    .client({ name: "acp-broker-ts-test-client-v2" })
    .onRequest(v2.methods.client.session.requestPermission, (ctx) => seen.onPermission(ctx.params) as any)
    .onNotification(v2.methods.client.session.update, (ctx) => seen.onUpdate(ctx.params))
    .connectWith(stream as any, async (ctx) => {
      const init = await ctx.request(v2.methods.agent.initialize, {
        protocolVersion: 2,
        info: { name: "acp-broker-ts-test-client-v2", version: "1.0.0" },
        capabilities: {},
      });
      check(init.protocolVersion === 2, "v2 negotiated");
      const caps = init.capabilities?.session ?? {};
      summary.capabilities = init.capabilities;

      const { sessionId } = await ctx.request(v2.methods.agent.session.new, { cwd });
      let mark = seen.updates.length;
      const accepted = await ctx.request(v2.methods.agent.session.prompt, {
        sessionId,
        prompt: [{ type: "text", text: "hello from ts v2" }],
      });
      check(typeof accepted.messageId === "string", `prompt accepted ${JSON.stringify(accepted)}`);
      await seen.until(idle(sessionId, mark), "the turn's idle state_update");
      const user = seen.of(sessionId, mark).find((u) => u.sessionUpdate === "user_message");
      check(user?.messageId === accepted.messageId, "user_message carries the reply's messageId");
      check(seen.permissions.length === 1, "one permission request");
      summary.reply = seen.text(sessionId, "agent_message_chunk", mark);
      check(summary.reply === "TS agent heard: hello from ts v2 (edited)", `reply ${summary.reply}`);
      summary.messageId = accepted.messageId;
      mark = seen.updates.length;
      await ctx.request(v2.methods.agent.session.prompt, {
        sessionId,
        prompt: [{ type: "text", text: "/notice" }],
      });
      await seen.until(idle(sessionId, mark), "the /notice turn");
      summary.notices = seen.of(sessionId, mark).filter((u) => u.sessionUpdate === "notice");
      check(summary.notices.length === 1, "the agent's notice, passed through");

      const titled = await ctx.request(v2.methods.agent.session.setTitle, {
        sessionId,
        title: "TS v2 title",
      });
      check(titled.title === "TS v2 title", `set_title answered ${JSON.stringify(titled)}`);
      const list = await ctx.request(v2.methods.agent.session.list, { cwd });
      check(listed(list, sessionId)?.title === "TS v2 title", "listed with its title");

      if (caps.fork) {
        const fork = await ctx.request(v2.methods.agent.session.fork, { sessionId, cwd });
        summary.forked = fork.sessionId !== sessionId;
        check(listed(await ctx.request(v2.methods.agent.session.list, { cwd }), fork.sessionId), "fork listed");
        mark = seen.updates.length;
        await ctx.request(v2.methods.agent.session.prompt, {
          sessionId: fork.sessionId,
          prompt: [{ type: "text", text: "in the fork" }],
        });
        await seen.until(idle(fork.sessionId, mark), "the fork's turn");
        await ctx.request(v2.methods.agent.session.delete, { sessionId: fork.sessionId });
      }

      await ctx.request(v2.methods.agent.session.close, { sessionId });
      mark = seen.updates.length;
      await ctx.request(v2.methods.agent.session.resume, {
        sessionId,
        cwd,
        replayFrom: { type: "start" },
      });
      const replayed = seen.of(sessionId, mark);
      const again = replayed.find((u) => u.sessionUpdate === "user_message");
      check(!replayed.some((u) => u.sessionUpdate === "notice"), "notices are not replayed");
      check(again?.messageId === accepted.messageId, "replay keeps the message id");
      summary.replayedAgent = seen.text(sessionId, "agent_message_chunk", mark);
      await ctx.request(v2.methods.agent.session.resume, { sessionId, cwd });

      await ctx.request(v2.methods.agent.session.delete, { sessionId });
      check(!listed(await ctx.request(v2.methods.agent.session.list, { cwd }), sessionId), "deleted");
      summary.updates = seen.updates.length;
    });
}

const { stream, done } = open();
try {
  await (version === "v2" ? runV2(stream) : runV1(stream));
  summary.ok = true;
} catch (error) {
  summary.ok = false;
  summary.error = error instanceof Error ? `${error.message}\n${error.stack}` : String(error);
  process.exitCode = 1;
} finally {
  done();
}
console.log(JSON.stringify(summary));
process.exit(process.exitCode ?? 0);
