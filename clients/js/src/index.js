// standard-agents-client: a client of the Standard Agents runtime's HTTP API (docs/http-api.md, docs/events.md).
// One ES module, no dependencies: it runs as it is in browsers and in Node >= 18 (global `fetch`). Request bodies,
// answers and query parameters are the API's own, spelled as the API spells them (`parent_id`, `include_silent`);
// options only the client knows (`signal`, `onOpen`) are camelCase.
//
// This file is also served to the playground as `app/playground/client.js`, a byte-identical copy that
// tests/test_client_js.py checks: edit this one, then `cp clients/js/src/index.js app/playground/client.js`.

export const VERSION = "0.1.0";

const CLIENT = `standard-agents-client-js/${VERSION}`;
// Node (and runtimes that pose as it) may set User-Agent; a browser may not, so it names the client in `X-Client`,
// a header the server's CORS answer allows.
const IN_NODE = typeof process !== "undefined" && process.versions != null && process.versions.node != null;

// Every event type of each stream, from the server's table (app/event_types.py): `EventSource` calls a listener
// only for the types it was registered for.
export const THREAD_EVENTS = Object.freeze([
  "message_data",
  "message_deleted",
  "message_chunk",
  "reasoning_chunk",
  "step_started",
  "step_completed",
  "llm_request",
  "llm_response",
  "fallback_triggered",
  "tool_started",
  "tool_completed",
  "turn_ended",
  "session_ended",
  "thread_status",
  "stopped_by_user",
  "thread_terminated",
  "agent_handoff",
  "subagent_created",
  "subagent_status",
  "event",
  "error",
  "events_missed",
]);
export const LIFECYCLE_EVENTS = Object.freeze(["thread_created", "thread_updated", "thread_deleted", "events_missed"]);

/** A failure the server answered (its error envelope `{error: {code, message, details}}`), or an answer that was
 * not one (`code` `http_<status>`). */
export class AgentsError extends Error {
  constructor({ status, code, message, details = null, headers = null }) {
    super(message);
    this.name = "AgentsError";
    this.status = status;
    this.code = code;
    this.details = details;
    this.headers = headers;
  }

  static async from(response) {
    let code = `http_${response.status}`;
    let message = response.statusText || `HTTP ${response.status}`;
    let details = null;
    try {
      const { error } = await response.json();
      if (error && typeof error.code === "string") {
        ({ code, message } = error);
        details = error.details ?? null;
      }
    } catch {
      // not the envelope (a proxy's page): the status line says what there is
    }
    return new AgentsError({ status: response.status, code, message, details, headers: response.headers });
  }
}

const segments = (path) =>
  String(path)
    .split("/")
    .filter((s) => s !== "")
    .map(encodeURIComponent)
    .join("/");

function query(params = {}) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null) search.append(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

function linked(signal) {
  // a controller of our own, aborted with the caller's signal, so that ending an iteration can abort the fetch too
  const controller = new AbortController();
  if (signal?.aborted) controller.abort();
  else signal?.addEventListener("abort", () => controller.abort(), { once: true });
  return controller;
}

/** Server-Sent Event frames read from a `ReadableStream` of bytes (an answer's `body`): `{event, id, data}` with
 * `id` `null` when the frame had none; comments are skipped, and an unfinished frame at the end is dropped. */
export async function* readEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let frame = { event: "", id: null, data: [] };
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      finished = done;
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      for (;;) {
        const end = buffer.search(/\r\n|\r|\n/);
        // a CR at the very end may be the first half of a CRLF: wait for the next bytes
        if (end < 0 || (end === buffer.length - 1 && buffer[end] === "\r" && !done)) break;
        const line = buffer.slice(0, end);
        buffer = buffer.slice(buffer.startsWith("\r\n", end) ? end + 2 : end + 1);
        if (line === "") {
          if (frame.data.length) yield { event: frame.event || "message", id: frame.id, data: frame.data.join("\n") };
          frame = { event: "", id: null, data: [] };
          continue;
        }
        if (line.startsWith(":")) continue; // a comment: the server's keep-alive
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") frame.data.push(value);
        else if (field === "event") frame.event = value;
        else if (field === "id" && !value.includes("\0")) frame.id = value;
      }
      if (done) return;
    }
  } finally {
    if (!finished) await reader.cancel().catch(() => {}); // the reader stopped early: close the connection
    reader.releaseLock();
  }
}

