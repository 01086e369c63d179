#!/usr/bin/env node
// An ACP v1 agent written with the official TypeScript SDK (@agentclientprotocol/sdk), in the
// style of the SDK's example agent, for acp-broker's tests: the broker runs it as any agent
// (a stdio subprocess). Each prompt streams a reply, reports a tool call and asks the client's
// permission for it; a prompt starting with /notice gets a notice instead. Sessions live in memory; it supports session/load (replaying its
// history), session/resume, session/close and, from the unstable surface, session/fork.

import { Readable, Writable } from "node:stream";
import { randomUUID } from "node:crypto";

import * as acp from "@agentclientprotocol/sdk/unstable";

type Entry = { role: "user" | "agent"; text: string };

interface Session {
  cwd: string;
  history: Entry[];
  pending: AbortController | null;
}

const sessions = new Map<string, Session>();

function session(sessionId: string): Session {
  const found = sessions.get(sessionId);
  if (!found) {
    throw acp.RequestError.invalidParams({ sessionId, reason: "unknown session" });
  }
  return found;
}

function textOf(prompt: acp.ContentBlock[]): string {
  return prompt
    .map((block) => (block.type === "text" ? block.text : `[${block.type}]`))
    .join(" ");
}

async function say(client: acp.AgentContext, sessionId: string, text: string): Promise<void> {
  await client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
  });
}

async function turn(
  client: acp.AgentContext,
  sessionId: string,
  text: string,
  signal: AbortSignal,
): Promise<acp.StopReason> {
  if (text.startsWith("/notice")) {
    await client.notify(acp.methods.client.session.update, {
      sessionId,
      update: {
        sessionUpdate: "notice",
        severity: "info",
        title: "TS agent notice",
        description: "a notice from the agent",
      },
    });
    return "end_turn";
  }
  const reply = `TS agent heard: ${text}`;
  for (const word of reply.split(/(?<= )/)) {
    if (signal.aborted) return "cancelled";
    await say(client, sessionId, word);
  }
  const toolCallId = `call_${randomUUID().slice(0, 8)}`;
  const call = {
    toolCallId,
    title: "Edit config.json",
    kind: "edit" as const,
    status: "pending" as const,
    locations: [{ path: "/project/config.json" }],
  };
  await client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "tool_call", ...call },
  });
  const answer = await client.request(acp.methods.client.session.requestPermission, {
    sessionId,
    toolCall: call,
    options: [
      { optionId: "allow", name: "Allow", kind: "allow_once" },
      { optionId: "reject", name: "Reject", kind: "reject_once" },
    ],
  });
  if (answer.outcome.outcome === "cancelled" || signal.aborted) return "cancelled";
  const allowed = answer.outcome.optionId === "allow";
  await client.notify(acp.methods.client.session.update, {
    sessionId,
    update: {
      sessionUpdate: "tool_call_update",
      toolCallId,
      status: allowed ? "completed" : "failed",
    },
  });
  await say(client, sessionId, allowed ? " (edited)" : " (skipped)");
  return "end_turn";
}

const input = Writable.toWeb(process.stdout);
const output = Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>;

acp
  .agent({ name: "acp-broker-ts-test-agent" })
  .onRequest(acp.methods.agent.initialize, () => ({
    protocolVersion: acp.PROTOCOL_VERSION,
    agentCapabilities: {
      loadSession: true,
      promptCapabilities: { embeddedContext: true },
      sessionCapabilities: { resume: {}, close: {}, fork: {} },
    },
    agentInfo: { name: "acp-broker-ts-test-agent", version: "1.0.0" },
  }))
  .onRequest(acp.methods.agent.session.new, (ctx) => {
    const sessionId = `ts_${randomUUID()}`;
    sessions.set(sessionId, { cwd: ctx.params.cwd, history: [], pending: null });
    return { sessionId };
  })
  .onRequest(acp.methods.agent.session.load, async (ctx) => {
    const found = session(ctx.params.sessionId);
    for (const entry of found.history) {
      const kind = entry.role === "user" ? "user_message_chunk" : "agent_message_chunk";
      await ctx.client.notify(acp.methods.client.session.update, {
        sessionId: ctx.params.sessionId,
        update: { sessionUpdate: kind, content: { type: "text", text: entry.text } },
      });
    }
    return {};
  })
  .onRequest(acp.methods.agent.session.resume, (ctx) => {
    session(ctx.params.sessionId);
    return {};
  })
  .onRequest(acp.methods.agent.session.fork, (ctx) => {
    const parent = session(ctx.params.sessionId);
    const sessionId = `ts_${randomUUID()}`;
    sessions.set(sessionId, { cwd: ctx.params.cwd, history: [...parent.history], pending: null });
    return { sessionId };
  })
  .onRequest(acp.methods.agent.session.close, (ctx) => {
    sessions.get(ctx.params.sessionId)?.pending?.abort();
    sessions.delete(ctx.params.sessionId);
    return {};
  })
  .onRequest(acp.methods.agent.session.prompt, async (ctx) => {
    const found = session(ctx.params.sessionId);
    found.pending?.abort();
    const pending = new AbortController();
    found.pending = pending;
    const text = textOf(ctx.params.prompt);
    found.history.push({ role: "user", text });
    const stopReason = await turn(ctx.client, ctx.params.sessionId, text, pending.signal);
    found.history.push({ role: "agent", text: `TS agent heard: ${text}` });
    found.pending = null;
    return { stopReason };
  })
  .onNotification(acp.methods.agent.session.cancel, (ctx) => {
    sessions.get(ctx.params.sessionId)?.pending?.abort();
  })
  .connect(acp.ndJsonStream(input, output));
