// The playground: a client of the API like any other, through the JS client (`client.js`, a copy of
// clients/js/src/index.js). Every call carries the pasted key (kept in this tab's sessionStorage only); streams open
// with a stream token, since EventSource cannot send headers. Text from the server is only ever set as textContent:
// nothing it sends is parsed as HTML.

import { AgentsClient, AgentsError } from "./client.js";

const KEY = "agents-playground-key";
const IMAGE = /^image\/(png|jpeg|gif|webp)$/;
const REQUEST_PATH = /^\/threads\/([0-9a-f-]{36})\/variables\/([0-9a-f-]{36})$/;
const UUID = /^[0-9a-f-]{36}$/;

const $ = (id) => document.getElementById(id);

const state = {
  key: "",
  agents: [],
  threadId: null,
  thread: null,
  generation: 0, // bumped on every thread switch: late answers for a thread no longer shown are dropped
  client: new AgentsClient(),
  stream: null, // the AbortController of the stream followed
  messages: new Map(), // id -> Message, as last announced
  lengths: new Map(), // id -> code points of its content (chunk offsets count code points)
  streamed: new Set(), // ids of messages that received live deltas
  calls: new Map(), // tool call id -> "running" | its status
  requests: new Set(), // variable request ids shown
  images: new Map(), // "thread:path:etag" -> Promise<object URL> of its thumbnail
  timers: {},
};

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

function notice(error) {
  const box = $("notice");
  if (!error) {
    box.hidden = true;
    return;
  }
  const text = error instanceof AgentsError ? `${error.message} (${error.code})` : String(error.message || error);
  box.replaceChildren(el("span", { text }), el("button", { class: "quiet", type: "button", text: "×", onclick: () => notice(null) }));
  box.hidden = false;
}

function guarded(fn) {
  // called at once (a handler's preventDefault must run before the event ends); failures go to the notice
  return (...args) => {
    try {
      Promise.resolve(fn(...args)).catch(notice);
    } catch (error) {
      notice(error);
    }
  };
}

function later(name, fn, ms = 300) {
  clearTimeout(state.timers[name]);
  state.timers[name] = setTimeout(guarded(fn), ms);
}

const codePoints = (text) => {
  let n = 0;
  for (const _ of text) n += 1;
  return n;
};

function size(bytes) {
  if (bytes == null) return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
const short = (id) => String(id).slice(0, 8);

// --- the key and the server ---------------------------------------------------------------------------------

async function connect() {
  notice(null);
  resetThread();
  $("key-forget").hidden = !state.key;
  $("create").disabled = true;
  state.client = new AgentsClient({ apiKey: state.key });
  try {
    state.agents = await state.client.agents.list();
  } catch (error) {
    state.agents = [];
    renderAgents();
    $("threads").replaceChildren();
    if (error instanceof AgentsError && error.status === 401) {
      $("key-state").textContent = state.key
        ? "This key was refused: paste another."
        : "This server needs an API key: paste one (it stays in this tab only).";
      $("key-state").className = "warn";
      $("key-input").focus();
      if (state.key) notice(error);
      return;
    }
    throw error;
  }
  $("key-state").textContent = state.key ? `Using key ${state.key.slice(0, 10)}…` : "Open mode: no key needed here";
  $("key-state").className = "muted";
  renderAgents();
  await loadThreads();
  const wanted = new URLSearchParams(location.hash.slice(1)).get("thread");
  if (!wanted) return;
  try {
    await selectThread(wanted);
  } catch (error) {
    resetThread(); // gone, or another user's: start from no thread
    history.replaceState(null, "", location.pathname);
    throw error;
  }
}

function renderAgents() {
  const select = $("agent");
  select.replaceChildren(
    ...state.agents.map((a) => el("option", { value: a.name, text: a.title ? `${a.title} (${a.name})` : a.name })),
  );
  $("create").disabled = state.agents.length === 0;
  describeAgent();
}

function describeAgent() {
  const agent = state.agents.find((a) => a.name === $("agent").value);
  const needs = (agent?.variables || []).filter((v) => v.required && !v.scoped).map((v) => v.name);
  const about = [agent?.description, needs.length ? `Needs: ${needs.join(", ")}` : null].filter(Boolean);
  $("agent-about").textContent = about.join(" · ");
}

// --- threads ------------------------------------------------------------------------------------------------

async function loadThreads() {
  const { threads } = await state.client.threads.list({ parent_id: "none", limit: 100 });
  $("threads").replaceChildren(
    ...threads.map((t) =>
      el(
        "li",
        { dataset: { id: t.id }, class: t.id === state.threadId ? "active" : "" },
        el(
          "button",
          { type: "button", onclick: guarded(() => selectThread(t.id)) },
          el("span", { class: "title", text: t.name || t.agent }),
          el("span", { class: `badge ${t.status}`, text: t.status }),
          el("span", { class: "muted small", text: `${t.agent} · ${short(t.id)} · ${when(t.created_at)}` }),
        ),
      ),
    ),
  );
  if (threads.length === 0) $("threads").append(el("li", { class: "muted small", text: "no threads yet" }));
}

function parseEnv(text) {
  const env = {};
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf("=");
    if (at < 1) throw new Error(`A variable line is NAME=value: "${line.trim()}"`);
    env[line.slice(0, at).trim()] = line.slice(at + 1);
  }
  return env;
}