function parsed(event, id, text) {
  let data = text;
  try {
    data = JSON.parse(text);
  } catch {
    // every event the server sends is JSON; anything else is handed on as text
  }
  const seq = id === null || id === undefined || id === "" ? null : Number(id);
  return { event, seq: Number.isFinite(seq) ? seq : null, data };
}

/** Items pushed by callbacks (an `EventSource`'s listeners), read as an async iterator. */
class Channel {
  constructor(onReturn) {
    this.items = [];
    this.waiting = null;
    this.failure = null;
    this.ended = false;
    this.onReturn = onReturn;
  }

  push(item) {
    if (this.ended) return;
    if (this.waiting) {
      this.waiting.resolve({ value: item, done: false });
      this.waiting = null;
    } else this.items.push(item);
  }

  fail(error) {
    if (this.ended) return;
    this.failure = error;
    this.finish();
  }

  finish() {
    if (this.ended) return;
    this.ended = true;
    this.onReturn();
    if (this.waiting) {
      if (this.failure && !this.items.length) this.waiting.reject(this.failure);
      else this.waiting.resolve({ value: undefined, done: true });
      this.waiting = null;
    }
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  next() {
    if (this.items.length) return Promise.resolve({ value: this.items.shift(), done: false });
    if (this.ended) {
      const failure = this.failure;
      this.failure = null;
      return failure ? Promise.reject(failure) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
    });
  }

  return() {
    this.finish();
    this.items = [];
    return Promise.resolve({ value: undefined, done: true });
  }
}

