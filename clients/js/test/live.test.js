// The client against a live server: AGENTS_CLIENT_TEST_URL is its address and AGENTS_CLIENT_TEST_KEY an API key of
// it (tests/test_client_js.py starts one with the example agents and runs these). Without the URL they are skipped.
import assert from "node:assert/strict";
import net from "node:net";
import { describe, test } from "node:test";

import { AgentsClient, AgentsError, VERSION } from "../src/index.js";

const BASE = process.env.AGENTS_CLIENT_TEST_URL;
const KEY = process.env.AGENTS_CLIENT_TEST_KEY;
const skip = BASE ? false : "AGENTS_CLIENT_TEST_URL is not set: no server to test against";

/** A TCP proxy in front of the server that cuts connections as a network would: all of them when told, and each
 * after the number of answer bytes `limits` gives it (in the order they were made; none past the list's end); or
 * silences them, dropping what the server sends without closing anything. It keeps each request's head. */
class Proxy {
  constructor(target, limits = []) {
    this.target = new URL(target);
    this.limits = [...limits];
    this.sockets = new Set();
    this.silenced = new Set();
    this.heads = [];
    this.server = net.createServer((client) => {
      const upstream = net.connect(Number(this.target.port), this.target.hostname);
      let head = "";
      let left = this.limits.length ? this.limits.shift() : Infinity;
      client.on("data", (chunk) => {
        if (!head.includes("\r\n\r\n")) {
          head += chunk.toString("latin1");
          if (head.includes("\r\n\r\n")) this.heads.push(head.split("\r\n\r\n")[0]);
        }
        upstream.write(chunk);
      });
      upstream.on("data", (chunk) => {
        if (this.silenced.has(upstream)) return;
        if (chunk.length < left) {
          left -= chunk.length;
          client.write(chunk);
          return;
        }
        client.end(chunk.subarray(0, left), () => client.destroy()); // mid-frame, most likely
        upstream.destroy();
      });
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on("error", () => {});
        socket.on("close", () => {
          this.sockets.delete(socket);
          client.destroy();
          upstream.destroy();
        });
      }
    });
  }

  async start() {
    await new Promise((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${this.server.address().port}`;
  }

  cut() {
    for (const socket of this.sockets) socket.destroy();
  }

  silence() {
    for (const socket of this.sockets) this.silenced.add(socket);
  }

  stop() {
    this.cut();
    return new Promise((resolve) => this.server.close(resolve));
  }
}

const client = new AgentsClient({ baseUrl: BASE, apiKey: KEY, reconnectDelay: 50 });

async function until(predicate, what, ms = 30_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The stored events of a thread from the start, read in one uninterrupted stream up to `seq`. */
async function reference(threadId, seq) {
  const out = [];
  if (seq === 0) return out;
  for await (const item of client.events.stream(threadId)) {
    if (item.seq === null) continue;
    out.push([item.seq, item.event]);
    if (item.seq >= seq) break;
  }
  return out;
}

describe("the client against a live server", { skip }, () => {
  test("health and agents", async () => {
    assert.deepEqual(await client.health(), { status: "ok", version: VERSION }); // the server's version is the client's
    const agents = await client.agents.list();
    assert.ok(agents.some((a) => a.name === "assistant"));
    const assistant = await client.agents.get("assistant");
    assert.equal(assistant.side_a.prompt, "assistant");
  });

  test("a chat loop: post and wait, twice; the second turn runs a tool", async () => {
    const thread = await client.threads.create({ agent: "assistant", name: "chat loop" });
    assert.equal(thread.status, "idle");
    const hello = await client.messages.post(thread.id, "hello", { wait: 30 });
    assert.equal(hello.done, true);
    assert.equal(hello.outcome, "completed");
    assert.match(hello.messages.at(-1).content, /demo assistant/);

    const turn = await client.messages.post(thread.id, { content: "What is 12 * (3 + 4)?" }, { wait: 30 });
    assert.equal(turn.done, true);
    assert.equal(turn.status, "idle");
    const [asked, call, result, answer] = turn.messages;
    assert.equal(asked.id, turn.message_id);
    assert.equal(call.tool_calls[0].function.name, "calculate");
    assert.deepEqual(JSON.parse(call.tool_calls[0].function.arguments), { expression: "12 * (3 + 4)" });
    assert.equal(result.role, "tool");
    assert.equal(result.content, "84");
    assert.equal(answer.content, "The answer is 84.");

    const queued = await client.messages.post(thread.id, "2 + 2");
    assert.equal(queued.status, "queued");
    const listed = await until(async () => {
      const page = await client.messages.list(thread.id, { order: "desc", limit: 1 });
      return page.messages[0]?.content === "The answer is 4." && page;
    }, "the third answer");
    assert.equal(listed.next_cursor !== undefined, true);
    const one = await client.messages.get(thread.id, turn.message_id);
    assert.equal(one.content, "What is 12 * (3 + 4)?");

    const edited = await client.messages.edit(thread.id, turn.message_id, "What is 12 * 7?");
    assert.equal(edited.content, "What is 12 * 7?");
    assert.equal(await client.messages.delete(thread.id, call.id), null); // the call takes its result along
    const left = (await client.messages.list(thread.id, { limit: 50 })).messages.map((m) => m.id);
    assert.ok(!left.includes(call.id) && !left.includes(result.id) && left.includes(answer.id));

    const { threads } = await client.threads.list({ agent: "assistant", parent_id: "none" });
    assert.ok(threads.some((t) => t.id === thread.id));
    const renamed = await client.threads.update(thread.id, { name: "renamed", tags: ["js"] });
    assert.deepEqual([renamed.name, renamed.tags], ["renamed", ["js"]]);
    assert.equal((await client.threads.get(thread.id)).name, "renamed");
    const logs = await client.threads.logs(thread.id, { kind: "tool" });
    assert.ok(logs.logs.some((l) => l.tool === "calculate"));
    const entry = await client.threads.log(thread.id, logs.logs[0].id);
    assert.equal(entry.id, logs.logs[0].id);
    assert.ok("request_full" in entry);
    assert.deepEqual((await client.threads.delete(thread.id)).deleted, [thread.id]);
  });

  test("a stream dropped three times resumes with neither a gap nor a duplicate", async () => {
    const thread = await client.threads.create({ agent: "assistant" });
    await client.messages.post(thread.id, "What is 6 * 7?", { wait: 30 }); // a turn's events, stored
    const proxy = new Proxy(BASE, [1500]); // the first connection ends in the middle of the replay
    const proxied = new AgentsClient({ baseUrl: await proxy.start(), apiKey: KEY, reconnectDelay: 50 });
    const seen = [];
    const chunks = [];
    let opened = 0;
    let retried = 0;
    let turns = 0;
    const controller = new AbortController();
    const reading = (async () => {
      const stream = proxied.events.stream(thread.id, {
        signal: controller.signal,
        onOpen: () => (opened += 1),
        onRetry: () => (retried += 1),
      });
      for await (const item of stream) {
        if (item.seq === null) chunks.push(item);
        else seen.push([item.seq, item.event]);
        if (turns === 1 && item.event === "step_started") proxy.cut(); // mid-turn
        if (item.event === "turn_ended" && (turns += 1) === 2) break;
      }
    })();
    try {
      await until(() => turns === 1, "the replay of the first turn");
      proxy.cut(); // between turns: the stream resumes where it was
      await until(() => opened === 3, "the stream to reopen");
      assert.equal((await client.messages.post(thread.id, "What is 2 * 21?", { wait: 30 })).outcome, "completed");
      await reading;
    } finally {
      controller.abort();
      await proxy.stop();
    }
    assert.ok(opened >= 4 && retried >= 3, `opened ${opened}, retried ${retried}`);
    const seqs = seen.map(([seq]) => seq);
    assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b), "seen twice or out of order");
    assert.deepEqual(seen, await reference(thread.id, seqs.at(-1)), "a gap: the stream left an event out");
    assert.ok(chunks.every((c) => c.event === "message_chunk"));
    const agent = proxy.heads.find((h) => h.startsWith("GET /threads/"));
    const name = `standard-agents-client-js/${VERSION}`.replaceAll(".", "\\.");
    assert.match(agent, new RegExp(`\\r\\nuser-agent: ${name}(\\r\\n|$)`, "i"));
    assert.match(proxy.heads.at(-1), /\r\nlast-event-id: \d+/i);
  });

  test("a stream gone silent (a network that drops it without a word) is resumed", async () => {
    const thread = await client.threads.create({ agent: "assistant" });
    const proxy = new Proxy(BASE);
    const baseUrl = await proxy.start();
    const proxied = new AgentsClient({ baseUrl, apiKey: KEY, reconnectDelay: 50, idleTimeout: 500 });
    let opened = 0;
    const seen = [];
    const controller = new AbortController();
    const reading = (async () => {
      const stream = proxied.events.stream(thread.id, { signal: controller.signal, onOpen: () => (opened += 1) });
      for await (const item of stream) {
        if (item.seq !== null) seen.push(item.event);
        if (item.event === "turn_ended") break;
      }
    })();
    try {
      await until(() => opened === 1, "the stream to open");
      proxy.silence(); // what the server sends goes nowhere now; the connection stays open
      assert.equal((await client.messages.post(thread.id, "What is 3 * 3?", { wait: 30 })).outcome, "completed");
      await reading;
    } finally {
      controller.abort();
      await proxy.stop();
    }
    assert.ok(opened >= 2, `opened ${opened}`);
    assert.deepEqual(seen.slice(-1), ["turn_ended"]);
  });

  test("since and the lifecycle stream", async () => {
    const controller = new AbortController();
    const lifecycle = client.events.lifecycle({ signal: controller.signal });
    const created = client.threads.create({ agent: "assistant" });
    let seen;
    for await (const item of lifecycle) {
      if (item.event === "thread_created" && item.data.thread_id === (await created).id) {
        seen = item;
        break;
      }
    }
    assert.equal(seen.data.agent, "assistant");
    const thread = await created;
    await client.messages.post(thread.id, "What is 1 + 1?", { wait: 30 });
    const all = await reference(thread.id, 1);
    assert.equal(all[0][0], 1);
    for await (const item of client.events.stream(thread.id, { since: 3 })) {
      assert.equal(item.seq, 4); // nothing before it, replayed after `since`
      break;
    }
  });

  test("files: an upload, a listing, a search, a download, a conditional download, a deletion", async () => {
    const thread = await client.threads.create({ agent: "assistant" });
    const record = await client.files.upload(thread.id, "/notes/to do.md", "# Plan\nTODO: ship\n", {
      contentType: "text/markdown",
    });
    assert.deepEqual([record.path, record.name, record.size, record.mime_type], [
      "/notes/to do.md",
      "to do.md",
      18,
      "text/markdown",
    ]);
    const bytes = new Uint8Array([0, 1, 2, 250, 255]);
    await client.files.upload(thread.id, "bin/data.bin", new Blob([bytes]));
    const root = await client.files.list(thread.id);
    assert.deepEqual(root.entries.map((e) => e.name).sort(), ["bin", "notes"]);
    assert.deepEqual((await client.files.list(thread.id, "/notes")).entries.map((e) => e.name), ["to do.md"]);
    assert.deepEqual(await client.files.stats(thread.id), { files: 2, directories: 2, bytes: 23 });
    const grep = await client.files.grep(thread.id, "TODO");
    assert.deepEqual(grep.matches, [{ path: "/notes/to do.md", line: 2, text: "TODO: ship" }]);
    assert.deepEqual((await client.files.find(thread.id, "*.bin")).entries.map((e) => e.path), ["/bin/data.bin"]);

    const text = await client.files.download(thread.id, "/notes/to do.md");
    assert.equal(await text.text(), "# Plan\nTODO: ship\n");
    const etag = text.headers.get("etag");
    assert.equal(etag, `"${record.etag}"`);
    const data = await client.files.download(thread.id, "/bin/data.bin");
    assert.deepEqual(new Uint8Array(await data.arrayBuffer()), bytes);
    const unchanged = await client.files.download(thread.id, "/notes/to do.md", { ifNoneMatch: etag });
    assert.equal(unchanged.status, 304);

    assert.deepEqual(await client.files.delete(thread.id, "/bin/data.bin"), { deleted: "/bin/data.bin" });
    const missing = await client.files.download(thread.id, "/bin/data.bin").catch((e) => e);
    assert.ok(missing instanceof AgentsError);
    assert.deepEqual([missing.status, missing.code], [404, "file_not_found"]);
  });

  test("attachments: a multipart message with files, and base64 attachments in JSON", async () => {
    const thread = await client.threads.create({ agent: "assistant" });
    const turn = await client.messages.post(
      thread.id,
      {
        content: "Here are my notes",
        metadata: { from: "js" },
        files: [
          new File(["alpha"], "a.txt", { type: "text/plain" }),
          { name: "b.csv", data: "x,y\n1,2\n", type: "text/csv" },
        ],
      },
      { wait: 30 },
    );
    const [input] = turn.messages;
    assert.equal(input.content, "Here are my notes");
    assert.deepEqual(input.metadata, { from: "js" });
    assert.deepEqual(input.attachments.map((a) => a.name), ["a.txt", "b.csv"]);
    const stored = input.attachments[0].path;
    assert.match(stored, /^\/attachments\//);
    assert.equal(await (await client.files.download(thread.id, stored)).text(), "alpha");
    const json = await client.messages.post(thread.id, {
      content: "one more",
      attachments: [{ name: "c.txt", mime_type: "text/plain", data: btoa("gamma") }],
    });
    assert.equal(json.status, "queued");
  });

  test("the variables bootstrap: a subagent waits for a scoped variable, which is provided", async () => {
    const thread = await client.threads.create({ agent: "launch", env: { PUBLISH: "yes" } });
    const turn = await client.messages.post(thread.id, "Write the launch note", { wait: 120 });
    assert.equal(turn.done, true);
    const { session } = await client.threads.get(thread.id);
    const endpoint = session.result.content.split(" ").at(-1);
    const requestId = endpoint.split("/").at(-1);
    const request = await client.variables.get(thread.id, requestId);
    assert.deepEqual([request.required, request.missing, request.status], [["CMS_TOKEN"], ["CMS_TOKEN"], "pending"]);
    const early = await client.variables.provide(thread.id, requestId, {}).catch((e) => e);
    assert.deepEqual([early.status, early.code], [400, "missing_variables"]);
    const done = await client.variables.provide(thread.id, requestId, { CMS_TOKEN: "tok_123" });
    assert.equal(done.status, "success");
    assert.equal((await client.variables.get(thread.id, requestId)).child_thread_id, done.child_thread_id);
    const again = await client.variables.provide(thread.id, requestId, { CMS_TOKEN: "tok_123" }).catch((e) => e);
    assert.deepEqual([again.status, again.code], [409, "already_used"]);
    const { subagents } = await client.threads.subagents(thread.id);
    assert.ok(subagents.some((s) => s.reference === done.child_thread_id));
  });

  test("errors carry the server's envelope", async () => {
    const missing = await client.threads.get(crypto.randomUUID()).catch((e) => e);
    assert.ok(missing instanceof AgentsError && missing instanceof Error);
    assert.deepEqual([missing.status, missing.code], [404, "thread_not_found"]);
    assert.match(missing.message, /not found/);
    const invalid = await client.threads.create({ agent: "assistant", tags: "not a list" }).catch((e) => e);
    assert.deepEqual([invalid.status, invalid.code], [422, "invalid_request"]);
    assert.equal(invalid.details.problems[0].field, "tags");
    const noAgent = await client.agents.get("nobody").catch((e) => e);
    assert.equal(noAgent.code, "agent_not_found");
    const stranger = new AgentsClient({ baseUrl: BASE, apiKey: "sa_not_a_key" });
    const refused = await stranger.threads.list().catch((e) => e);
    assert.deepEqual([refused.status, refused.code], [401, "unauthorized"]);
    const stream = stranger.events.lifecycle();
    await assert.rejects(stream.next(), (e) => e instanceof AgentsError && e.code === "unauthorized");
  });

  test("stop, continue, terminate; stream tokens, effects, custom endpoints, env", async () => {
    const thread = await client.threads.create({ agent: "assistant" });
    await client.messages.post(thread.id, "remind me in 600 seconds to stretch", { wait: 30 });
    const { effects } = await client.effects.list(thread.id);
    assert.equal(effects.length, 1);
    assert.equal((await client.effects.cancel(thread.id, effects[0].id)).status, "cancelled");

    const summary = await client.endpoints.call(thread.id, "summary");
    assert.deepEqual([summary.thread_id, summary.agent], [thread.id, "assistant"]);
    const nowhere = await client.endpoints.call(thread.id, "nowhere").catch((e) => e);
    assert.equal(nowhere.code, "endpoint_not_found");

    const minted = await client.streamTokens.create({ thread_id: thread.id });
    assert.equal(minted.url, `/threads/${thread.id}/events?token=${minted.token}`);
    assert.ok(minted.expires_in > 0);

    assert.equal((await client.threads.stop(thread.id)).status, "stopped");
    assert.notEqual((await client.threads.continue(thread.id)).status, "stopped");
    const noSide = await client.threads.continue(thread.id, { side: "b" }).catch((e) => e);
    assert.equal(noSide.code, "no_such_side");
    assert.equal((await client.threads.terminate(thread.id)).status, "terminated");
    const late = await client.messages.post(thread.id, "hello?").catch((e) => e);
    assert.deepEqual([late.status, late.code], [409, "thread_terminated"]);

    const set = await client.env.set("user", "JS_CLIENT_TEST", "on");
    assert.deepEqual(set, { name: "JS_CLIENT_TEST", type: "text", value: "on" });
    assert.equal((await client.env.list("user")).env.JS_CLIENT_TEST, "on");
    assert.equal((await client.env.get("user", "JS_CLIENT_TEST")).value, "on");
    await client.env.delete("user", "JS_CLIENT_TEST");
    const gone = await client.env.get("user", "JS_CLIENT_TEST").catch((e) => e);
    assert.equal(gone.status, 404);
  });
});
