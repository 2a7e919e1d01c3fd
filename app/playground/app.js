// The playground: a client of the API like any other, through the JS client (`client.js`, a copy of
// clients/js/src/index.js). Every call carries the pasted key (kept in this tab's sessionStorage only); streams open
// with a stream token, since EventSource cannot send headers. Text from the server is set as textContent, except a
// model's Markdown, which markdown.js parses and sanitizes into DOM nodes (never HTML set on the page).

import { AgentsClient, AgentsError } from "./client.js";
import { el, short } from "./dom.js";
import * as files from "./files.js";
import * as agentMap from "./map.js";
import * as messages from "./messages.js";
import { render } from "./markdown.js";
import { $, RUNNING, codePoints, guarded, later, notice, state, when } from "./page.js";
import { addRequest, opening, refreshTree } from "./subagents.js";
import * as trace from "./trace.js";

const KEY = "agents-playground-key";
const UUID = /^[0-9a-f-]{36}$/;

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
    if (error instanceof AgentsError && error.status === 401) {
      await refused(error);
      return;
    }
    throw error;
  }
  $("key-state").textContent = state.key ? `Using key ${state.key.slice(0, 10)}…` : "Open mode: no key needed here";
  $("key-state").className = "muted";
  renderAgents();
  await loadThreads();
  showMap().catch(notice);
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

async function refused(error) {
  // said where the key is (short) and where the threads would be (why nothing shows, and what to do)
  let headline, why;
  if (!state.key) {
    headline = "This server needs an API key: paste one (it stays in this tab only).";
    why = headline;
  } else {
    const open = await new AgentsClient().agents.list().then(
      () => true,
      () => false,
    );
    headline = open ? "Key refused: this server needs none (open mode)" : "Key refused: paste another";
    why = open
      ? `The server refused the key in this tab (${error.code}), and it needs none: it is in open mode. ` +
        "Forget the key (top right) to go on."
      : `The server refused the key in this tab (${error.code}: ${error.message}). Paste another, or forget it.`;
  }
  $("key-state").textContent = headline;
  $("key-state").className = "warn";
  $("threads").replaceChildren(el("li", { class: "small refused", text: why }));
  $("key-input").focus();
}

function renderAgents() {
  const select = $("agent");
  const option = (a) => el("option", { value: a.name, text: a.title ? `${a.title} (${a.name})` : a.name });
  select.replaceChildren(...state.agents.map(option));
  const filter = $("filter-agent");
  const chosen = filter.value;
  filter.replaceChildren(el("option", { value: "", text: "any agent" }), ...state.agents.map(option));
  filter.value = state.agents.some((a) => a.name === chosen) ? chosen : "";
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
  const params = { parent_id: "none", limit: 200 };
  for (const [name, id] of [["agent", "filter-agent"], ["status", "filter-status"], ["tag", "filter-tag"]]) {
    const value = $(id).value.trim();
    if (value) params[name] = value;
  }
  const { threads } = await state.client.threads.list(params);
  state.threads = threads;
  showThreads();
}

function showThreads() {
  // the search runs here, over what the filters fetched: name, agent, tags and id
  const words = $("thread-search").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  const text = (t) => [t.name, t.agent, t.id, ...(t.tags || [])].filter(Boolean).join(" ").toLowerCase();
  const shown = state.threads.filter((t) => words.every((w) => text(t).includes(w)));
  $("threads").replaceChildren(
    ...shown.map((t) =>
      el(
        "li",
        { dataset: { id: t.id }, class: t.id === state.threadId ? "active" : "" },
        el(
          "button",
          { type: "button", onclick: guarded(() => selectThread(t.id)) },
          el("span", { class: "title", text: t.name || t.agent }),
          el("span", { class: `badge ${t.status}`, text: t.status }),
          el("span", { class: "muted small", text: `${t.agent} · ${short(t.id)} · ${when(t.created_at)}` }),
          (t.tags || []).length ? el("span", { class: "tags" }, ...t.tags.map((tag) => el("span", { class: "tag", text: tag }))) : null,
        ),
      ),
    ),
  );
  if (shown.length === 0) {
    const filtered = words.length || ["filter-agent", "filter-status", "filter-tag"].some((id) => $(id).value.trim());
    $("threads").append(el("li", { class: "muted small", text: filtered ? "no thread matches" : "no threads yet" }));
  }
}

