// The turn trace: a thread's `/logs` (every model call, tool call and hook run, stored as they happen) drawn as
// one timeline per turn, a turn starting at each message a user (or an effect) queued. A model call's whole request
// is read when its `request` is opened (`GET /threads/{id}/logs/{log_id}`: kept under `LOG_REQUESTS=full`, else the
// brief). Live news (steps and tools under way) comes from the thread's stream, which app.js passes to `live`.

import { el, short } from "./dom.js";

/**
 * @typedef {{ id: string, kind: string, message_id: string | null, model: string | null, provider: string | null,
 *   tool: string | null, attempt: number, status: string, error: string | null, input_tokens: number | null,
 *   output_tokens: number | null, cached_tokens: number | null, reasoning_tokens: number | null,
 *   cost: number | null, latency_ms: number | null, ttft_ms: number | null, finish_reason: string | null,
 *   response: Record<string, any> | null, request: Record<string, any> | null, retry_of: string | null,
 *   fallback_of: string | null, created_at: string }} Log
 * @typedef {(logId: string) => Promise<{ request_full: Record<string, any> | null }>} Fetch one log, in full
 * @typedef {{ id: string, role: string, content: string | null, silent: boolean, created_at?: string,
 *   subagent_id?: string | null, tool_call_id?: string | null, name?: string | null, model?: string | null,
 *   tool_calls?: unknown[] | null, metadata?: Record<string, any> }} Msg
 */

/**
 * Every log of a thread, oldest first (the API pages them 500 at a time).
 * @param {import("./client.js").AgentsClient} client
 * @param {string} threadId
 * @returns {Promise<Log[]>}
 */
export async function load(client, threadId) {
  /** @type {Log[]} */
  const all = [];
  let cursor;
  do {
    const page = await client.threads.logs(threadId, { limit: 500, cursor });
    all.push(...page.logs);
    cursor = page.next_cursor || undefined;
  } while (cursor);
  return all;
}

/**
 * Whether a message opens a turn: one a person or an effect queued — not a `dual_ai` side B's model output (stored
 * as `user`, with its `model`), nor a subagent's news.
 * @param {Msg} m
 */
const opensTurn = (m) => m.role === "user" && !m.model && !(m.tool_calls || []).length && !m.subagent_id;

/**
 * The logs in turns: a log belongs to the last turn opened before it.
 * @param {Log[]} logs
 * @param {Msg[]} messages
 */
export function turns(logs, messages) {
  const starts = messages
    .filter((m) => opensTurn(m) && m.created_at)
    .map((m) => ({ at: String(m.created_at), message: m }))
    .sort((a, b) => a.at.localeCompare(b.at));
  const made = messages.map((m) => String(m.created_at || "")).filter(Boolean).sort();
  /** @type {{ message: Msg | null, logs: Log[] }[]} */
  const groups = [];
  for (const log of logs) {
    // a `before_create_message` hook runs before the message it makes: it is placed at that message, so the hooks
    // of a turn's opening message are the turn's
    const at = log.kind === "hook" && log.request?.hook === "before_create_message"
      ? made.find((t) => t >= log.created_at) || log.created_at
      : log.created_at;
    let index = -1;
    for (let i = 0; i < starts.length; i += 1) if (starts[i].at <= at) index = i;
    const message = index >= 0 ? starts[index].message : null;
    let group = groups.find((g) => g.message === message);
    if (!group) {
      group = { message, logs: [] };
      groups.push(group);
    }
    group.logs.push(log);
  }
  return groups;
}

/** @param {Log[]} logs */
export function totals(logs) {
  const llm = logs.filter((l) => l.kind === "llm");
  const sum = (/** @type {(l: Log) => number | null} */ pick) => llm.reduce((n, l) => n + (pick(l) || 0), 0);
  return {
    calls: llm.length,
    tools: logs.filter((l) => l.kind === "tool").length,
    input: sum((l) => l.input_tokens),
    output: sum((l) => l.output_tokens),
    cached: sum((l) => l.cached_tokens),
    cost: llm.some((l) => l.cost != null) ? sum((l) => l.cost) : null,
  };
}

const ms = (/** @type {number | null} */ value) =>
  value == null ? "–" : `${value < 10 ? value.toFixed(2) : Math.round(value)} ms`;
const usd = (/** @type {number | null} */ value) => (value == null ? "no price" : `$${value.toFixed(6)}`);

/** @param {ReturnType<typeof totals>} t */
export function summary(t) {
  const cost = t.cost == null ? "" : ` · ${usd(t.cost)}`;
  return `${t.calls} model call${t.calls === 1 ? "" : "s"} · ${t.input} in / ${t.output} out (${t.cached} cached)${cost} · ${t.tools} tool${t.tools === 1 ? "" : "s"}`;
}

/**
 * A `<details>` that shows a JSON value (a request, a response) only when opened.
 * @param {string} label
 * @param {unknown} value
 */
function reveal(label, value) {
  const box = el("details", { class: "json" }, el("summary", { text: label }));
  box.addEventListener(
    "toggle",
    () => {
      if (box.open && box.childElementCount === 1) box.append(el("pre", { text: JSON.stringify(value, null, 2) }));
    },
  );
  return box;
}

