// The selected thread's subagents as a tree (each opens its thread), and the scoped-variable requests its children
// raise: a form per request, whose values go to that child only.

import { el, short } from "./dom.js";
import { $, guarded, later, state } from "./page.js";

const REQUEST_PATH = /^\/threads\/([0-9a-f-]{36})\/variables\/([0-9a-f-]{36})$/;

/** @type {(threadId: string) => Promise<void>} */
let open = async () => {};

/**
 * What a subagent's link opens: the page's thread selection.
 * @param {(threadId: string) => Promise<void>} select
 */
export function opening(select) {
  open = select;
}

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
          { type: "button", class: "link", title: entry.reference, onclick: guarded(() => open(entry.reference)) },
          el("span", { text: entry.thread_name || entry.title || entry.name }),
          el("span", { class: `badge ${entry.status}`, text: entry.status }),
        ),
        below.length ? renderTree(below) : null,
      ),
    ),
  );
}

export async function refreshTree() {
  const id = state.threadId;
  if (!id) return;
  const nodes = await children(id, 0);
  if (id !== state.threadId) return;
  const tree = $("tree");
  if (nodes.length === 0) tree.replaceChildren("none");
  else tree.replaceChildren(renderTree(nodes));
}

export async function addRequest(data) {
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
        el("button", { type: "button", class: "link", text: short(child), onclick: guarded(() => open(child)) }),
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
