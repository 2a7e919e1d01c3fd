#!/usr/bin/env bash
# The peer benchmark, Aegra and ours side by side. From the project's root: bash bench/peers/run.sh [MODE...]
# (default: local redis redis2 local2). bench/peers/README.md explains every test, figure and knob.
#
#   local   REDIS_BROKER_ENABLED=false: runs are asyncio tasks in the API process (aegra dev default)
#   redis   REDIS_BROKER_ENABLED=true: Redis job queue + pub/sub, WORKER_COUNT=3 x N_JOBS_PER_WORKER=10,
#           one uvicorn process (what `aegra serve` starts; Aegra's production mode)
#   redis2  as redis, but `uvicorn --workers 2` (one process per core, 2 x 30 run slots)
#   local2  as local, but `uvicorn --workers 2`; only the `stream` path is valid there (a run lives in
#           the process that created it, so join/wait/v2 requests reaching the other process fail)
# Our server (Standard Agents, bench/peers/agents, same scenario, client `--target standard-agents`):
#   sa      one `agents serve` process (API + worker pool, WORKER_CONCURRENCY=50 slots)
#   sa2     `agents api` + one `agents worker` process (one per core; 50 slots)
#   Both: a fresh database `sa` on the same Postgres, `agents migrate` first, then the server(s); the resource
#   sampler covers both processes of sa2 (bench_client --pid twice). Log level: the runtime's default (INFO, with
#   uvicorn's access log; it has no setting for it).
# Multi-worker modes first start one process to run the migrations: two workers migrating a fresh
# database at once race (duplicate key in alembic / checkpoint_migrations) and one fails to start.
#
# Environment knobs: BENCH_TMP (/tmp/peer), PY312 (a Python >= 3.12 for Aegra 0.11),
# REPS (3), B1_RUNS (200), B2_SECONDS (30), B2_CLIENTS ("50 200"), GRAPHS ("chat tool"), B1=0 (skip B1),
# QUICK=1 (1 rep, 50 runs, 10 s: a smoke run),
# SA_GIT (default: the git repository you run it from: the project to clone for sa/sa2; its committed HEAD is
# measured, not the work tree), SA_REPO ($BENCH_TMP/standard-agents: the clone, with .venv; delete it to measure
# a new commit), RESULTS_DIR (bench/peers/results: only the .md summaries there are kept in git),
# GRAPHS may name `stream` (benchmark B4: a real OpenAI-compatible model over HTTP with latency): then fake_llm.py
# runs beside the servers (its own process, FAKE_LLM_ARGS passed to it, e.g. "--ttft-ms 300 --chunks 10
# --interval-ms 80 --tool-calls 3"), FAKE_LLM_URL is exported to both servers, and Aegra's venv gets
# langchain-openai (LANGCHAIN_OPENAI_VERSION, 1.6.6).
# SA_AGENTS (bench/peers/agents), PROFILE=1 (mode sa: one extra B2 repetition of each graph at the first B2_CLIENTS
# count, labelled `sa+py-spy` and not among sa's repetitions, while `py-spy record` samples the server for 15 s;
# PYSPY = the py-spy binary, PYSPY_ARGS = more py-spy options, e.g. `--gil`: only the thread holding the GIL),
# SA_LABEL_SUFFIX (appended to the sa/sa2 labels, e.g. `-patched` for a modified SA_REPO).
# Everything listens on 127.0.0.1; all servers started here are stopped at exit (by pid).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)  # the project: bench_client runs as `python -m bench.peers.bench_client` from here
export BENCH_TMP=${BENCH_TMP:-/tmp/peer}
PY312=${PY312:-$(python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3 2>/dev/null | tail -1)}
AEGRA_VERSION=${AEGRA_VERSION:-0.11.0}
LANGCHAIN_OPENAI_VERSION=${LANGCHAIN_OPENAI_VERSION:-1.6.6}
REPS=${REPS:-3}; B1_RUNS=${B1_RUNS:-200}; B2_SECONDS=${B2_SECONDS:-30}
B2_CLIENTS=${B2_CLIENTS:-"50 200"}; GRAPHS=${GRAPHS:-"chat tool"}; B1=${B1:-1}
if [ "${QUICK:-0}" = 1 ]; then REPS=1; B1_RUNS=50; B2_SECONDS=10; fi
MODES=${*:-"local redis redis2 local2"}
SA_GIT=${SA_GIT:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}
SA_REPO=${SA_REPO:-$BENCH_TMP/standard-agents}
SA_AGENTS=${SA_AGENTS:-$HERE/agents}
PROFILE=${PROFILE:-0}; SA_LABEL_SUFFIX=${SA_LABEL_SUFFIX:-}
PYSPY=${PYSPY:-$(command -v py-spy || echo "$BENCH_TMP/tools-venv/bin/py-spy")}; PYSPY_ARGS=${PYSPY_ARGS:-}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${RESULTS_DIR:-$HERE/results}
RESULTS=$OUT/$STAMP.jsonl
mkdir -p "$OUT" "$BENCH_TMP"
NEED_AEGRA=0; NEED_SA=0; NEED_LLM=0; export NEED_REDIS=0
case " $GRAPHS " in *" stream "*) NEED_LLM=1 ;; esac
for mode in $MODES; do
  case $mode in
    local|local2) NEED_AEGRA=1 ;;
    redis|redis2) NEED_AEGRA=1; NEED_REDIS=1 ;;
    sa|sa2) NEED_SA=1 ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
