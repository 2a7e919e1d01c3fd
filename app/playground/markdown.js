// Markdown for the playground: parsed by marked, sanitized by DOMPurify (both vendored, see vendor/README.md),
// returned as a DOM fragment (never set as HTML by this page), with code blocks highlighted by the small tokenizer
// below. Raw HTML in the text shows as text; images, forms and inline styles are dropped (the page's
// Content-Security-Policy would refuse them anyway, and a reply has no business drawing controls into the page).

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escape = (/** @type {string} */ text) => text.replace(/[&<>"']/g, (c) => ESCAPES[/** @type {keyof ESCAPES} */ (c)]);

// HTML written in the Markdown shows as the text it is: it is never parsed (even inertly: Chromium reports the
// inline handlers and styles it meets to the page's CSP); DOMPurify then checks what marked itself made (links)
const parser = new Marked({ gfm: true, breaks: true, async: false });
parser.use({ renderer: { html: ({ text }) => escape(text) } });

const PURIFY = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ["img", "picture", "video", "audio", "source", "style", "form", "input", "button", "textarea", "select", "iframe"],
  FORBID_ATTR: ["style", "id", "name"],
  ADD_ATTR: ["target"],
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank"); // a link never replaces the playground
    node.setAttribute("rel", "noopener noreferrer");
  }
});

/**
 * The sanitized DOM of a Markdown text.
 * @param {string} text
 * @returns {DocumentFragment}
 */
export function render(text) {
  const html = /** @type {string} */ (parser.parse(text));
  const fragment = /** @type {DocumentFragment} */ (/** @type {unknown} */ (DOMPurify.sanitize(html, PURIFY)));
  for (const code of fragment.querySelectorAll("pre > code")) highlight(/** @type {HTMLElement} */ (code));
  return fragment;
}

// --- a small highlighter: comments, strings, numbers and keywords, enough to read a reply's code ------------

const KEYWORDS = new Set(
  (
    "and as assert async await break case catch class const continue def default del delete do elif else except " +
    "export extends false finally for from function global if import in instanceof is lambda let new none not null " +
    "or pass raise return self static super switch this throw true try type typeof undefined var void while with " +
    "yield select insert update where join group order by limit values into create table fn pub impl struct enum " +
    "match mut use func package interface go defer chan map then fi esac done echo local"
  ).split(" "),
);
const HASH_COMMENTS = new Set(["python", "py", "bash", "sh", "shell", "zsh", "yaml", "yml", "toml", "ruby", "rb", "r", "dockerfile", "ini"]);
const DASH_COMMENTS = new Set(["sql", "lua", "haskell", "hs"]);

/** @param {string} language */
function pattern(language) {
  const comment = HASH_COMMENTS.has(language) ? "#[^\\n]*" : DASH_COMMENTS.has(language) ? "--[^\\n]*" : "\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?\\*\\/";
  const strings = "\"(?:\\\\[\\s\\S]|[^\"\\\\\\n])*\"|'(?:\\\\[\\s\\S]|[^'\\\\\\n])*'|`(?:\\\\[\\s\\S]|[^`\\\\])*`";
  return new RegExp(`(${comment})|(${strings})|(\\b\\d[\\d_.]*(?:e[+-]?\\d+)?\\b)|([A-Za-z_$][\\w$]*)`, "g");
}

/**
 * Replace a code block's text with the same text in spans (`tok-comment`, `tok-string`, `tok-number`,
 * `tok-keyword`); the block's language comes from its `language-…` class.
 * @param {HTMLElement} code
 */
export function highlight(code) {
  const text = code.textContent || "";
  const language = (/language-([\w+-]+)/.exec(code.className) || [])[1]?.toLowerCase() || "";
  code.parentElement?.setAttribute("data-language", language || "text");
  if (!language || language === "text" || language === "plain") return;
  const out = document.createDocumentFragment();
  let at = 0;
  for (const found of text.matchAll(pattern(language))) {
    const [whole, comment, string, number, word] = found;
    const kind = comment ? "comment" : string ? "string" : number ? "number" : word && KEYWORDS.has(word.toLowerCase()) ? "keyword" : null;
    if (!kind) continue;
    const start = found.index ?? 0;
    if (start > at) out.append(text.slice(at, start));
    const span = document.createElement("span");
    span.className = `tok-${kind}`;
    span.textContent = whole;
    out.append(span);
    at = start + whole.length;
  }
  out.append(text.slice(at));
  code.replaceChildren(out);
}