export class AgentsClient {
  /**
   * @param {object} [options]
   * @param {string} [options.baseUrl] the server's address (`http://localhost:8000`); "" for the page's own origin
   * @param {string} [options.apiKey] an API key, sent as `Authorization: Bearer`; none in open mode
   * @param {typeof fetch} [options.fetch] the `fetch` to use (default: the global one)
   * @param {typeof EventSource} [options.EventSource] the `EventSource` for `events.source` (default: the global)
   * @param {Record<string, string>} [options.headers] more headers for every request
   * @param {number} [options.reconnectDelay] ms before a stream reconnects, doubled while it fails (default 1000)
   * @param {number} [options.maxReconnectDelay] the longest wait between reconnects in ms (default 15000)
   * @param {number} [options.idleTimeout] ms a `fetch` stream may stay silent before it is taken for dropped and
   *   resumed (default 45000: the server sends a keep-alive every 15 s)
   */
  constructor(options = {}) {
    this.baseUrl = String(options.baseUrl ?? "").replace(/\/+$/, "");
    this.apiKey = options.apiKey || null;
    this.fetchImpl = options.fetch ?? globalThis.fetch?.bind(globalThis);
    this.EventSourceImpl = options.EventSource ?? globalThis.EventSource;
    this.headers = { ...(options.headers ?? {}) };
    this.reconnectDelay = options.reconnectDelay ?? 1000;
    this.maxReconnectDelay = options.maxReconnectDelay ?? 15000;
    this.idleTimeout = options.idleTimeout ?? 45000;
    if (typeof this.fetchImpl !== "function") throw new Error("No global `fetch`: pass one as `options.fetch`.");

    const thread = (id) => `/threads/${encodeURIComponent(id)}`;
    const fs = (id, path) => `${thread(id)}/fs/${segments(path)}`;

    this.agents = {
      list: (opts) => this.request("GET", "/agents", opts),
      get: (name, opts) => this.request("GET", `/agents/${encodeURIComponent(name)}`, opts),
    };

    this.threads = {
      create: (body, opts) => this.request("POST", "/threads", { ...opts, body }),
      list: (params = {}, opts) => this.request("GET", `/threads${query(params)}`, opts),
      get: (id, opts) => this.request("GET", thread(id), opts),
      update: (id, patch, opts) => this.request("PATCH", thread(id), { ...opts, body: patch }),
      delete: (id, opts) => this.request("DELETE", thread(id), opts),
      stop: (id, opts) => this.request("POST", `${thread(id)}/stop`, opts),
      continue: (id, body = {}, opts) => this.request("POST", `${thread(id)}/continue`, { ...opts, body }),
      terminate: (id, opts) => this.request("POST", `${thread(id)}/terminate`, opts),
      subagents: (id, opts) => this.request("GET", `${thread(id)}/subagents`, opts),
      logs: (id, params = {}, opts) => this.request("GET", `${thread(id)}/logs${query(params)}`, opts),
      log: (id, logId, opts) => this.request("GET", `${thread(id)}/logs/${encodeURIComponent(logId)}`, opts),
    };

    this.messages = {
      /** Queue a message (a string is its `content`); `files` makes it multipart. With `{wait: seconds}` the
       * answer is the turn it starts or joins (`{done, status, outcome, error, messages}`). */
      post: (id, message, { wait, ...opts } = {}) => {
        const { files, ...fields } = typeof message === "string" ? { content: message } : message;
        const path = `${thread(id)}/messages${query({ wait })}`;
        if (!files || files.length === 0) return this.request("POST", path, { ...opts, body: fields });
        return this.request("POST", path, { ...opts, form: multipart(fields, files) });
      },
      list: (id, params = {}, opts) => this.request("GET", `${thread(id)}/messages${query(params)}`, opts),
      get: (id, messageId, opts) =>
        this.request("GET", `${thread(id)}/messages/${encodeURIComponent(messageId)}`, opts),
      edit: (id, messageId, content, opts) =>
        this.request("PATCH", `${thread(id)}/messages/${encodeURIComponent(messageId)}`, {
          ...opts,
          body: { content },
        }),
      delete: (id, messageId, opts) =>
        this.request("DELETE", `${thread(id)}/messages/${encodeURIComponent(messageId)}`, opts),
    };

    this.events = {
      /** A thread's events as an async iterator of `{event, seq, data}`, read with `fetch`; resumes by itself. */
      stream: (id, { since, signal, onOpen, onRetry, ...params } = {}) =>
        this.follow(`${thread(id)}/events`, params, { since, signal, onOpen, onRetry }),
      /** The lifecycle of the caller's threads (`/events`), as `stream` reads a thread's. */
      lifecycle: ({ since, signal, onOpen, onRetry } = {}) =>
        this.follow("/events", {}, { since, signal, onOpen, onRetry }),
      /** The same iterator over a browser's `EventSource`, opened with a stream token when there is a key. */
      source: (id, { since, signal, onOpen, onRetry, ...params } = {}) =>
        this.listen(id, `${thread(id)}/events`, params, THREAD_EVENTS, { since, signal, onOpen, onRetry }),
      lifecycleSource: ({ since, signal, onOpen, onRetry } = {}) =>
        this.listen(null, "/events", {}, LIFECYCLE_EVENTS, { since, signal, onOpen, onRetry }),
    };

    this.streamTokens = {
      /** `{thread_id}` for a thread's stream, `{}` for `/events`: `{token, expires_in, url}`. */
      create: (body = {}, opts) => this.request("POST", "/stream-tokens", { ...opts, body }),
    };

    this.files = {
      /** A directory's listing (`/` by default): `{path, entries}`. */
      list: (id, path = "/", opts) =>
        this.request("GET", segments(path) ? fs(id, path) : `${thread(id)}/fs`, opts),
      stats: (id, opts) => this.request("GET", `${thread(id)}/fs?stats=1`, opts),
      grep: (id, pattern, opts) => this.request("GET", `${thread(id)}/fs${query({ grep: pattern })}`, opts),
      find: (id, glob, opts) => this.request("GET", `${thread(id)}/fs${query({ find: glob })}`, opts),
      /** Store `data` (a string, Blob, ArrayBuffer, typed array or stream) at `path`: its `FileRecord`. */
      upload: (id, path, data, { contentType, ...opts } = {}) => {
        const type = contentType || (typeof data?.type === "string" && data.type) || "application/octet-stream";
        return this.request("PUT", fs(id, path), { ...opts, data, headers: { ...opts.headers, "Content-Type": type } });
      },
      /** The file's answer (`Response`): read it with `.text()`, `.blob()`, `.arrayBuffer()` or `.body`; its `ETag`
       * header names the content. `{thumbnail: true}` a JPEG; `{ifNoneMatch}` may answer 304. */
      download: (id, path, { thumbnail, ifNoneMatch, ...opts } = {}) => {
        const headers = ifNoneMatch ? { ...opts.headers, "If-None-Match": ifNoneMatch } : opts.headers;
        return this.request("GET", `${fs(id, path)}${query({ thumbnail: thumbnail ? 1 : undefined })}`, {
          ...opts,
          headers,
          raw: true,
        });
      },
      delete: (id, path, opts) => this.request("DELETE", fs(id, path), opts),
    };

    this.variables = {
      /** A subagent creation waiting for scoped variables: `{request_id, required, missing, status, ...}`. */
      get: (id, requestId, opts) =>
        this.request("GET", `${thread(id)}/variables/${encodeURIComponent(requestId)}`, opts),
      /** Provide them (`{NAME: value}`): the subagent is created and starts. */
      provide: (id, requestId, env, opts) =>
        this.request("POST", `${thread(id)}/variables/${encodeURIComponent(requestId)}`, { ...opts, body: { env } }),
    };

    this.env = {
      list: (scope, opts) => this.request("GET", `/env/${encodeURIComponent(scope)}`, opts),
      get: (scope, name, opts) =>
        this.request("GET", `/env/${encodeURIComponent(scope)}/${encodeURIComponent(name)}`, opts),
      set: (scope, name, value, { type, ...opts } = {}) =>
        this.request("PUT", `/env/${encodeURIComponent(scope)}/${encodeURIComponent(name)}`, {
          ...opts,
          body: type ? { value, type } : { value },
        }),
      delete: (scope, name, opts) =>
        this.request("DELETE", `/env/${encodeURIComponent(scope)}/${encodeURIComponent(name)}`, opts),
    };

    this.effects = {
      list: (id, opts) => this.request("GET", `${thread(id)}/effects`, opts),
      cancel: (id, effectId, opts) =>
        this.request("POST", `${thread(id)}/effects/${encodeURIComponent(effectId)}/cancel`, opts),
    };

    this.endpoints = {
      /** A custom thread endpoint (`agents/endpoints/`): its JSON answer, or the `Response` when it is not JSON. */
      call: async (id, path, { method = "GET", body, params, ...opts } = {}) => {
        const response = await this.request(method, `${thread(id)}/${segments(path)}${query(params)}`, {
          ...opts,
          body,
          raw: true,
        });
        const type = response.headers.get("content-type") || "";
        return /^application\/(.+\+)?json/i.test(type) ? response.json() : response;
      },
    };
  }