done

# ---- virtualenvs (Aegra 0.11 needs Python >= 3.12; the client and our server run on the system python3)
VENV=$BENCH_TMP/venv
if [ "$NEED_AEGRA" = 1 ] && { [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import aegra_api" 2>/dev/null; }; then
  "$PY312" -m venv "$VENV"
  "$VENV/bin/pip" install -q "aegra-api==$AEGRA_VERSION"
fi
if [ "$NEED_AEGRA" = 1 ] && [ "$NEED_LLM" = 1 ] && ! "$VENV/bin/python" -c "import langchain_openai" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "langchain-openai==$LANGCHAIN_OPENAI_VERSION"  # the `stream` graph's model client
fi
CVENV=$BENCH_TMP/client-venv
if [ ! -x "$CVENV/bin/python" ]; then
  python3 -m venv "$CVENV"; "$CVENV/bin/pip" install -q "httpx==0.28.1"
fi
if [ "$NEED_SA" = 1 ] && [ ! -x "$SA_REPO/.venv/bin/agents" ]; then
  [ -d "$SA_REPO/.git" ] || git clone -q "$SA_GIT" "$SA_REPO"
  python3 -m venv "$SA_REPO/.venv"; "$SA_REPO/.venv/bin/pip" install -q -e "$SA_REPO"
fi
{
  if [ "$NEED_AEGRA" = 1 ]; then
    "$VENV/bin/pip" freeze 2>/dev/null | grep -i -E '^(aegra|langgraph|langchain-core|langchain-openai|openai|fastapi|uvicorn|sqlalchemy|asyncpg|psycopg|redis|sse-starlette)' || true
  fi
  if [ "$NEED_SA" = 1 ]; then
    echo "standard-agents @ $(git -C "$SA_REPO" rev-parse --short HEAD) ($(git -C "$SA_REPO" log -1 --format=%cI)), python $("$SA_REPO/.venv/bin/python" -c 'import platform; print(platform.python_version())')"
    if [ -n "$(git -C "$SA_REPO" status --porcelain --untracked-files=no)" ]; then  # a modified clone: keep the diff
      echo "standard-agents: UNCOMMITTED CHANGES, $(git -C "$SA_REPO" diff --shortstat); diff in $STAMP.sa-patch.diff"
      git -C "$SA_REPO" diff > "$OUT/$STAMP.sa-patch.diff"
    fi
    "$SA_REPO/.venv/bin/pip" freeze 2>/dev/null | grep -i -E '^(fastapi|uvicorn|uvloop|httptools|sqlalchemy|asyncpg|pydantic|pydantic-core|sse-starlette|starlette)==' | sed 's/^/sa: /' || true
  fi
} > "$OUT/$STAMP.versions.txt"

# ---- Postgres + Redis
SERVER_PID=""; WORKER_PID=""; SPY_PID=""; LLM_PID=""
cleanup() {
  for p in $SPY_PID $WORKER_PID $SERVER_PID $LLM_PID; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  "$HERE/services.sh" stop || true
}
trap cleanup EXIT
"$HERE/services.sh" start >/dev/null
. "$BENCH_TMP/services.env"
cat "$BENCH_TMP/services.env" | grep VERSION >> "$OUT/$STAMP.versions.txt"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---- B4's model: an OpenAI-compatible server with latency, one process for the whole session (stdlib only)
LLM_ARGS=()
if [ "$NEED_LLM" = 1 ]; then
  LLM_PORT=$(free_port)
  # shellcheck disable=SC2086  # FAKE_LLM_ARGS: words
  python3 "$HERE/fake_llm.py" --port "$LLM_PORT" ${FAKE_LLM_ARGS:-} > "$BENCH_TMP/fake-llm.log" 2>&1 &
  LLM_PID=$!
  for _ in $(seq 40); do curl -sf "http://127.0.0.1:$LLM_PORT/health" >/dev/null 2>&1 && break; sleep 0.25; done
  curl -sf "http://127.0.0.1:$LLM_PORT/health" >/dev/null || { cat "$BENCH_TMP/fake-llm.log" >&2; exit 1; }
  export FAKE_LLM_URL=http://127.0.0.1:$LLM_PORT/v1  # both servers inherit it (launch / start_sa: env ...)
  LLM_ARGS=(--llm-url "http://127.0.0.1:$LLM_PORT" --llm-pid "$LLM_PID")
  echo "fake LLM: $(curl -sf "http://127.0.0.1:$LLM_PORT/config")" >> "$OUT/$STAMP.versions.txt"
fi

launch() {  # $1 = redis true|false, $2 = workers, $3 = log file
  (cd "$BENCH_TMP/srv" && exec env \
      DATABASE_URL="$DATABASE_URL" REDIS_URL="$REDIS_URL" REDIS_BROKER_ENABLED=$1 \
      AEGRA_CONFIG="$HERE/aegra/aegra.json" LOG_LEVEL=WARNING \
      WORKER_COUNT=${WORKER_COUNT:-3} N_JOBS_PER_WORKER=${N_JOBS_PER_WORKER:-10} \
      "$VENV/bin/python" -m uvicorn aegra_api.main:app --host 127.0.0.1 --port "$PORT" --workers "$2" \
      > "$3" 2>&1) &
  SERVER_PID=$!
  wait_health "$3"
}

wait_health() {  # $1 = the server's log file
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.5
  done
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -30 "$1"; exit 1; }
}

start_aegra() {  # $1 = mode
  local mode=$1 redis=false workers=1
  case $mode in
    local) ;;
    redis) redis=true ;;
    redis2) redis=true; workers=2 ;;
    local2) workers=2 ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  "$HERE/services.sh" reset aegra
  PORT=$(free_port)
  mkdir -p "$BENCH_TMP/srv"
  if [ "$workers" -gt 1 ]; then  # migrate with one process first (see the header)
    launch "$redis" 1 "$BENCH_TMP/aegra-$mode-migrate.log"; stop_server
  fi
  launch "$redis" "$workers" "$BENCH_TMP/aegra-$mode.log"
  sleep 5  # let every uvicorn worker finish its lifespan start-up
  if grep -q "startup failed" "$BENCH_TMP/aegra-$mode.log"; then
    echo "an Aegra worker failed to start:" >&2; tail -30 "$BENCH_TMP/aegra-$mode.log" >&2; exit 1
  fi
  if [ "$workers" -gt 1 ]; then
    local n; n=$(pgrep -P "$SERVER_PID" -f multiprocessing-fork | wc -l)
    [ "$n" -eq "$workers" ] || { echo "expected $workers workers, found $n" >&2; exit 1; }
  fi
}