async function createThread(event) {
  event.preventDefault();
  const body = { agent: $("agent").value };
  const name = $("thread-name").value.trim();
  if (name) body.name = name;
  const env = parseEnv($("thread-env").value);
  if (Object.keys(env).length) body.env = env;
  const thread = await state.client.threads.create(body);
  $("thread-name").value = "";
  await selectThread(thread.id);
  await loadThreads();
}

function renderHead(thread) {
  state.thread = thread;
  $("thread-title").textContent = `${thread.name || thread.agent} · ${short(thread.id)}`;
  $("thread-title").title = thread.id;
  setStatus(thread.status);
  $("open-parent").hidden = !thread.parent_id;
  $("stop").hidden = false;
}

function setStatus(status) {
  const badge = $("thread-status");
  badge.hidden = false;
  badge.textContent = status;
  badge.className = `badge ${status}`;
  const entry = document.querySelector(`#threads li[data-id="${CSS.escape(state.threadId || "")}"] .badge`);
  if (entry) {
    entry.textContent = status;
    entry.className = `badge ${status}`;
  }
}

function resetThread() {
  closeStream();
  state.generation += 1;
  Object.assign(state, { threadId: null, thread: null });
  for (const seen of [state.messages, state.lengths, state.streamed, state.calls, state.requests]) seen.clear();
  $("messages").replaceChildren();
  $("requests").replaceChildren();
  $("requests-section").hidden = true;
  $("tree").replaceChildren("none");
  $("files").replaceChildren(el("li", { class: "muted small", text: "none" }));
  $("thread-title").textContent = "No thread selected";
  for (const id of ["thread-status", "open-parent", "stop"]) $(id).hidden = true;
  setComposer(false);
}

async function selectThread(id) {
  if (!UUID.test(id)) throw new Error(`Not a thread id: ${id}`);
  resetThread();
  const generation = state.generation;
  state.threadId = id;
  for (const li of document.querySelectorAll("#threads li")) li.classList.toggle("active", li.dataset.id === id);
  history.replaceState(null, "", `#thread=${id}`);
  const thread = await state.client.threads.get(id);
  if (generation !== state.generation) return;
  renderHead(thread);
  openStream();
  refreshTree().catch(notice);
  refreshFiles().catch(notice);
}

// --- the stream ---------------------------------------------------------------------------------------------

function closeStream() {
  if (state.stream) state.stream.abort();
  state.stream = null;
  $("stream-state").textContent = "";
}

function openStream() {
  // the client resumes by itself: the browser reconnects with Last-Event-ID, and when it gives up (a stream token
  // past its lifetime) the client mints a new token and resumes after the last event
  const controller = new AbortController();
  state.stream = controller;
  const shown = (text, kind) => {
    if (state.stream !== controller) return;
    $("stream-state").textContent = text;
    $("stream-state").className = `small ${kind}`;
  };
  shown("connecting…", "muted");
  const events = state.client.events.source(state.threadId, {
    include_silent: true,
    signal: controller.signal,
    onOpen: () => {
      shown("● live", "live");
      if (state.stream === controller) setComposer(true);
    },
    onRetry: () => shown("reconnecting…", "warn"),
  });
  (async () => {
    for await (const { event, data } of events) {
      if (state.stream !== controller) break;
      try {
        HANDLERS[event]?.(data);
      } catch (error) {
        notice(error);
      }
    }
  })().catch((error) => {
    if (state.stream === controller) notice(error); // refused for good (the thread is gone, the key revoked)
  });
}

