#!/usr/bin/env bash
# The raw server-sent events of streamed answers as curl receives them: status 200, content
# type text/event-stream, chunked; every event one `data: ` line and a blank line; JSON chunks
# (the role first, a finish_reason, with include_usage the usage chunk with no choices), and
# `data: [DONE]` last. A request refused before streaming is a plain JSON error.
#   sse_framing.sh EP_SERVER MODEL WORK_DIR
set -euo pipefail
server=$1 model=$2 work=$3
if ! command -v curl >/dev/null 2>&1; then
  echo "curl not found: skipped"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "${BASH_SOURCE[0]}")/start_server.sh"
start_server "$server" "$model" "$work"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# check_sse FILE: the framing of one streamed body; prints its data payloads, one a line.
check_sse() {
  awk '
    NR % 2 == 1 { if ($0 !~ /^data: ./) { print "line " NR " is not a data line: " $0 > "/dev/stderr"; bad = 1 } else print substr($0, 7) }
    NR % 2 == 0 { if ($0 != "") { print "line " NR " should end an event (blank): " $0 > "/dev/stderr"; bad = 1 } }
    END { if (NR % 2 != 0 || NR == 0) { print "the body does not end with a blank line" > "/dev/stderr"; bad = 1 } exit bad }' "$1"
}

post_stream() {  # post_stream PATH JSON NAME
  curl -sS -N -D "$work/$3.headers" -H 'Content-Type: application/json' -d "$2" "$url$1" >"$work/$3.body"
  grep -q '^HTTP/1.1 200' "$work/$3.headers" || fail "$3: status is not 200: $(head -n 1 "$work/$3.headers")"
  grep -qi '^Content-Type: text/event-stream' "$work/$3.headers" || fail "$3: content type is not text/event-stream"
  grep -qi '^Transfer-Encoding: chunked' "$work/$3.headers" || fail "$3: the answer is not chunked"
  check_sse "$work/$3.body" >"$work/$3.data" || fail "$3: bad framing"
  [[ $(tail -n 1 "$work/$3.data") == "[DONE]" ]] || fail "$3: the last event is not [DONE]"
}

post_stream /v1/chat/completions \
  '{"messages":[{"role":"user","content":"John 3:16"}],"temperature":0,"max_tokens":12,"stream":true,"stream_options":{"include_usage":true}}' chat
data=$work/chat.data
head -n 1 "$data" | grep -q '"delta":{"content":"","role":"assistant"}' || fail "chat: the first chunk does not carry the role"
grep -c '"object":"chat.completion.chunk"' "$data" >/dev/null || fail "chat: no chat.completion.chunk"
[[ $(grep -c '"finish_reason":"length"' "$data") -eq 1 ]] || fail "chat: not one finish_reason length"
usage=$(tail -n 2 "$data" | head -n 1)
[[ $usage == *'"choices":[]'* && $usage == *'"completion_tokens":12'* ]] || fail "chat: the usage chunk is not before [DONE]: $usage"
[[ $(grep -c '"content":' "$data") -ge 2 ]] || fail "chat: no content deltas"

post_stream /v1/completions '{"prompt":"And God said","temperature":0,"max_tokens":8,"stream":true}' completion
data=$work/completion.data
[[ $(grep -c '"object":"text_completion"' "$data") -ge 2 ]] || fail "completions: no text_completion chunks"
grep -q '"usage"' "$data" && fail "completions: a usage chunk without stream_options.include_usage"

# Refused before the stream starts: a JSON error, not an event stream.
code=$(curl -sS -o "$work/refused.body" -w '%{http_code} %{content_type}' -H 'Content-Type: application/json' \
  -d '{"model":"nope","prompt":"x","stream":true}' "$url/v1/completions")
[[ $code == "404 application/json" ]] || fail "refused stream: got $code"
grep -q '"code":"model_not_found"' "$work/refused.body" || fail "refused stream: $(cat "$work/refused.body")"

stop_server
echo "SSE framing: ok"
