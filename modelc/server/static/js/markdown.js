// Markdown to sanitised HTML (marked + DOMPurify), code highlighted (highlight.js) with
// copy buttons. Whatever the model writes ends up inert: no scripts, no event handlers,
// no javascript: links.
import {marked} from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.js";
import hljs from "../vendor/highlight.min.js";

marked.setOptions({gfm: true, breaks: false});
hljs.configure({ignoreUnescapedHTML: true});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    if (!/^(https?:|mailto:|#)/i.test(href)) node.removeAttribute("href");  // relative, data:…
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

const PURIFY = {
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "object",
    "embed", "img", "svg", "math"],
  FORBID_ATTR: ["style", "id", "name"],
};

export function sanitize(html) {
  return DOMPurify.sanitize(html, PURIFY);
}

/**
 * Render `text` as markdown into `el` (replacing its content). A reply that starts with
 * the model's reasoning (`<think>...</think>`, as Qwen3 and DeepSeek-R1 write it) shows it
 * in a collapsible block, open while it is still being written.
 */
export function renderMarkdown(el, text) {
  const m = /^\s*<think>([\s\S]*?)(<\/think>|$)/.exec(text);
  el.textContent = "";
  if (m) {
    const box = document.createElement("details");
    box.className = "reasoning";
    box.open = !m[2];  // still thinking
    const head = document.createElement("summary");
    head.textContent = m[2] ? "Reasoning" : "Reasoning…";
    const inner = document.createElement("div");
    inner.innerHTML = sanitize(marked.parse(m[1].trim()));
    box.append(head, inner);
    el.append(box);
    text = text.slice(m[0].length);
  }
  const rest = document.createElement("div");
  rest.innerHTML = sanitize(marked.parse(text));
  el.append(rest);
  for (const code of el.querySelectorAll("pre > code")) {
    const lang = (code.className.match(/language-([\w+#.-]+)/) || [])[1] || "";
    if (lang && !hljs.getLanguage(lang)) code.className = "";  // unknown: auto-detect
    try {
      hljs.highlightElement(code);
    } catch { /* leave it plain */ }
    const pre = code.parentElement;
    const bar = document.createElement("div");
    bar.className = "code-bar";
    const name = document.createElement("span");
    name.textContent = lang || (code.result && code.result.language) || "";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", "Copy code");
    bar.append(name, copy);
    pre.before(bar);
  }
}

/** The copy buttons' handler (delegated from the log). */
export async function copyCode(button) {
  const pre = button.parentElement.nextElementSibling;
  const text = pre ? pre.textContent : "";
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const ta = document.createElement("textarea");  // no clipboard API (plain http)
    ta.value = text;
    document.body.append(ta);
    ta.select();
    document.execCommand("copy");
    ta.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}