const HANDLERS = {
  message_data: ({ data }) => {
    upsert(data);
    const meta = data.metadata || {};
    if (meta.error_code === "subagent_env_required") addRequest(meta.error_data).catch(notice);
    if (data.role === "tool" || (data.attachments || []).length) later("files", refreshFiles);
  },
  message_chunk: ({ message_id, offset, chunk }) => {
    const message = state.messages.get(message_id);
    if (!message || state.lengths.get(message_id) !== offset) return; // already have it (a resumed stream)
    message.content = (message.content || "") + chunk;
    state.lengths.set(message_id, offset + codePoints(chunk));
    state.streamed.add(message_id);
    const node = document.querySelector(`#messages li[data-id="${CSS.escape(message_id)}"]`);
    if (node) {
      node.dataset.streamed = "true";
      node.querySelector(".text").textContent = message.content;
      scrollDown();
    }
  },
  thread_status: ({ status }) => setStatus(status),
  tool_started: ({ tool_call_id }) => markCall(tool_call_id, "running"),
  tool_completed: ({ tool_call_id, status }) => {
    markCall(tool_call_id, status);
    later("files", refreshFiles);
  },
  turn_ended: () => later("files", refreshFiles),
  session_ended: ({ status, reason }) => line(`Session ended: ${status}${reason ? ` (${reason})` : ""}`),
  stopped_by_user: () => line("Stopped by the user"),
  thread_terminated: () => line("Thread terminated"),
  agent_handoff: ({ from_agent, to_agent }) => line(`Handed off from ${from_agent} to ${to_agent}`),
  subagent_created: () => later("tree", refreshTree),
  subagent_status: () => later("tree", refreshTree),
  event: ({ event_type, data }) => {
    if (event_type === "subagent_env_required") addRequest(data).catch(notice);
  },
  error: ({ code, message }) => line(`Error: ${message} (${code})`, "error"),
  events_missed: () => line("Older events are past their retention: earlier messages are not shown", "error"),
};

// --- messages -----------------------------------------------------------------------------------------------

function setComposer(on) {
  $("input").disabled = !on;
  $("send").disabled = !on;
  $("files-input").disabled = !on;
  if (on) $("input").placeholder = "Write a message (Enter sends, Shift+Enter breaks the line)";
}

