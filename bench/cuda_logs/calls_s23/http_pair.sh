# $1: repo dir to serve from, $2: label, $3: port; 64 streams then 1 over HTTP on the 1.1B Q4_0
R=$1; L=$2; P=$3; M=${M:-/tmp/m35}
(cd $R && PYTHONPATH=/tmp/site:$R python3 -m modelc run $M/llama1b-q4_0.gguf --device cuda --max-concurrent 64 \
  --max-context 256 --speculate off --port $P >"$OUT/server_$L.log" 2>&1) &
SP=$!
for _ in $(seq 1 90); do curl -sf http://127.0.0.1:$P/health >/dev/null && break; sleep 1; done
echo "-- $L"
timeout 60 python3 -m modelc bench --url http://127.0.0.1:$P --concurrency 64 --requests 128 --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -2
timeout 40 python3 -m modelc bench --url http://127.0.0.1:$P --concurrency 1 --requests 12 --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
pkill -f "modelc run $M/llama1b-q4_0.gguf" ; wait $SP 2>/dev/null
