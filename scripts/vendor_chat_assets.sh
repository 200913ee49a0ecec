#!/usr/bin/env bash
# Re-fetch the chat page's vendored libraries (modelc/server/static/vendor/) at exactly the
# pinned versions, from the npm registry (`npm pack`), with their licences. Nothing is built:
# each library ships the single file copied here. Run from anywhere; needs npm and tar.
set -euo pipefail
cd "$(dirname "$0")/.."
MARKED=18.2.1      # marked: markdown -> HTML (lib/marked.esm.js)
DOMPURIFY=3.5.0    # DOMPurify: HTML sanitiser (dist/purify.es.mjs)
HLJS=11.12.0       # highlight.js browser build (@highlightjs/cdn-assets: es/highlight.min.js)
OUT=modelc/server/static/vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "marked@$MARKED" "dompurify@$DOMPURIFY" \
  "@highlightjs/cdn-assets@$HLJS" >/dev/null)
for t in "$tmp"/*.tgz; do
  d="${t%.tgz}"; mkdir -p "$d"; tar xzf "$t" -C "$d"
done
mkdir -p "$OUT"
cp "$tmp/marked-$MARKED/package/lib/marked.esm.js" "$OUT/marked.esm.js"
cp "$tmp/marked-$MARKED/package/LICENSE" "$OUT/LICENSE.marked.txt"
cp "$tmp/dompurify-$DOMPURIFY/package/dist/purify.es.mjs" "$OUT/purify.es.js"
cp "$tmp/dompurify-$DOMPURIFY/package/LICENSE" "$OUT/LICENSE.dompurify.txt"
h="$tmp/highlightjs-cdn-assets-$HLJS/package"
cp "$h/es/highlight.min.js" "$OUT/highlight.min.js"
cp "$h/styles/github.min.css" "$OUT/hljs-github.min.css"
cp "$h/styles/github-dark.min.css" "$OUT/hljs-github-dark.min.css"
cp "$h/LICENSE" "$OUT/LICENSE.highlight.js.txt"
# drop the source-map comments: the maps are not vendored
sed -i '/^\/\/# sourceMappingURL=/d' "$OUT/marked.esm.js" "$OUT/purify.es.js" "$OUT/highlight.min.js"
cat > "$OUT/VERSIONS.txt" <<V
marked $MARKED (npm: marked, lib/marked.esm.js) MIT
dompurify $DOMPURIFY (npm: dompurify, dist/purify.es.mjs) Apache-2.0 OR MPL-2.0
highlight.js $HLJS (npm: @highlightjs/cdn-assets, es/highlight.min.js, styles/github*.min.css) BSD-3-Clause
re-fetch: scripts/vendor_chat_assets.sh
V
echo "vendored into $OUT:"; ls -l "$OUT"