function parseEnv(text) {
  const env = {};
  for (const row of text.split("\n")) {
    if (!row.trim()) continue;
    const at = row.indexOf("=");
    if (at < 1) throw new Error(`A variable line is NAME=value: "${row.trim()}"`);
    env[row.slice(0, at).trim()] = row.slice(at + 1);
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
  $("thread-tags").replaceChildren(...(thread.tags || []).map((tag) => el("span", { class: "tag", text: tag })));
  setStatus(thread.status);
  $("open-parent").hidden = !thread.parent_id;
  $("edit-thread").hidden = false;
  $("delete-thread").hidden = false;
}

function editThread() {
  $("edit-name").value = state.thread.name || "";
  $("edit-tags").value = (state.thread.tags || []).join(", ");
  $("thread-edit").hidden = false;
  $("edit-name").focus();
}

async function saveThread(event) {
  event.preventDefault();
  const tags = $("edit-tags").value.split(",").map((t) => t.trim()).filter(Boolean);
  const thread = await state.client.threads.update(state.threadId, { name: $("edit-name").value.trim(), tags });
  $("thread-edit").hidden = true;
  renderHead(thread);
  await loadThreads();
}

function askDelete() {
  const below = state.thread.children_count || 0;
  $("delete-what").textContent = below
    ? `Delete this thread and its ${below} subagent thread${below === 1 ? "" : "s"} (and theirs), with every message and file?`
    : "Delete this thread with every message and file?";
  $("delete-confirm").hidden = false;
}

async function deleteThread() {
  await state.client.threads.delete(state.threadId);
  $("delete-confirm").hidden = true;
  resetThread();
  history.replaceState(null, "", location.pathname);
  await loadThreads();
}

function setStatus(status) {
  const badge = $("thread-status");
  badge.hidden = false;
  $("stop").hidden = !RUNNING.has(status);
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
  $("thread-tags").replaceChildren();
  for (const id of ["thread-status", "open-parent", "stop", "edit-thread", "delete-thread", "thread-edit", "delete-confirm"]) {
    $(id).hidden = true;
  }
  state.shape = null;
  $("trace").replaceChildren(el("p", { class: "muted small", text: "Pick a thread to see its turns." }));
  $("trace-live").textContent = "";
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
  state.shape = await state.client.agents.get(thread.agent).catch(() => null); // side labels; gone from the catalog: none
  if (generation !== state.generation) return;
  openStream();
  refreshTree().catch(notice);
  refreshFiles().catch(notice);
  showMap(thread.agent).catch(notice);
  if (state.panel === "panel-trace") refreshTrace().catch(notice);
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
  message_deleted: ({ message_id }) => {
    state.messages.delete(message_id);
    document.querySelector(`#messages li[data-id="${CSS.escape(message_id)}"]`)?.remove();
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
      node.dataset.chunks = String(Number(node.dataset.chunks || 0) + 1); // how many deltas drew it (the test reads it)
      const text = node.querySelector(".text");
      if (text.classList.contains("markdown")) text.replaceChildren(render(message.content));
      else text.textContent = message.content;
      scrollDown();
    }
  },
  thread_status: ({ status }) => {
    setStatus(status);
    if (status === "waiting") $("trace-live").textContent = "● waiting on a blocking subagent…";
    else if (!RUNNING.has(status)) $("trace-live").textContent = "";
  },
  step_started: ({ step, side }) => {
    $("trace-live").textContent = `● step ${step}${side ? ` (side ${side.toUpperCase()})` : ""} running…`;
  },
  step_completed: () => later("trace", refreshTrace, 200),
  tool_started: ({ tool_call_id, name }) => {
    markCall(tool_call_id, "running");
    if (name) $("trace-live").textContent = `● tool ${name} running…`;
  },
  tool_completed: ({ tool_call_id, status }) => {
    markCall(tool_call_id, status);
    later("files", refreshFiles);
    later("trace", refreshTrace, 200);
  },
  turn_ended: () => {
    later("files", refreshFiles);
    later("trace", refreshTrace, 100);
    $("trace-live").textContent = "";
  },
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
  const node = messages.draw(m, {
    shape: state.shape,
    streamed: state.streamed.has(m.id),
    edit: (message) => editMessage(message),
    remove: (message) => guarded(() => removeMessage(message))(),
  });
  if (m.role === "tool" && m.tool_call_id) markCall(m.tool_call_id, m.tool_status || "done");
  for (const call of node.querySelectorAll(".call")) {
    if (state.calls.has(call.dataset.callId)) showCall(call, state.calls.get(call.dataset.callId));
  }
  if ((m.attachments || []).length) {
    node.append(el("ul", { class: "attachments" }, ...m.attachments.map((a) => fileItem(a))));
  }
  return node;
}

const messageNode = (id) => document.querySelector(`#messages li[data-id="${CSS.escape(id)}"]`);

function editMessage(m) {
  const node = messageNode(m.id);
  if (!node) return;
  messages.editor(node, m, async (content) => {
    const edited = await state.client.messages.edit(state.threadId, m.id, content);
    upsert(edited); // the stream announces it too (`message_data`)
  });
}

