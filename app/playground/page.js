// The page's shared state and small helpers: the element finder, the notice line, guarded handlers, debounced calls.

import { AgentsClient, AgentsError } from "./client.js";
import { el } from "./dom.js";

/** @type {(id: string) => any} */
export const $ = (id) => document.getElementById(id);
export const RUNNING = new Set(["running", "queued", "waiting"]); // a turn under way: Stop shows only then

export const state = {
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
  threads: [], // the list as last loaded (filtered by agent, tag and status on the server)
  shape: null, // the selected thread's agent (`GET /agents/{name}`): its type and side labels, for the messages
  maps: [], // the agent names of the map panel, the one shown last (a subagent's map opens on top)
  panel: "panel-thread",
  /** @type {Record<string, any>} */
  timers: {},
};

export function notice(error) {
  const box = $("notice");
  if (!error) {
    box.hidden = true;
    return;
  }
  const text = error instanceof AgentsError ? `${error.message} (${error.code})` : String(error.message || error);
  box.replaceChildren(el("span", { text }), el("button", { class: "quiet", type: "button", text: "×", onclick: () => notice(null) }));
  box.hidden = false;
}

export function guarded(fn) {
  // called at once (a handler's preventDefault must run before the event ends); failures go to the notice
  return (...args) => {
    try {
      Promise.resolve(fn(...args)).catch(notice);
    } catch (error) {
      notice(error);
    }
  };
}

export function later(name, fn, ms = 300) {
  clearTimeout(state.timers[name]);
  state.timers[name] = setTimeout(guarded(fn), ms);
}

export const codePoints = (text) => {
  let n = 0;
  for (const _ of text) n += 1;
  return n;
};

export const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
