// How a message is drawn: who or what it comes from (user, assistant, tool, system, an effect, a subagent, side A or
// side B of a `dual_ai` thread), its text (Markdown for what a model or the system wrote, plain text for what a
// person, an effect or a tool wrote), its tool calls and attachments, and its edit and delete controls.

import { el } from "./dom.js";
import { render } from "./markdown.js";

/**
 * @typedef {{ id: string, role: string, side?: string | null, content: string | null, name?: string | null,
 *   tool_calls?: { id: string, function: { name: string, arguments: string } }[] | null,
 *   tool_call_id?: string | null, tool_status?: string | null, status: string, silent?: boolean,
 *   attachments: Record<string, any>[], metadata: Record<string, any>, subagent_id?: string | null,
 *   subagent_name?: string | null, subagent_title?: string | null, model?: string | null,
 *   usage?: Record<string, number> | null, created_at?: string }} Message
 * @typedef {{ type: string, side_a?: { label: string | null }, side_b?: { label: string | null } | null }} ThreadShape
 */

/**
 * Where a message comes from: its kind (a CSS class) and the words that say so.
 * @param {Message} m
 * @param {ThreadShape | null} shape the thread's agent (its type and side labels), when known
 * @returns {{ kind: string, label: string }}
 */
export function source(m, shape) {
  const meta = m.metadata || {};
  if (m.role === "tool") return { kind: "tool", label: `tool · ${m.name || "?"}` };
  if (m.role === "system") return { kind: "system", label: "system" };
  if (meta.source === "effect") return { kind: "effect", label: `effect${meta.effect ? ` · ${meta.effect}` : ""}` };
  if (m.subagent_id) return { kind: "subagent", label: `subagent · ${m.subagent_title || m.subagent_name || "?"}` };
  // a `dual_ai` thread stores side B's answers as `user` messages (side A's perspective): a model wrote them
  const modelWrote = m.role === "assistant" || Boolean(m.model) || Boolean((m.tool_calls || []).length);
  if (shape?.type === "dual_ai" && modelWrote && (m.side === "a" || m.side === "b")) {
    const side = m.side === "a" ? shape.side_a : shape.side_b;
    return { kind: `side-${m.side}`, label: `${side?.label || "side"} · side ${m.side.toUpperCase()}` };
  }
  return { kind: m.role, label: m.role };
}

/**
 * The message's text: Markdown, sanitized, for a model's or the system's words; plain text otherwise.
 * @param {Message} m
 * @param {string} kind from `source`
 */
export function body(m, kind) {
  const text = m.content || "";
  const box = el("div", { class: "text" });
  if (text && ["assistant", "system", "subagent", "side-a", "side-b"].includes(kind)) {
    box.classList.add("markdown");
    box.append(render(text));
  } else {
    box.textContent = text;
  }
  return box;
}

/** @param {Record<string, number> | null | undefined} usage */
export function tokens(usage) {
  if (!usage || usage.input_tokens == null) return null;
  return `${usage.input_tokens} in / ${usage.output_tokens ?? 0} out`;
}

/**
 * @param {Message} m
 * @param {{ shape: ThreadShape | null, streamed: boolean, edit: (m: Message) => void, remove: (m: Message) => void }} how
 */
export function draw(m, how) {
  const { kind, label } = source(m, how.shape);
  const classes = ["msg", m.role, kind, m.status];
  if (m.silent) classes.push("silent");
  if (m.tool_status) classes.push(`tool-${m.tool_status}`);
  const who = [label];
  if (m.model) who.push(m.model);
  const used = tokens(m.usage);
  if (used) who.push(used);
  if (m.silent) who.push("silent");
  if (m.status === "queued" || m.status === "pending" || m.status === "failed") who.push(m.status);
  if (m.role === "tool" && m.tool_status) who.push(m.tool_status);
  const controls =
    m.status === "pending"
      ? null
      : el(
          "span",
          { class: "msg-actions" },
          m.role === "tool" ? null : el("button", { type: "button", class: "link small", text: "edit", onclick: () => how.edit(m) }),
          el("button", { type: "button", class: "link small", text: "delete", onclick: () => how.remove(m) }),
        );
  const node = el(
    "li",
    { class: classes.join(" "), dataset: { id: m.id, role: m.role, source: kind } },
    el("div", { class: "who" }, el("span", { text: who.join(" · ") }), controls),
    body(m, kind),
  );
  const error = m.status === "failed" ? (m.metadata || {}).error : null; // why it failed: `{code, message}`
  if (error && typeof error === "object") {
    node.append(el("div", { class: "error", text: `${error.message} (${error.code})` }));
  }
  if (how.streamed) node.dataset.streamed = "true";
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
  }
  return node;
}

/**
 * Turn a message's text into an editor in place; `save` gets the new text, `done` puts the message back.
 * @param {HTMLElement} node the message's `li`
 * @param {Message} m
 * @param {(text: string) => Promise<void>} save
 */
export function editor(node, m, save) {
  const text = /** @type {HTMLElement} */ (node.querySelector(".text"));
  const input = /** @type {HTMLTextAreaElement} */ (el("textarea", { class: "edit-text", rows: 3, "aria-label": "Message text" }));
  input.value = m.content || "";
  const problem = el("div", { class: "error small", hidden: true });
  const form = el(
    "form",
    { class: "edit-form" },
    input,
    problem,
    el(
      "div",
      { class: "edit-actions" },
      el("button", { type: "submit", text: "Save" }),
      el("button", { type: "button", class: "quiet", text: "Cancel", onclick: () => form.replaceWith(text) }),
    ),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    save(input.value).catch((/** @type {any} */ error) => {
      problem.textContent = `${error.message}${error.code ? ` (${error.code})` : ""}`;
      problem.hidden = false;
    });
  });
  text.replaceWith(form);
  input.focus();
}