function showChosen() {
  const names = [...$("files-input").files].map((f) => f.name);
  $("chosen").textContent = names.length ? `Attached: ${names.join(", ")}` : "";
  $("chosen").hidden = names.length === 0;
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function line(text, kind = "") {
  $("messages").append(el("li", { class: `line ${kind}`, text }));
  scrollDown();
}

function upsert(message) {
  state.messages.set(message.id, message);
  state.lengths.set(message.id, codePoints(message.content || ""));
  const node = renderMessage(message);
  const old = document.querySelector(`#messages li[data-id="${CSS.escape(message.id)}"]`);
  if (old) old.replaceWith(node);
  else $("messages").append(node);
  scrollDown();
}

function renderMessage(m) {
  const classes = ["msg", m.role, m.status];
  if (m.silent) classes.push("silent");
  if (m.tool_status) classes.push(`tool-${m.tool_status}`);
  const who = [m.role === "tool" ? `tool · ${m.name}` : m.role];
  if (m.model) who.push(m.model);
  if (m.silent) who.push("silent");
  if (m.status === "queued" || m.status === "pending" || m.status === "failed") who.push(m.status);
  if (m.role === "tool" && m.tool_status) who.push(m.tool_status);
  const node = el(
    "li",
    { class: classes.join(" "), dataset: { id: m.id, role: m.role } },
    el("div", { class: "who", text: who.join(" · ") }),
    el("div", { class: "text", text: m.content || "" }),
  );
  const error = m.status === "failed" ? (m.metadata || {}).error : null; // why it failed: `{code, message}`
  if (error && typeof error === "object") {
    node.append(el("div", { class: "error", text: `${error.message} (${error.code})` }));
  }
  if (state.streamed.has(m.id)) node.dataset.streamed = "true";
  if (m.role === "tool" && m.tool_call_id) markCall(m.tool_call_id, m.tool_status || "done");
  for (const call of m.tool_calls || []) {
    let args = call.function.arguments;
    try {
      args = JSON.stringify(JSON.parse(args));
    } catch {
      // shown as sent
    }
    node.append(
      el(
        "div",
        { class: "call", dataset: { callId: call.id } },
        el("span", { class: "tool-name", text: call.function.name }),
        el("code", { text: args }),
        el("span", { class: "call-state" }),
      ),
    );
    if (state.calls.has(call.id)) showCall(node.lastChild, state.calls.get(call.id));
  }
  if ((m.attachments || []).length) {
    node.append(el("ul", { class: "attachments" }, ...m.attachments.map((a) => fileItem(a))));
  }
  return node;
}

function markCall(id, status) {
  state.calls.set(id, status);
  const call = document.querySelector(`#messages .call[data-call-id="${CSS.escape(id)}"]`);
  if (call) showCall(call, status);
}

function showCall(call, status) {
  call.dataset.state = status;
  call.querySelector(".call-state").textContent = status === "running" ? "running…" : status;
}

async function send(event) {
  event.preventDefault();
  const input = $("input");
  const content = input.value.trim();
  const files = [...$("files-input").files];
  if ((!content && files.length === 0) || !state.threadId) return;
  const sent = await state.client.messages.post(state.threadId, files.length ? { content, files } : { content });
  input.value = "";
  $("files-input").value = "";
  showChosen();
  if (!state.messages.has(sent.message_id)) {
    upsert({ id: sent.message_id, role: "user", content, status: "queued", attachments: [], metadata: {} });
  }
}

// --- files --------------------------------------------------------------------------------------------------

function thumbnail(path, etag) {
  // fetched with the key (an <img src> could not send it), then shown from a blob: URL; one fetch per content
  const key = `${state.threadId}:${path}:${etag}`;
  if (!state.images.has(key)) {
    state.images.set(
      key,
      state.client.files
        .download(state.threadId, path, { thumbnail: true })
        .then((r) => r.blob())
        .then((blob) => URL.createObjectURL(blob))
        .catch((error) => {
          state.images.delete(key); // a refusal (busy, not an image) is not kept: the next render asks again
          throw error;
        }),
    );
  }
  return state.images.get(key);
}

function fileItem(file) {
  const item = el("li", { class: "file", dataset: { path: file.path } });
  if (IMAGE.test(file.mime_type || "")) {
    const img = el("img", { class: "thumb", alt: file.name, loading: "lazy" });
    thumbnail(file.path, file.etag || file.size)
      .then((url) => {
        img.src = url;
      })
      .catch(() => img.replaceWith(el("span", { class: "thumb none", text: "no preview" })));
    item.append(img);
  } else {
    item.append(el("span", { class: "thumb none", text: (file.name.split(".").pop() || "file").slice(0, 4) }));
  }
  item.append(
    el(
      "div",
      { class: "file-about" },
      el("span", { class: "name", text: file.name || file.path, title: file.path }),
      el("span", { class: "path muted small", text: file.path, title: file.path }),
      el("span", { class: "muted small", text: [file.mime_type, size(file.size)].filter(Boolean).join(" · ") }),
    ),
    el("button", { type: "button", class: "quiet small", text: "Download", onclick: guarded(() => download(file)) }),
  );
  return item;
}

async function download(file) {
  const response = await state.client.files.download(state.threadId, file.path);
  // a blob: URL has this page's origin: typed as bytes, it can only ever be saved, never rendered here
  const bytes = new Blob([await response.blob()], { type: "application/octet-stream" });
  const url = URL.createObjectURL(bytes);
  const link = el("a", { href: url, download: file.name || file.path.split("/").pop() });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

async function refreshFiles() {
  const id = state.threadId;
  if (!id) return;
  const { entries } = await state.client.files.find(id, "*");
  if (id !== state.threadId) return;
  const files = entries.filter((e) => e.type === "file");
  $("files").replaceChildren(...files.map(fileItem));
  if (files.length === 0) $("files").append(el("li", { class: "muted small", text: "none" }));
}

// --- subagents and their variables --------------------------------------------------------------------------

async function children(id, depth) {
  const { subagents } = await state.client.threads.subagents(id);
  return Promise.all(
    subagents.map(async (entry) => ({
      entry,
      children: depth < 4 ? await children(entry.reference, depth + 1) : [],
    })),
  );
}

function renderTree(nodes) {
  return el(
    "ul",
    {},
    ...nodes.map(({ entry, children: below }) =>
      el(
        "li",
        { dataset: { id: entry.reference } },
        el(
          "button",
          { type: "button", class: "link", title: entry.reference, onclick: guarded(() => selectThread(entry.reference)) },
          el("span", { text: entry.thread_name || entry.title || entry.name }),
          el("span", { class: `badge ${entry.status}`, text: entry.status }),
        ),
        below.length ? renderTree(below) : null,
      ),
    ),
  );
}

async function refreshTree() {
  const id = state.threadId;
  if (!id) return;
  const nodes = await children(id, 0);
  if (id !== state.threadId) return;
  const tree = $("tree");
  if (nodes.length === 0) tree.replaceChildren("none");
  else tree.replaceChildren(renderTree(nodes));
}

async function addRequest(data) {
  const rid = data?.request_id;
  const [, owner] = REQUEST_PATH.exec(data?.endpoint || "") || [];
  if (!rid || state.requests.has(rid) || !owner) return;
  state.requests.add(rid);
  const generation = state.generation;
  const request = await state.client.variables.get(owner, rid);
  if (generation !== state.generation) return;
  const card = el("div", { class: "request", dataset: { request: rid } });
  $("requests").append(card);
  $("requests-section").hidden = false;
  renderRequest(card, owner, request);
}

function renderRequest(card, owner, request) {
  const title = el("div", {}, el("strong", { text: request.agent }), " needs scoped variables");
  if (request.status !== "pending") {
    const child = request.child_thread_id;
    card.replaceChildren(
      title,
      el(
        "p",
        { class: "small" },
        "Provided: started ",
        el("button", { type: "button", class: "link", text: short(child), onclick: guarded(() => selectThread(child)) }),
      ),
    );
    card.classList.add("done");
    return;
  }
  const fields = request.missing.map((name) =>
    el("label", {}, name, el("input", { type: "password", name, required: true, autocomplete: "off" })),
  );
  const form = el(
    "form",
    { class: "stack" },
    ...fields,
    el("button", { type: "submit", text: "Provide and start" }),
  );
  form.addEventListener(
    "submit",
    guarded(async (event) => {
      event.preventDefault();
      const env = {};
      for (const input of form.querySelectorAll("input")) env[input.name] = input.value;
      await state.client.variables.provide(owner, request.request_id, env);
      renderRequest(card, owner, await state.client.variables.get(owner, request.request_id));
      later("tree", refreshTree, 100);
    }),
  );
  card.replaceChildren(title, el("p", { class: "muted small", text: "Values go to that subagent only, stored encrypted." }), form);
}

// --- start --------------------------------------------------------------------------------------------------

function bind() {
  $("key-form").addEventListener(
    "submit",
    guarded(async (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) throw new Error("Paste an API key first.");
      sessionStorage.setItem(KEY, key);
      state.key = key;
      $("key-input").value = "";
      await connect();
    }),
  );
  $("key-forget").addEventListener(
    "click",
    guarded(async () => {
      sessionStorage.removeItem(KEY);
      state.key = "";
      await connect();
    }),
  );
  $("agent").addEventListener("change", describeAgent);
  $("new-thread").addEventListener("submit", guarded(createThread));
  $("refresh-threads").addEventListener("click", guarded(loadThreads));
  $("refresh-files").addEventListener("click", guarded(refreshFiles));
  $("composer").addEventListener("submit", guarded(send));
  $("files-input").addEventListener("change", showChosen);
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener(
    "click",
    guarded(() => state.client.threads.stop(state.threadId)),
  );
  $("open-parent").addEventListener(
    "click",
    guarded(() => selectThread(state.thread.parent_id)),
  );
}

bind();
state.key = sessionStorage.getItem(KEY) || "";
guarded(connect)();
