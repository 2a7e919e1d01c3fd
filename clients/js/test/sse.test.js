// The SSE reader on its own: frames split anywhere, CR, LF and CRLF line ends, comments, an unfinished last frame.
import assert from "node:assert/strict";
import { test } from "node:test";

import { readEvents } from "../src/index.js";

function body(...pieces) {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const piece of pieces) controller.enqueue(encoder.encode(piece));
      controller.close();
    },
  });
}

async function frames(...pieces) {
  const out = [];
  for await (const frame of readEvents(body(...pieces))) out.push(frame);
  return out;
}

test("frames split across reads, with every kind of line end", async () => {
  const text =
    'id: 1\nevent: thread_status\ndata: {"status": "running"}\n\n' +
    ": ping - now\r\n\r\n" +
    "id: 2\r\nevent: x\r\ndata: a\r\ndata: b\r\n\r\n" +
    'event: message_chunk\rdata: {"chunk": "é"}\r\r';
  const whole = await frames(text);
  assert.deepEqual(whole, [
    { event: "thread_status", id: "1", data: '{"status": "running"}' },
    { event: "x", id: "2", data: "a\nb" },
    { event: "message_chunk", id: null, data: '{"chunk": "é"}' },
  ]);
  const bytes = new TextEncoder().encode(text);
  for (let cut = 1; cut < bytes.length; cut += 1) {
    // every split point, a multi-byte character's middle and a CRLF's middle included
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(bytes.slice(0, cut));
        controller.enqueue(bytes.slice(cut));
        controller.close();
      },
    });
    const out = [];
    for await (const frame of readEvents(stream)) out.push(frame);
    assert.deepEqual(out, whole, `split at ${cut}`);
  }
});

test("an unfinished frame at the end of the body is dropped, not dispatched", async () => {
  assert.deepEqual(await frames("id: 1\nevent: a\ndata: {}\n\nid: 2\nevent: b\ndata: {"), [
    { event: "a", id: "1", data: "{}" },
  ]);
});

test("a frame without an event name is a `message`; one without data is none", async () => {
  assert.deepEqual(await frames("data: hi\n\nevent: nothing\n\n"), [{ event: "message", id: null, data: "hi" }]);
});