start_sa() {  # $1 = sa | sa2: fresh database `sa`, `agents migrate`, then the server process(es)
  local mode=$1 log=$BENCH_TMP/sa-$1.log
  "$HERE/services.sh" reset sa
  PORT=$(free_port)
  mkdir -p "$BENCH_TMP/sa-srv"  # working directory: no .env there; DATA_DIR holds the loopback secret key
  local env=(DATABASE_URL="${DATABASE_URL%/*}/sa" AGENTS_DIR="$SA_AGENTS" DATA_DIR="$BENCH_TMP/sa-data")
  (cd "$BENCH_TMP/sa-srv" && env "${env[@]}" "$SA_REPO/.venv/bin/agents" migrate) > "$BENCH_TMP/sa-$mode-migrate.log" 2>&1 \
    || { tail -30 "$BENCH_TMP/sa-$mode-migrate.log"; exit 1; }
  if [ "$mode" = sa ]; then
    (cd "$BENCH_TMP/sa-srv" && exec env "${env[@]}" "$SA_REPO/.venv/bin/agents" serve --no-migrate \
        --host 127.0.0.1 --port "$PORT" > "$log" 2>&1) &
    SERVER_PID=$!
  else
    (cd "$BENCH_TMP/sa-srv" && exec env "${env[@]}" "$SA_REPO/.venv/bin/agents" api \
        --host 127.0.0.1 --port "$PORT" > "$log" 2>&1) &
    SERVER_PID=$!
    log=$BENCH_TMP/sa-$mode-worker.log
    (cd "$BENCH_TMP/sa-srv" && exec env "${env[@]}" "$SA_REPO/.venv/bin/agents" worker > "$log" 2>&1) &
    WORKER_PID=$!
  fi
  wait_health "$BENCH_TMP/sa-$mode.log"
  for _ in $(seq 60); do grep -q "started with" "$log" && break; sleep 0.5; done  # the worker pool is up
  grep -q "started with" "$log" || { echo "no worker pool started:" >&2; tail -30 "$log" >&2; exit 1; }
  sleep 2
}

