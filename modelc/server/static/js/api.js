// The server's HTTP API: JSON GETs and the streamed /v1/chat/completions (SSE).

export class ApiError extends Error {
  constructor(message, status = 0) {
    super(message);
    this.status = status;
  }
}

export function headers(apiKey, json = false) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

async function errorOf(resp) {
  let msg = resp.statusText || `HTTP ${resp.status}`;
  try {
    const j = await resp.json();
    if (j && j.error) msg = typeof j.error === "string" ? j.error : j.error.message || msg;
  } catch { /* not JSON */ }
  return new ApiError(msg, resp.status);
}

export async function getJSON(url, apiKey) {
  const resp = await fetch(url, {headers: headers(apiKey)});
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

/**
 * Stream a chat completion. Calls onDelta(text) per content piece, onReasoning(text) per
 * piece of the thinking trace (`reasoning_content`), onFirst() at the first of either,
 * onProgress({processed, total, cache}) while the prompt is processed (the server's
 * prompt_progress chunks); returns {finish, usage, timings}. Throws ApiError when the
 * server refuses the request or sends an error event; an AbortError when `signal` aborts.
 */
export async function streamChat(body, {apiKey, signal, onDelta, onReasoning, onFirst, onProgress}) {
  const resp = await fetch("v1/chat/completions", {
    method: "POST", headers: headers(apiKey, true), body: JSON.stringify(body), signal,
  });
  if (!resp.ok) throw await errorOf(resp);
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "", finish = null, usage = null, timings = null, first = true;
  const handle = (data) => {
    if (data === "[DONE]") return;
    const j = JSON.parse(data);
    if (j.error) throw new ApiError(typeof j.error === "string" ? j.error : j.error.message, 200);
    if (j.usage) usage = j.usage;
    if (j.prompt_progress && onProgress) onProgress(j.prompt_progress);
    if (j.timings) timings = j.timings;
    for (const c of j.choices || []) {
      const d = c.delta || {};
      if ((d.reasoning_content || d.content) && first) { first = false; onFirst && onFirst(); }
      if (d.reasoning_content && onReasoning) onReasoning(d.reasoning_content);
      if (d.content) onDelta(d.content);
      if (c.finish_reason) finish = c.finish_reason;
    }
  };
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += dec.decode(value, {stream: true}).replace(/\r\n?/g, "\n");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = ev.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) handle(data);  // comments (": ping") carry no data
    }
  }
  return {finish, usage, timings};
}