async function removeMessage(m) {
  // the API's rules decide: a tool result whose call is still there is refused (409 `tool_result_alone`); the
  // refusal is said on the message itself
  const node = messageNode(m.id);
  const ask = node?.querySelector(".msg-actions");
  if (node && ask && !node.dataset.confirm) {
    node.dataset.confirm = "true";
    ask.append(
      el("span", { class: "confirm-inline small" }, "delete this message? ",
        el("button", { type: "button", class: "link small danger", text: "yes", onclick: guarded(() => removeMessage(m)) }),
        el("button", { type: "button", class: "link small", text: "no", onclick: () => upsert(state.messages.get(m.id) || m) }),
      ),
    );
    return;
  }
  try {
    await state.client.messages.delete(state.threadId, m.id);
  } catch (error) {
    if (!(error instanceof AgentsError) || !node) throw error;
    node.querySelector(".confirm-inline")?.remove();
    delete node.dataset.confirm;
    node.append(el("div", { class: "error refusal", text: `Not deleted: ${error.message} (${error.code})` }));
    return;
  }
  state.messages.delete(m.id);
  node?.remove();
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
  const chosen = [...$("files-input").files];
  if ((!content && chosen.length === 0) || !state.threadId) return;
  const body = chosen.length ? { content, files: chosen } : { content };
  const sent = await state.client.messages.post(state.threadId, body);
  input.value = "";
  $("files-input").value = "";
  showChosen();
  if (!state.messages.has(sent.message_id)) {
    upsert({ id: sent.message_id, role: "user", content, status: "queued", attachments: [], metadata: {} });
  }
}

// --- files --------------------------------------------------------------------------------------------------

function fileItem(file) {
  // thumbnails are cached per thread and content; a download's failure goes to the notice
  return files.item(file, { client: state.client, threadId: state.threadId, images: state.images, failed: notice });
}

async function refreshFiles() {
  const id = state.threadId;
  if (!id) return;
  const { entries } = await state.client.files.find(id, "*");
  if (id !== state.threadId) return;
  const stored = entries.filter((e) => e.type === "file");
  $("files").replaceChildren(...stored.map(fileItem));
  if (stored.length === 0) $("files").append(el("li", { class: "muted small", text: "none" }));
}

// --- the trace and the agent map -------------------------------------------------------------------------

async function refreshTrace() {
  const id = state.threadId;
  if (!id || state.panel !== "panel-trace") return;
  const logs = await trace.load(state.client, id);
  if (id !== state.threadId) return;
  const fetchLog = (/** @type {string} */ logId) => state.client.threads.log(id, logId);
  trace.draw($("trace"), logs, [...state.messages.values()], (child) => guarded(() => selectThread(child))(), fetchLog);
}

async function showMap(name) {
  // a thread's agent, else the agent picked for a new thread; a subagent's map opens on top of it (`← back`)
  const agent = name || state.thread?.agent || $("agent").value;
  if (!agent) return;
  state.maps = [agent];
  await drawMap();
}

async function drawMap() {
  const name = state.maps.at(-1);
  const detail = await state.client.agents.get(name);
  if (state.maps.at(-1) !== name) return;
  const back = state.maps.length > 1 ? () => {
    state.maps.pop();
    guarded(drawMap)();
  } : null;
  agentMap.draw($("map"), detail, (next) => {
    state.maps.push(next);
    guarded(drawMap)();
  }, back);
}

function showPanel(id) {
  state.panel = id;
  for (const tab of document.querySelectorAll(".tabs .tab")) {
    const on = tab.dataset.panel === id;
    tab.setAttribute("aria-selected", String(on));
    $(tab.dataset.panel).hidden = !on;
  }
  document.querySelector(".layout").classList.toggle("wide", id !== "panel-thread");
  if (id === "panel-trace") refreshTrace().catch(notice);
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
  $("agent").addEventListener("change", () => {
    describeAgent();
    if (!state.threadId) showMap().catch(notice);
  });
  $("thread-search").addEventListener("input", showThreads);
  $("thread-filters").addEventListener("submit", (event) => event.preventDefault());
  for (const id of ["filter-agent", "filter-status"]) $(id).addEventListener("change", guarded(loadThreads));
  $("filter-tag").addEventListener("input", () => later("threads", loadThreads));
  $("edit-thread").addEventListener("click", editThread);
  $("thread-edit").addEventListener("submit", guarded(saveThread));
  $("edit-cancel").addEventListener("click", () => {
    $("thread-edit").hidden = true;
  });
  $("delete-thread").addEventListener("click", askDelete);
  $("delete-yes").addEventListener("click", guarded(deleteThread));
  $("delete-no").addEventListener("click", () => {
    $("delete-confirm").hidden = true;
  });
  $("refresh-trace").addEventListener("click", guarded(refreshTrace));
  for (const tab of document.querySelectorAll(".tabs .tab")) {
    tab.addEventListener("click", () => showPanel(tab.dataset.panel));
  }
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
opening(selectThread);
state.key = sessionStorage.getItem(KEY) || "";
guarded(connect)();
