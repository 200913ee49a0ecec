# session 23, call 3: decode q8 vs wide (1 / 8 / 64 streams, prefill), llama.cpp tg128 /
# pp2048 and HTTP (dfffbcb, now, llama-server) in the same run
set -u
T0=$SECONDS
OUT=${OUT:-$PWD/cuda-logs}; mkdir -p "$OUT"
source .devrun/setup.sh
export M
B=/tmp/lsrc/llama.cpp/build/bin
(python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1) &
G8=$!
unz() { python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$1"; }
(mkdir -p /tmp/old && cd /tmp/old && unz "$OLDPWD/.devrun/old_dfffbcb.tar.zst" | tar xf - && python3 setup.py build_ext --inplace >/tmp/old_ext.log 2>&1; echo "old rc $?" >>/tmp/old_ext.log) &
OB=$!
(mkdir -p /tmp/now && cd /tmp/now && unz "$OLDPWD/.devrun/now_head.tar.zst" | tar xf - && python3 setup.py build_ext --inplace >/tmp/now_ext.log 2>&1; echo "now rc $?" >>/tmp/now_ext.log) &
NB=$!
wait_ext
wait $G8
echo "== decode at $((SECONDS - T0)) s (llama.cpp building beside)"
for k in q8 wide; do
  MODELC_CUDA_GEMV=$k timeout 150 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1,8,64 --steps 48 \
    --bw 3.02e12 --model $M/llama1b-q4_0.gguf --model $M/llama1b-q4_k_m.gguf --model $M/llama8b-q4_k_m.gguf \
    --json "$OUT/decode_$k.json" >"$OUT/decode_$k.log" 2>&1
  grep -E "^\|" "$OUT/decode_$k.log" | sed "s/^/$k /"; tail -2 "$OUT/decode_$k.log" | grep -i error
done
echo "== prefill at $((SECONDS - T0)) s"
for k in q8 wide; do
  for m in llama1b-q4_k_m llama8b-q4_k_m; do
    MODELC_CUDA_GEMV=$k timeout 60 python3 -m modelc bench $M/$m.gguf --device cuda --prompt-lens 512,2048 --batches 1 \
      --steps 8 --reps 2 2>&1 | grep -E "prefill|decode" | sed "s/^/$k $m /"
  done
done
echo "== waiting for llama.cpp at $((SECONDS - T0)) s"
while [ -f /tmp/llama_building ] && [ $((SECONDS - T0)) -lt 400 ]; do sleep 2; done
for m in llama1b-q4_0 llama1b-q4_k_m llama8b-q4_k_m; do
  timeout 50 $B/llama-bench -m $M/$m.gguf -ngl 99 -p 2048 -n 128 -r 3 2>&1 | grep -E "pp|tg|error" | tail -2
done
echo "== HTTP at $((SECONDS - T0)) s"
wait $OB $NB; cat /tmp/old_ext.log /tmp/now_ext.log | grep rc
bash .devrun/http_pair.sh /tmp/now now 18071
bash .devrun/http_pair.sh /tmp/old dfffbcb 18070
if [ $((SECONDS - T0)) -lt 520 ]; then
  $B/llama-server -m $M/llama1b-q4_0.gguf -ngl 99 -np 64 -c 16384 --port 18081 >"$OUT/llama_server.log" 2>&1 &
  LP=$!
  for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18081/health >/dev/null && break; sleep 1; done
  echo "-- llama-server"
  timeout 40 python3 -m modelc bench --url http://127.0.0.1:18081 --concurrency 64 --requests 128 --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
  kill $LP; wait $LP 2>/dev/null
fi
echo "== end at $((SECONDS - T0)) s"