stop_server() {
  for p in $WORKER_PID $SERVER_PID; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  SERVER_PID=""; WORKER_PID=""
}

bench() {  # $1 = label, rest = bench_client args
  local label=$1; shift
  local procs=(--pid "$SERVER_PID")
  [ -z "$WORKER_PID" ] || procs+=(--pid "$WORKER_PID")
  (cd "$ROOT" && "$CVENV/bin/python" -m bench.peers.bench_client "$@" "${TARGET[@]}" \
      --base-url "http://127.0.0.1:$PORT" "${procs[@]}" "${LLM_ARGS[@]}" --pg-data "$BENCH_TMP/pgdata" \
      --label "$label" --out "$RESULTS" > /dev/null)
  tail -1 "$RESULTS" | python3 -c 'import sys,json; d=json.load(sys.stdin); x=d.get("b1") or d.get("b2") or {}; r=d["resources"]["server"];
keys=("first_output","runs_per_s","llm_steps_per_s","errors","done","overhead_p50_ms","chunk_lag","llm_counts")
print(d["label"], d["test"], d["path"], d["graph"], json.dumps({k:v for k,v in x.items() if k in keys}), "server_rss_max_mb=%s cpu=%s" % (r["mem_mb_max"], r["cpu_cores"]))'
}

profile_b2() {  # $1 = graph; mode sa, PROFILE=1: one extra B2 repetition while py-spy samples the server for 15 s
  local g=$1 n=${B2_CLIENTS%% *} out=$OUT/$STAMP.sa-py-spy-$1.raw
  [ -x "$PYSPY" ] || { echo "PROFILE=1 but no py-spy at $PYSPY: skipped" >&2; return 0; }
  ( sleep 6; exec "$PYSPY" record -d 15 -r 100 $PYSPY_ARGS --format raw -o "$out" --pid "$SERVER_PID" ) \
      > "$BENCH_TMP/py-spy.log" 2>&1 &
  SPY_PID=$!
  bench "$LABEL+py-spy" b2 --path "$PATH_NAME" --graph "$g" --clients "$n" --duration "$B2_SECONDS"
  wait "$SPY_PID" || tail -3 "$BENCH_TMP/py-spy.log" >&2
  SPY_PID=""
  python3 "$HERE/spy_summary.py" "$out" > "$OUT/$STAMP.sa-py-spy-$g.txt" || true
}

