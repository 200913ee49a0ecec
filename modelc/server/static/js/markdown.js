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

function thinkingBox() {
  const box = document.createElement("details");
  box.className = "reasoning";
  box.append(document.createElement("summary"), document.createElement("div"));
  return box;
}

/**
 * Render a reply as markdown into `el`: its thinking trace (`reasoning`, the server's
 * `reasoning_content`, or a `<think>...</think>` the text starts with, from a server that
 * leaves the trace in the answer) in a "Thinking" <details> block above the answer. The
 * block is open while the trace streams and folds when the answer starts; re-rendering
 * the same `el` keeps whatever the reader opened or closed in between.
 */
export function renderMarkdown(el, text, reasoning = "") {
  let thinking = reasoning, still = Boolean(reasoning) && !text;
  const m = /^\s*<think>([\s\S]*?)(<\/think>|$)/.exec(text);
  if (m) {
    thinking += m[1];
    still = !m[2];  // no end marker yet
    text = text.slice(m[0].length);
  }
  let box = el.querySelector(":scope > details.reasoning");
  let answer = el.querySelector(":scope > div.answer");
  if (!answer) {
    el.textContent = "";
    box = null;
    answer = document.createElement("div");
    answer.className = "answer";
    el.append(answer);
  }
  if (thinking.trim()) {
    if (!box) {
      box = thinkingBox();
      el.prepend(box);
    }
    const phase = still ? "thinking" : "answer";
    if (box.dataset.phase !== phase) {  // fold it when the answer starts, once
      box.dataset.phase = phase;
      box.open = still;
    }
    box.firstChild.textContent = still ? "Thinking…" : "Thinking";
    box.lastChild.innerHTML = sanitize(marked.parse(thinking.trim()));
  } else if (box) {
    box.remove();
  }
  answer.innerHTML = sanitize(marked.parse(text));
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