  /** `GET /health`: `{status: "ok", version}` while the server runs (its version, the same as this client's). */
  health(opts) {
    return this.request("GET", "/health", opts);
  }

  /** `GET /ready`: `{status: "ready"}` once its database answers and is migrated (else an `AgentsError`, 503). */
  ready(opts) {
    return this.request("GET", "/ready", opts);
  }

  /** The headers every request carries: the key, and the client's name and version. */
  baseHeaders() {
    const headers = { ...this.headers };
    if (IN_NODE) headers["User-Agent"] = CLIENT;
    else headers["X-Client"] = CLIENT;
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    return headers;
  }

  /**
   * One call: `body` is sent as JSON, `form` as multipart, `data` as it is. The answer's JSON (`null` for 204), or
   * with `raw` the `Response` itself; a failure is an `AgentsError` (304 is not one).
   */
  async request(method, path, { body, form, data, headers, signal, raw = false } = {}) {
    const sent = { ...this.baseHeaders(), ...headers };
    let payload = form ?? data;
    if (body !== undefined) {
      sent["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    const init = { method, headers: sent, body: payload, signal, cache: "no-store" };
    if (payload && typeof payload.getReader === "function") init.duplex = "half"; // a stream: Node wants it said
    const response = await this.fetchImpl(`${this.baseUrl}${path}`, init);
    if (!response.ok && response.status !== 304) throw await AgentsError.from(response);
    if (raw) return response;
    if (response.status === 204) return null;
    return response.json();
  }

  /** Follow a stream with `fetch`, resuming after a drop with `Last-Event-ID`; stored events (those with a `seq`)
   * are yielded once each and in order, whatever the connection did. */
  async *follow(path, params, { since, signal, onOpen, onRetry }) {
    const controller = linked(signal);
    let last = since ?? null;
    let delay = this.reconnectDelay;
    try {
      while (!controller.signal.aborted) {
        const headers = { ...this.baseHeaders(), Accept: "text/event-stream" };
        if (last !== null) headers["Last-Event-ID"] = String(last);
        // a connection of its own to abort: a network that drops it without a word leaves it silent for ever
        const connection = linked(controller.signal);
        let timer = null;
        const touch = () => {
          clearTimeout(timer);
          timer = setTimeout(() => connection.abort(), this.idleTimeout);
        };
        let failure;
        try {
          touch();
          const response = await this.fetchImpl(`${this.baseUrl}${path}${query(params)}`, {
            headers,
            signal: connection.signal,
            cache: "no-store",
          });
          if (!response.ok) {
            const error = await AgentsError.from(response);
            if (response.status < 500 && response.status !== 429) throw error; // refused for good: say why
            failure = error;
          } else {
            delay = this.reconnectDelay;
            onOpen?.();
            const watched = response.body.pipeThrough(
              new TransformStream({
                transform(chunk, out) {
                  touch(); // any byte, a keep-alive comment too, says the connection lives
                  out.enqueue(chunk);
                },
              }),
            );
            for await (const frame of readEvents(watched)) {
              const item = parsed(frame.event, frame.id, frame.data);
              if (item.seq !== null) {
                if (last !== null && item.seq <= last) continue; // seen before the connection dropped
                last = item.seq;
              }
              yield item;
            }
          }
        } catch (error) {
          if (controller.signal.aborted) return;
          if (error instanceof AgentsError && !failure) throw error;
          failure = error; // the connection dropped, went silent or could not be made: resume
        } finally {
          clearTimeout(timer);
          connection.abort();
        }
        onRetry?.(failure ?? null);
        await sleep(delay, controller.signal);
        delay = Math.min(delay * 2, this.maxReconnectDelay);
      }
    } finally {
      controller.abort(); // a consumer that stops iterating closes the connection
    }
  }

  /** Follow a stream with `EventSource`: with a key, through a stream token minted for it. The browser resumes
   * by itself with `Last-Event-ID`; when it gives up (a token past its lifetime, the server refusing), a new token
   * is minted and a new `EventSource` opened with `since` the last `seq`. */
  listen(threadId, path, params, types, { since, signal, onOpen, onRetry }) {
    const EventSourceImpl = this.EventSourceImpl;
    if (typeof EventSourceImpl !== "function") {
      throw new Error("No `EventSource` here: use `events.stream` (fetch), or pass one as `options.EventSource`.");
    }
    let source = null;
    let timer = null;
    let last = since ?? null;
    let delay = this.reconnectDelay;
    const channel = new Channel(() => {
      clearTimeout(timer);
      source?.close();
      source = null;
    });
    const controller = linked(signal);
    controller.signal.addEventListener("abort", () => channel.finish(), { once: true });

    const open = async () => {
      let url = `${this.baseUrl}${path}`;
      const rest = { ...params, since: last ?? undefined };
      if (this.apiKey) {
        const minted = await this.streamTokens.create(threadId ? { thread_id: threadId } : {});
        const extra = query(rest);
        url = `${this.baseUrl}${minted.url}${extra ? `&${extra.slice(1)}` : ""}`;
      } else url += query(rest);
      if (channel.ended) return;
      const opened = new EventSourceImpl(url);
      source = opened;
      opened.addEventListener("open", () => {
        if (source !== opened) return;
        delay = this.reconnectDelay;
        onOpen?.();
      });
      opened.addEventListener("error", (event) => {
        // the server's own `error` event (it has data) is news of the thread, handled with the others below
        if (source !== opened || typeof event.data === "string") return;
        onRetry?.(null);
        if (opened.readyState === EventSourceImpl.CLOSED) retry(); // refused: the browser will not try again
      });
      for (const type of types) {
        opened.addEventListener(type, (event) => {
          if (source !== opened || typeof event.data !== "string") return;
          const item = parsed(type, event.lastEventId || null, event.data);
          if (type === "message_chunk" || type === "reasoning_chunk" || type === "events_missed") item.seq = null;
          if (item.seq !== null) {
            if (last !== null && item.seq <= last) return;
            last = item.seq;
          }
          channel.push(item);
        });
      }
    };

    const attempt = () =>
      open().catch((error) => {
        if (error instanceof AgentsError && error.status < 500 && error.status !== 429) channel.fail(error);
        else {
          onRetry?.(error); // the token could not be minted (the server away): try again
          retry();
        }
      });

    const retry = () => {
      source?.close();
      source = null;
      clearTimeout(timer);
      timer = setTimeout(attempt, delay);
      delay = Math.min(delay * 2, this.maxReconnectDelay);
    };

    attempt();
    return channel;
  }
}

function multipart(fields, files) {
  const form = new FormData();
  for (const [name, value] of Object.entries(fields)) {
    if (value === undefined || value === null) continue;
    form.append(name, name === "metadata" ? JSON.stringify(value) : String(value));
  }
  for (const file of files) {
    if (typeof Blob !== "undefined" && file instanceof Blob) {
      form.append("file", file, file.name || "file");
    } else {
      const blob = new Blob([file.data], { type: file.type || file.mime_type || "application/octet-stream" });
      form.append("file", blob, file.name);
    }
  }
  return form;
}
