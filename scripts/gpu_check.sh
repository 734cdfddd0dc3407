#!/usr/bin/env bash
# GPU check, one call of under 9 minutes on a CUDA machine (issue 12):
#   1. find or build llama.cpp with CUDA (the sources vendored in llama-cpp-python 0.3.36, from the kit);
#   2. a random-F16 model with gemma-3-270m's shapes (the kit's generator; nothing is downloaded);
#   3. the decode ceiling: llama-batched-bench, pp16 tg$NPRED, at every concurrency;
#   4. at each concurrency: ringserve, ringserve --backend-sampling, llama-server, llama-server
#      --backend-sampling (all -ngl $NGL -fa on; llama-server --swa-full, ringserve's fixed setting),
#      each started once and driven greedy then sampled (temperature 0.8, top-k 40, top-p 0.95),
#      streamed, $NPRED tokens, ignore_eos;
#   5. prints the throughput table (tok/s, ratio to the ceiling) and ringserve's phase table
#      (/metrics engine_phase_seconds diffed around each load).
#
# Usage, from the repository root:
#   device:  bash scripts/gpu_check.sh              (KIT=.gpu-kit carried, or ../shared/gpu-kit)
#   CPU dry run:  SKIP_BUILD=1 BIN=<cpu llama.cpp build/bin> NGL=0 CONCS=2 NREQ=2 NPRED=8 OUT=/tmp/g \
#                 bash scripts/gpu_check.sh
# Knobs: KIT (the kit: llama.cpp.tar.xz, gen_model.py + meta.pkl + gguf-py, whl/, llama_cpp/), BIN, BUILD_DIR,
#   SKIP_BUILD, NGL (99), CONCS ("8 32 128"), NREQ (requests per load; default max(c, 16)), NPRED (128),
#   THREADS (4), LIMIT (seconds after which no new server run starts; 470), MODEL (a GGUF to use instead), LOAD_TIMEOUT (60 s per load),
#   OUT (/tmp/gpu_check). Writes OUT/{machine,progress,build,ceiling,servers}.txt, results.jsonl, report.txt.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${KIT:-}" ]; then  # a carried copy in the checkout, else the shared kit beside it (main or a worktree)
  for k in "$R/.gpu-kit" "$R/../shared/gpu-kit" "$R/../../shared/gpu-kit"; do [ -d "$k" ] && { KIT=$k; break; }; done
fi
KIT=$(cd "${KIT:-.gpu-kit}" 2>/dev/null && pwd || echo "${KIT:-.gpu-kit}")
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"; : > "$OUT/results.jsonl"; : > "$OUT/progress.txt"; : > "$OUT/servers.txt"
B=${BUILD_DIR:-$R/.gpubuild}
BIN=${BIN:-$B/build/bin}
NGL=${NGL:-99}; CONCS=${CONCS:-"8 32 128"}; NPRED=${NPRED:-128}; THREADS=${THREADS:-4}; LIMIT=${LIMIT:-470}
PY=${PYTHON:-python3}
log() { echo "[$(el)s] $*" | tee -a "$OUT/progress.txt"; }
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3; nproc; $PY --version) > "$OUT/machine.txt" 2>&1

# 1. llama.cpp: a bin dir that has the three binaries, else build one (CUDA, sm_90 unless CUDA_ARCH)
if [ -z "${SKIP_BUILD:-}" ] && [ ! -x "$BIN/llama-server" -o ! -x "$BIN/llama-batched-bench" -o ! -e "$BIN/libllama.so" ]; then
  mkdir -p "$B"
  [ -d "$B/llama.cpp" ] || tar -xJf "$KIT/llama.cpp.tar.xz" -C "$B" || { log "no llama.cpp sources in $KIT"; exit 1; }
  log "building llama.cpp with CUDA"
  cmake -S "$B/llama.cpp" -B "$B/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=ON \
    $(sh "$R/scripts/cmake_args.sh") > "$OUT/build.txt" 2>&1 || { log "cmake failed"; tail -30 "$OUT/build.txt"; exit 1; }
  cmake --build "$B/build" -j "$(nproc)" --target llama llama-server llama-batched-bench >> "$OUT/build.txt" 2>&1 \
    || { log "build failed"; tail -40 "$OUT/build.txt"; exit 1; }
  BIN=$B/build/bin
fi
[ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-batched-bench" ] || { log "no llama-server/llama-batched-bench in $BIN"; exit 1; }
log "llama.cpp: $BIN"

# Python: the current interpreter if it has ringserve's dependencies (CPU dry run: the venv), else the
# kit's wheels and its llama_cpp package (no libraries of its own: LLAMA_CPP_LIB_PATH is the build above).
export PYTHONPATH=$R${PYTHONPATH:+:$PYTHONPATH}
if ! $PY -c "import llama_cpp, falcon, gunicorn, posix_ipc, orjson, numpy" > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$KIT"/whl/*.whl > /dev/null 2>&1
  mkdir -p /tmp/site && rm -rf /tmp/site/llama_cpp && cp -r "$KIT/llama_cpp" /tmp/site/llama_cpp
  export PYTHONPATH=/tmp/site:$PYTHONPATH LLAMA_CPP_LIB_PATH=$BIN
fi
$PY -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, 'gpu offload:', llama_cpp.llama_supports_gpu_offload())" 2>&1 | tee -a "$OUT/progress.txt"

