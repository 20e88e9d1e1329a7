#!/usr/bin/env bash
# Three vLLM servers of one model on one GPU for the real-engine harness (python -m benchmarks.real_engine):
#   base :8000 (no speculation), ngram :8001 (k=3, lookup 2-4), draft :8002 (DRAFT_DIR as draft_model, k=3).
# usage: serve_gpu.sh MODEL_DIR DRAFT_DIR LOG_DIR   (vLLM importable by python3; each server in a session of its own,
# so it outlives this script; stop them with: kill $(cat LOG_DIR/*.pid)). ENGINES="base ngram" starts only those.
# Each server starts once the one before has measured its memory: vLLM asserts that no other process frees GPU
# memory while it profiles, and a neighbour that profiles at the same time does.
set -uo pipefail
M=${1:?model dir}; D=${2:?draft dir}; L=${3:?log dir}
mkdir -p "$L"
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
start() {  # NAME PORT [ARGS...]
  local name=$1 port=$2; shift 2
  setsid python3 -m vllm.entrypoints.openai.api_server --model "$M" --served-model-name smollm2 \
    --host 127.0.0.1 --port "$port" --gpu-memory-utilization "${GPU_MEM:-0.2}" --max-model-len 4096 \
    "$@" >"$L/$name.log" 2>&1 < /dev/null &
  echo $! >"$L/$name.pid"
}
ENGINES=${ENGINES:-base ngram draft}
port_of() { case $1 in base) echo 8000;; ngram) echo 8001;; draft) echo 8002;; esac; }
deadline=$((SECONDS + ${WAIT_S:-420}))
profiled() {  # NAME: its memory is measured (or it is gone, or time is up)
  until grep -q "Available KV cache memory" "$L/$1.log" 2>/dev/null; do
    kill -0 "$(cat "$L/$1.pid")" 2>/dev/null || return
    [ $SECONDS -gt $deadline ] && return
    sleep 1
  done
}
prev=
for n in $ENGINES; do
  [ -n "$prev" ] && profiled "$prev"
  prev=$n
  case $n in
    base) start base 8000;;
    ngram) start ngram 8001 --speculative-config \
      '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}';;
    draft) start draft 8002 --speculative-config "{\"method\":\"draft_model\",\"model\":\"$D\",\"num_speculative_tokens\":3}";;
  esac
done
for n in $ENGINES; do
  port=$(port_of "$n")
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
    [ $SECONDS -gt $deadline ] && { echo "port $port not healthy"; break; }
    sleep 2
  done
done
for n in $ENGINES; do
  if curl -sf "http://127.0.0.1:$(port_of "$n")/health" >/dev/null; then
    echo "$n: healthy after ${SECONDS}s"
  else
    echo "$n: NOT healthy; its log ends:"; tail -25 "$L/$n.log"
  fi
done