echo "results -> $RESULTS"
echo "load before: $(cat /proc/loadavg)" | tee -a "$OUT/$STAMP.versions.txt"
for mode in $MODES; do
  case $mode in
    sa|sa2) start_sa "$mode"; TARGET=(--target standard-agents); PATH_NAME=events; LABEL=$mode$SA_LABEL_SUFFIX ;;
    *) start_aegra "$mode"; TARGET=(--target aegra); PATH_NAME=stream; LABEL=$mode
       [ ! -f "$BENCH_TMP/redis.pid" ] || TARGET+=(--redis-pid "$(cat "$BENCH_TMP/redis.pid")") ;;
  esac
  bench "$LABEL" idle --duration 10                        # B3: idle right after start
  for g in $GRAPHS; do
    [ "$B1" = 1 ] || break
    for r in $(seq "$REPS"); do bench "$LABEL" b1 --path "$PATH_NAME" --graph "$g" --runs "$B1_RUNS"; done
  done
  case $mode in local|redis|redis2) if [ "$B1" = 1 ]; then  # other ways to follow an Aegra run (informational, one repetition, chat only)
    bench "$LABEL" b1 --path v2 --graph chat --runs 50
    bench "$LABEL" b1 --path join --graph chat --runs 30
    bench "$LABEL" b1 --path wait --graph chat --runs 30
  fi ;; esac
  bench "$LABEL" idle --duration 10                        # B3: idle after warm-up
  for g in $GRAPHS; do
    for n in $B2_CLIENTS; do
      for r in $(seq "$REPS"); do
        bench "$LABEL" b2 --path "$PATH_NAME" --graph "$g" --clients "$n" --duration "$B2_SECONDS"
      done
      if [ "$mode" = sa ] && [ "$PROFILE" = 1 ] && [ "$n" = "${B2_CLIENTS%% *}" ]; then profile_b2 "$g"; fi
    done
  done
  bench "$LABEL" idle --duration 10                        # B3: idle after load
  stop_server
  echo "load after $mode: $(cat /proc/loadavg)" | tee -a "$OUT/$STAMP.versions.txt"
done
python3 "$HERE/summarize.py" "$RESULTS" > "$OUT/$STAMP.md"
echo "summary -> $OUT/$STAMP.md"
if [ "$NEED_SA" = 1 ] && [ "$NEED_AEGRA" = 1 ]; then  # ours beside Aegra: the side-by-side tables and the ratios
  pairs=(); for p in sa:local sa2:redis sa2:redis2 sa:local2; do
    case " $MODES " in *" ${p%:*} "*) case " $MODES " in *" ${p#*:} "*) pairs+=("${p%:*}$SA_LABEL_SUFFIX:${p#*:}") ;; esac ;; esac
  done
  [ ${#pairs[@]} = 0 ] || { python3 "$HERE/compare.py" "$RESULTS" "${pairs[@]}" > "$OUT/$STAMP.compare.md"; echo "ratios -> $OUT/$STAMP.compare.md"; }
fi
