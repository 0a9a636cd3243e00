# Sourced by the server tests' shell scripts: start_server SERVER MODEL WORK [ARGS...] starts
# ep-server on a free port with its log in WORK/server.log, sets server_pid, server_log and url, and
# arranges for the process to be killed when the script exits; stop_server ends it with
# SIGTERM and fails unless it exits 0 (under ASan/LSan: no leak).
start_server() {
  local server=$1 model=$2 work=$3
  shift 3
  server_log=$work/server.log
  "$server" --model "$model" --device cpu --pack-dir "$work/packs" --cpu-threads 2 --port 0 "$@" >"$server_log" 2>&1 &
  server_pid=$!
  trap 'kill -9 $server_pid 2>/dev/null || true' EXIT
  local port="" i
  for i in $(seq 1 1200); do
    port=$(grep -o 'listening on http://[^ ]*' "$server_log" | sed 's/.*://' || true)
    [[ -n $port ]] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "ep-server exited before listening:" >&2
      cat "$server_log" >&2
      exit 1
    fi
    sleep 0.1
  done
  if [[ -z $port ]]; then
    echo "ep-server did not start in 120 s:" >&2
    cat "$server_log" >&2
    exit 1
  fi
  url="http://127.0.0.1:$port"
}

stop_server() {
  local rc=0
  kill -TERM "$server_pid"
  wait "$server_pid" || rc=$?
  trap - EXIT
  if [[ $rc -ne 0 ]]; then
    echo "ep-server exited with $rc:" >&2
    cat "$server_log" >&2
    exit 1
  fi
}