# 2. the model
M=${MODEL:-/tmp/rand-gemma.gguf}
if [ ! -s "$M" ]; then
  # the kit's gguf-py imports yaml: without PyYAML (a bare venv) say so rather than fail obscurely
  $PY -c "import yaml" 2>/dev/null || { log "model generation needs PyYAML in $PY (pip install pyyaml), or pass MODEL=<a gguf>"; exit 1; }
  (cd "$KIT" && $PY gen_model.py meta.pkl "$M.tmp" > /dev/null) && mv "$M.tmp" "$M" || { log "model generation failed"; exit 1; }
fi
log "model: $M"

# 3. the decode ceiling
NPL=$(echo $CONCS | tr ' ' ','); MAXC=$(echo $CONCS | tr ' ' '\n' | sort -n | tail -1)
timeout 150 "$BIN/llama-batched-bench" -m "$M" -c $(( (MAXC > 8 ? MAXC : 8) * (NPRED + 32) )) -b 2048 -ub 512 -npp 16 \
  -ntg "$NPRED" -npl "$NPL" -ngl "$NGL" -fa on --swa-full -t "$THREADS" 2>&1 | grep "^|" > "$OUT/ceiling.txt"
cat "$OUT/ceiling.txt"; log "ceiling done"

# 4. the servers
port=$(( 18600 + RANDOM % 1000 ))
serve() {  # name conc cmd... : start, wait for /health, greedy + sampled loads, stop
  local name=$1 c=$2; shift 2
  port=$((port + 1)); local base=http://127.0.0.1:$port log=$OUT/srv-$name-$c.log
  setsid "$@" --host 127.0.0.1 --port $port > "$log" 2>&1 &
  local pid=$! up=0
  for i in $(seq 1 1200); do
    kill -0 $pid 2>/dev/null || break
    curl -sf $base/health > /dev/null && { up=1; break; }
    sleep 0.05
  done
  local n=${NREQ:-$(( c > 16 ? c : 16 ))} metrics=""
  [ "${name%%-*}" = ringserve ] && metrics=--metrics
  if [ $up = 1 ]; then
    for mode in greedy sampled; do
      $PY "$R/scripts/gpu_check.py" load $base --server $name --mode $mode --concurrency $c --requests $n \
        --n-predict "$NPRED" --timeout ${LOAD_TIMEOUT:-60} $metrics >> "$OUT/results.jsonl"
      log "$name c=$c $mode: $(tail -1 "$OUT/results.jsonl" | cut -c1-150)"
    done
  else
    echo "{\"server\": \"$name\", \"c\": $c, \"mode\": \"-\", \"errors\": \"did not start\"}" >> "$OUT/results.jsonl"
    log "$name c=$c did not start: $(tail -3 "$log" | tr '\n' ' ' | cut -c1-300)"
  fi
  kill -TERM -- -$pid 2>/dev/null
  for i in $(seq 1 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  kill -KILL -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  { echo "== $name c=$c"; grep -v -E "Booting worker|Worker exiting|GET /|POST /" "$log" \
      | grep -i -E "error|warn|fatal|traceback|File \"|offload|CUDA|model loaded|exit|backend" | head -30; } >> "$OUT/servers.txt"
}
RS=("$PY" -m frontends.process.cli)
for c in $CONCS; do
  for v in ringserve ringserve-bs llama-server llama-server-bs; do
    [ $(el) -gt $LIMIT ] && { log "time up: $v c=$c and later runs skipped"; continue; }
    case $v in
      ringserve)       serve $v $c "${RS[@]}" -m "$M" -np $c -c $((c * 1024)) -t $THREADS -ngl $NGL -fa on --metrics ;;
      ringserve-bs)    serve $v $c "${RS[@]}" -m "$M" -np $c -c $((c * 1024)) -t $THREADS -ngl $NGL -fa on --metrics --backend-sampling ;;
      llama-server)    serve $v $c "$BIN/llama-server" -m "$M" -np $c -c $((c * 1024)) -t $THREADS -ngl $NGL -fa on --swa-full --metrics --no-webui ;;
      llama-server-bs) serve $v $c "$BIN/llama-server" -m "$M" -np $c -c $((c * 1024)) -t $THREADS -ngl $NGL -fa on --swa-full --metrics --no-webui --backend-sampling ;;
    esac
  done
done
log "done"

# 5. the tables
$PY "$R/scripts/gpu_check.py" report "$OUT" | tee "$OUT/report.txt"
