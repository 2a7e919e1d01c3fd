// A thread's files as the page lists them: a thumbnail for an image (fetched with the key, since an <img src> could
// not send it, and shown from a blob: URL), the name, path, type and size, and a download button.

import { el } from "./dom.js";

const IMAGE = /^image\/(png|jpeg|gif|webp)$/;

/**
 * @typedef {{ path: string, name: string, mime_type?: string | null, size?: number | null, etag?: string }} FileRecord
 * @typedef {{ client: import("./client.js").AgentsClient, threadId: string, images: Map<string, Promise<string>>,
 *   failed: (error: unknown) => void }} Where
 */

/** @param {number | null | undefined} bytes */
export function size(bytes) {
  if (bytes == null) return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

/**
 * The object URL of a file's thumbnail, fetched once per content (a refusal is not kept: the next render asks again).
 * @param {Where} where
 * @param {string} path
 * @param {unknown} etag
 */
function thumbnail(where, path, etag) {
  const key = `${where.threadId}:${path}:${etag}`;
  if (!where.images.has(key)) {
    where.images.set(
      key,
      where.client.files
        .download(where.threadId, path, { thumbnail: true })
        .then((/** @type {Response} */ r) => r.blob())
        .then((blob) => URL.createObjectURL(blob))
        .catch((error) => {
          where.images.delete(key);
          throw error;
        }),
    );
  }
  return /** @type {Promise<string>} */ (where.images.get(key));
}

/**
 * Save a file: a blob: URL has this page's origin, so it is typed as bytes — it can only ever be saved, never
 * rendered here.
 * @param {Where} where
 * @param {FileRecord} file
 */
async function download(where, file) {
  const response = await where.client.files.download(where.threadId, file.path);
  const bytes = new Blob([await response.blob()], { type: "application/octet-stream" });
  const url = URL.createObjectURL(bytes);
  const link = el("a", { href: url, download: file.name || file.path.split("/").pop() });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/**
 * A file's entry in a list (the thread's files, or a message's attachments).
 * @param {FileRecord} file
 * @param {Where} where
 */
export function item(file, where) {
  const entry = el("li", { class: "file", dataset: { path: file.path } });
  if (IMAGE.test(file.mime_type || "")) {
    const img = /** @type {HTMLImageElement} */ (el("img", { class: "thumb", alt: file.name, loading: "lazy" }));
    thumbnail(where, file.path, file.etag || file.size)
      .then((url) => {
        img.src = url;
      })
      .catch(() => img.replaceWith(el("span", { class: "thumb none", text: "no preview" })));
    entry.append(img);
  } else {
    entry.append(el("span", { class: "thumb none", text: (file.name.split(".").pop() || "file").slice(0, 4) }));
  }
  entry.append(
    el(
      "div",
      { class: "file-about" },
      el("span", { class: "name", text: file.name || file.path, title: file.path }),
      el("span", { class: "path muted small", text: file.path, title: file.path }),
      el("span", { class: "muted small", text: [file.mime_type, size(file.size)].filter(Boolean).join(" · ") }),
    ),
    el("button", {
      type: "button",
      class: "quiet small",
      text: "Download",
      onclick: () => download(where, file).catch(where.failed),
    }),
  );
  return entry;
}
