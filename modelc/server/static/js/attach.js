// Images attached to a message: picked (the attach button), pasted or dropped; shown as
// thumbnails above the composer, then in the conversation; sent as OpenAI `image_url`
// parts (data URLs) and kept with the conversation (store.js).
//
// What is kept is what every later turn sends again: a PNG, JPEG, WebP or GIF of at most
// MAX_SIDE pixels a side and MAX_BYTES is kept byte for byte; a bigger image (or another
// type the browser reads) is redrawn with its longer side at MAX_SIDE and kept as JPEG,
// transparency on white (as the server composites it), so that a conversation stays
// within the browser's storage and the server's 8 MiB request.

export const TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
export const MAX_SIDE = 1024;
export const MAX_BYTES = 512 * 1024;
export const MAX_IMAGES = 16;  // the server's limit for a request

const pending = [];  // data URLs waiting for the next message
let work = Promise.resolve();  // the files being read
let vision = null;  // does the model take images: true, false, null (not known)
let say = () => {};
const $ = (id) => document.getElementById(id);

const readDataURL = (blob) => new Promise((resolve, reject) => {
  const r = new FileReader();
  r.onload = () => resolve(r.result);
  r.onerror = () => reject(r.error);
  r.readAsDataURL(blob);
});

/** The data URL kept for an image file (see above); throws if the browser cannot read it. */
export async function imageDataURL(file) {
  const bitmap = await createImageBitmap(file);  // the first frame of an animation
  try {
    const scale = Math.min(1, MAX_SIDE / Math.max(bitmap.width, bitmap.height));
    if (TYPES.includes(file.type) && scale === 1 && file.size <= MAX_BYTES) {
      return await readDataURL(file);
    }
    const canvas = document.createElement("canvas");
    canvas.width = Math.max(1, Math.round(bitmap.width * scale));
    canvas.height = Math.max(1, Math.round(bitmap.height * scale));
    const g = canvas.getContext("2d");
    g.fillStyle = "#ffffff";
    g.fillRect(0, 0, canvas.width, canvas.height);
    g.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    return canvas.toDataURL("image/jpeg", 0.85);
  } finally {
    bitmap.close();
  }
}

/** A thumbnail; with onRemove, a button that takes it away. An image the browser could
 * not store (`null`) shows as a note. */
export function thumbnail(url, onRemove) {
  const t = document.createElement("span");
  t.className = "thumb";
  if (url) {
    const img = document.createElement("img");
    img.src = url;
    img.alt = "attached image";
    t.append(img);
  } else {
    t.classList.add("missing");
    t.textContent = "image not kept (browser storage full)";
  }
  if (onRemove) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "remove";
    b.textContent = "✕";
    b.title = "Remove this image";
    b.setAttribute("aria-label", "Remove this image");
    b.addEventListener("click", onRemove);
    t.append(b);
  }
  return t;
}

/** A message's images, as shown in the conversation. */
export function gallery(images) {
  const g = document.createElement("div");
  g.className = "gallery";
  g.append(...images.map((url) => thumbnail(url)));
  return g;
}

function render() {
  $("pending").replaceChildren(...pending.map((url, k) => thumbnail(url, () => {
    pending.splice(k, 1);
    render();
    $("prompt").focus();
  })));
}

function why() {
  return vision === false
    ? "This model takes no images (the server has no vision projector, --mmproj, for it)"
    : "Could not learn from the server whether this model takes images";
}

/** Read image files into the composer (those the browser cannot read are named). */
export function add(files) {
  const images = [...files].filter((f) => f.type.startsWith("image/") || !f.type);
  if (!images.length) return work;
  if (vision !== true) {
    say(why());
    return work;
  }
  work = work.then(async () => {
    for (const f of images) {
      if (pending.length >= MAX_IMAGES) {
        say(`at most ${MAX_IMAGES} images a message`);
        break;
      }
      try {
        pending.push(await imageDataURL(f));
      } catch {
        say(`could not read ${f.name || "the file"} as an image`);
      }
    }
    render();
  });
  return work;
}

/** The attached images, taken for a message (wait for `settled()` first). */
export function take() {
  const out = pending.splice(0);
  render();
  return out;
}

/** Put a refused message's images back into the composer. */
export function restore(images) {
  if (pending.length) return;
  pending.push(...images);
  render();
}

export const settled = () => work;
export const count = () => pending.length;

/** Whether the model takes images (the server's /props `modalities.vision`; null: not known):
 * the attach button is shown disabled, with a tooltip saying why, unless it does. */
export function setVision(v) {
  vision = v;
  const b = $("attach");
  const off = v !== true;
  b.setAttribute("aria-disabled", String(off));
  b.title = off ? why() : "Attach images (or paste or drop them here)";
  b.setAttribute("aria-label", b.title);
}

export function initAttach({setStatus}) {
  say = setStatus;
  const input = $("attach-input");
  $("attach").addEventListener("click", () => {
    if (vision === true) input.click();
    else say(why());
  });
  input.addEventListener("change", () => {
    add(input.files);
    input.value = "";
  });
  $("prompt").addEventListener("paste", (ev) => {
    const files = [...((ev.clipboardData && ev.clipboardData.files) || [])];
    if (!files.some((f) => f.type.startsWith("image/"))) return;  // text pastes as text
    ev.preventDefault();
    add(files);
  });
  // a file dropped anywhere on the page is attached (never opened in place of the page)
  const hasFiles = (ev) => ev.dataTransfer && [...ev.dataTransfer.types].includes("Files");
  document.addEventListener("dragover", (ev) => {
    if (!hasFiles(ev)) return;
    ev.preventDefault();
    ev.dataTransfer.dropEffect = vision === true ? "copy" : "none";
    document.body.classList.add("dropping");
  });
  document.addEventListener("dragleave", (ev) => {
    if (!ev.relatedTarget) document.body.classList.remove("dropping");
  });
  document.addEventListener("drop", (ev) => {
    document.body.classList.remove("dropping");
    if (!hasFiles(ev)) return;
    ev.preventDefault();
    add(ev.dataTransfer.files);
  });
  setVision(null);
}
