// The agent map: `GET /agents/{name}` drawn as a tree — the agent, its sides (each with how its turn stops and the
// session tools it binds), the prompt each side runs and the subprompts they reach, each prompt with its model,
// hooks and tools by kind. A subagent or handoff node opens that agent's own map.

import { el } from "./dom.js";

/**
 * @typedef {{ name: string, kind: "tool" | "subprompt" | "subagent" | "handoff", description: string | null,
 *   optional: string | null, blocking: boolean | null, resumable: boolean | null, immediate: boolean | null }} ToolLink
 * @typedef {{ name: string, model: string, description: string | null, include_chat: boolean, includes: string[],
 *   hooks: string[], tools: ToolLink[] }} PromptDetail
 * @typedef {{ label: string | null, prompt: string, stop_on_response: boolean, stop_tool: string | null,
 *   max_steps: number | null, session_tools: Record<string, string> }} Side
 * @typedef {{ name: string, type: string, title: string | null, description: string | null,
 *   variables: { name: string, type: string, required: boolean, scoped: boolean }[], side_a: Side,
 *   side_b: Side | null, max_session_turns: number | null, hooks: string[], prompt_details: PromptDetail[] }} AgentDetail
 */

const ICONS = { tool: "⚙", subprompt: "↳", subagent: "⇢", handoff: "⇄" };

/** Scroll to a prompt's card (the address keeps naming the thread). @param {string} name */
const jump = (name) => document.getElementById(`map-prompt-${name}`)?.scrollIntoView({ block: "nearest" });

/** @param {ToolLink} link */
function modes(link) {
  if (link.kind !== "subagent") return [];
  return [
    link.blocking ? "blocking" : "non-blocking",
    link.resumable ? "resumable" : null,
    link.immediate ? "immediate" : null,
  ].filter((m) => m !== null);
}

/**
 * @param {ToolLink} link
 * @param {(name: string) => void} openAgent
 */
function toolNode(link, openAgent) {
  const tags = [...modes(link), link.optional ? `optional: ${link.optional}` : null].filter(Boolean);
  const label = el(
    "span",
    { class: "map-tool-name" },
    el("span", { class: "map-icon", text: ICONS[link.kind] }),
    el("strong", { text: link.name }),
    el("span", { class: "muted", text: link.kind }),
  );
  const head =
    link.kind === "subagent" || link.kind === "handoff"
      ? el("button", { type: "button", class: "link", title: `Open the map of ${link.name}`, onclick: () => openAgent(link.name) }, label)
      : link.kind === "subprompt"
        ? el("button", { type: "button", class: "link", onclick: () => jump(link.name) }, label)
        : label;
  return el(
    "li",
    { class: `map-tool ${link.kind}`, dataset: { tool: link.name, kind: link.kind } },
    head,
    ...tags.map((t) => el("span", { class: "badge", text: String(t) })),
    link.description ? el("div", { class: "muted small", text: link.description }) : null,
  );
}

/**
 * @param {PromptDetail} prompt
 * @param {(name: string) => void} openAgent
 */
function promptNode(prompt, openAgent) {
  const facts = [
    `model ${prompt.model}`,
    prompt.include_chat ? "sees the chat" : "no chat",
    prompt.includes.length ? `includes ${prompt.includes.join(", ")}` : null,
    prompt.hooks.length ? `hooks ${prompt.hooks.join(", ")}` : null,
  ].filter(Boolean);
  return el(
    "section",
    { class: "map-prompt", id: `map-prompt-${prompt.name}`, dataset: { prompt: prompt.name } },
    el("h4", {}, el("span", { class: "map-icon", text: "✎" }), el("span", { text: prompt.name })),
    prompt.description ? el("p", { class: "muted small", text: prompt.description }) : null,
    el("p", { class: "small", text: facts.join(" · ") }),
    prompt.tools.length
      ? el("ul", { class: "map-tools" }, ...prompt.tools.map((t) => toolNode(t, openAgent)))
      : el("p", { class: "muted small", text: "no tools" }),
  );
}

/**
 * @param {string} which
 * @param {Side} side
 */
function sideNode(which, side) {
  const stops = [
    side.stop_on_response ? "stops on an answer without tool calls" : null,
    side.stop_tool ? `stops on ${side.stop_tool}` : null,
    side.max_steps ? `at most ${side.max_steps} steps` : null,
    ...Object.entries(side.session_tools).map(([kind, tool]) => `session ${kind}: ${tool}`),
  ].filter(Boolean);
  return el(
    "li",
    { class: `map-side side-${which}`, dataset: { side: which } },
    el("strong", { text: `Side ${which.toUpperCase()}${side.label ? ` · ${side.label}` : ""}` }),
    " runs ",
    el("button", { type: "button", class: "link", text: side.prompt, onclick: () => jump(side.prompt) }),
    el("div", { class: "muted small", text: stops.join(" · ") || "no stop rule" }),
  );
}

/**
 * Draw an agent's map into `box`.
 * @param {HTMLElement} box
 * @param {AgentDetail} agent
 * @param {(name: string) => void} openAgent
 * @param {(() => void) | null} back to the map shown before, if any
 */
export function draw(box, agent, openAgent, back) {
  const needs = agent.variables.filter((v) => v.required).map((v) => `${v.name}${v.scoped ? " (scoped)" : ""}`);
  const facts = [
    agent.type,
    agent.max_session_turns ? `at most ${agent.max_session_turns} turns a session` : null,
    agent.hooks.length ? `hooks ${agent.hooks.join(", ")}` : null,
    needs.length ? `needs ${needs.join(", ")}` : null,
  ].filter(Boolean);
  box.replaceChildren(
    el(
      "div",
      { class: "map-agent", dataset: { agent: agent.name } },
      back ? el("button", { type: "button", class: "quiet small", text: "← back", onclick: back }) : null,
      el("h3", { text: agent.title ? `${agent.title} (${agent.name})` : agent.name }),
      agent.description ? el("p", { class: "muted small", text: agent.description }) : null,
      el("p", { class: "small", text: facts.join(" · ") }),
      el(
        "ul",
        { class: "map-sides" },
        sideNode("a", agent.side_a),
        agent.side_b ? sideNode("b", agent.side_b) : null,
      ),
    ),
    el("div", { class: "map-prompts" }, ...agent.prompt_details.map((p) => promptNode(p, openAgent))),
  );
}