/**
 * A model call's request, read in full when opened: the whole request if the server kept it, else the brief.
 * @param {Log} log
 * @param {Fetch} fetchLog
 */
function request(log, fetchLog) {
  const box = el("details", { class: "json request" }, el("summary", { text: "request" }));
  box.addEventListener("toggle", () => {
    if (!box.open || box.childElementCount > 1) return;
    const pending = el("p", { class: "muted small", text: "Reading the whole request…" });
    box.append(pending);
    fetchLog(log.id).then(
      (found) => {
        const full = found.request_full;
        const note = full
          ? `The whole request: ${full.messages?.length ?? 0} messages, ${full.tools?.length ?? 0} tools offered`
          : "Only the brief was kept: the server runs with LOG_REQUESTS=brief.";
        box.dataset.full = full ? "true" : "false";
        pending.replaceWith(
          el("p", { class: "muted small request-note", text: note }),
          el("pre", { text: JSON.stringify(full || log.request, null, 2) }),
        );
      },
      (/** @type {any} */ error) => {
        pending.replaceWith(el("p", { class: "error small", text: `Could not read the request: ${error?.message || error}` }));
      },
    );
  });
  return box;
}

/**
 * @param {Log} log
 * @param {Map<string, Msg>} byId
 * @param {(threadId: string) => void} open
 * @param {Fetch} fetchLog
 */
function entry(log, byId, open, fetchLog) {
  const classes = `trace-entry ${log.kind} ${log.status}`;
  if (log.kind === "llm") {
    const tags = [log.retry_of ? "retry" : null, log.fallback_of ? "fallback" : null, log.attempt > 1 ? `attempt ${log.attempt}` : null];
    return el(
      "li",
      { class: classes, dataset: { kind: "llm", id: log.id } },
      el(
        "div",
        { class: "trace-line" },
        el("span", { class: "trace-kind", text: "model" }),
        el("strong", { text: log.model || "?" }),
        el("span", { class: "muted", text: log.provider || "" }),
        ...tags.filter(Boolean).map((t) => el("span", { class: "badge waiting", text: String(t) })),
        el("span", { class: `badge ${log.status === "success" ? "idle" : "failed"}`, text: log.status }),
      ),
      el(
        "div",
        { class: "trace-numbers small", dataset: { tokens: `${log.input_tokens ?? 0}/${log.output_tokens ?? 0}` } },
        `tokens ${log.input_tokens ?? "–"} in / ${log.output_tokens ?? "–"} out / ${log.cached_tokens ?? 0} cached`,
        ` · ${usd(log.cost)} · ${ms(log.latency_ms)} (first token ${ms(log.ttft_ms)})`,
        log.finish_reason ? ` · ${log.finish_reason}` : "",
      ),
      log.error ? el("div", { class: "error small", text: log.error }) : null,
      request(log, fetchLog),
      log.response ? reveal("response", log.response) : null,
    );
  }
  const message = log.message_id ? byId.get(log.message_id) : undefined;
  const child = message?.subagent_id;
  return el(
    "li",
    { class: classes, dataset: { kind: log.kind, id: log.id } },
    el(
      "div",
      { class: "trace-line" },
      el("span", { class: "trace-kind", text: log.kind }),
      el("strong", { text: log.tool || "?" }),
      log.kind === "hook" && log.request?.hook ? el("span", { class: "muted small", text: log.request.hook }) : null,
      el("span", { class: "trace-duration small", text: ms(log.latency_ms) }),
      el("span", { class: `badge ${log.status === "success" ? "idle" : "failed"}`, text: log.status }),
      child
        ? el("button", { type: "button", class: "link small", text: `child ${short(child)} →`, onclick: () => open(child) })
        : null,
    ),
    log.error ? el("div", { class: "error small", text: log.error }) : null,
    log.response ? reveal("result", log.response) : message?.content ? reveal("result", message.content) : null,
  );
}

/**
 * Draw the trace of a thread into `box`.
 * @param {HTMLElement} box
 * @param {Log[]} logs
 * @param {Msg[]} messages
 * @param {(threadId: string) => void} open a child thread
 * @param {Fetch} fetchLog one log with its whole request
 */
export function draw(box, logs, messages, open, fetchLog) {
  const byId = new Map(messages.map((m) => [m.id, m]));
  const groups = turns(logs, messages);
  if (groups.length === 0) {
    box.replaceChildren(el("p", { class: "muted small", text: "No model or tool call yet: send a message." }));
    return;
  }
  const all = totals(logs);
  box.replaceChildren(
    el("p", { class: "trace-total small", text: `Thread: ${summary(all)}` }),
    ...groups.map((group) => {
      const said = group.message?.content || "";
      const number = groups.filter((g) => g.message).indexOf(group) + 1;
      const title = group.message ? `Turn ${number}: “${said.length > 60 ? `${said.slice(0, 60)}…` : said}”` : "Before the first message";
      return el(
        "section",
        { class: "trace-turn", dataset: { turn: String(number) } },
        el("h3", {}, el("span", { text: title }), el("span", { class: "muted small trace-sum", text: summary(totals(group.logs)) })),
        el("ol", { class: "trace-list" }, ...group.logs.map((log) => entry(log, byId, open, fetchLog))),
      );
    }),
  );
}
