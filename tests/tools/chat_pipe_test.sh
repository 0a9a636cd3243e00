#!/bin/sh
# ep-chat driven through a pipe: two turns, /stats, /reset, /quit; then Ctrl-C (SIGINT) stops a
# long answer without ending the program. Usage: chat_pipe_test.sh EP_CHAT MODEL WORKDIR
set -u
chat="$1"; model="$2"; work="$3"
mkdir -p "$work"
out="$work/chat_pipe.out"
fail() { echo "FAIL: $*"; echo "---- output:"; cat "$out"; exit 1; }

printf 'Hello there!\n/stats\nTell me more, please.\n/stats\n/reset\n/stats\n/quit\n' |
  "$chat" --model "$model" --pack-dir "$work/packs" --cache-mib 0.1 -n 24 --seed 3 >"$out" 2>&1 || fail "exit status $?"
grep -q '^> Hello there!$' "$out" || fail "the first line is not echoed"
grep -q '^> Tell me more, please.$' "$out" || fail "the second turn is missing"
[ "$(grep -c '^last answer: ' "$out")" -ge 2 ] || fail "/stats after each answer"
grep -q 'experts: [0-9]* acquires, [0-9]* hits, [0-9]* misses, [1-9][0-9]* evictions' "$out" || fail "no expert-cache statistics"
grep -q '(new conversation)' "$out" || fail "/reset"
grep -q 'conversation: 0 messages, 0 tokens in the session' "$out" || fail "/reset did not empty the session"
grep -q 'conversation: 4 messages' "$out" || fail "history after two turns"

# Ctrl-C: a long answer is stopped, the program goes on to /stats and /quit.
fifo="$work/chat_fifo"
rm -f "$fifo"; mkfifo "$fifo"
int_out="$work/chat_int.out"
"$chat" --model "$model" --pack-dir "$work/packs" -n 100000 --ignore-eos <"$fifo" >"$int_out" 2>&1 &
pid=$!
exec 3>"$fifo"
# (the waits below end on what the program prints, or when it has exited; however long that
# takes on a loaded machine, only CTest's timeout bounds it)
until grep -q '^Chat (' "$int_out"; do kill -0 $pid 2>/dev/null || { out="$int_out"; fail "exited before its prompt"; }; sleep 0.1; done
printf 'Write a very long story.\n' >&3
# wait until the answer is streaming (output past the echoed line), then Ctrl-C; ep-chat reads
# its input only between answers, so /stats and /quit wait in the pipe until the answer stops
until [ "$(sed -n '/^> Write a very long story.$/,$p' "$int_out" | wc -c)" -gt 400 ]; do
  kill -0 $pid 2>/dev/null || { out="$int_out"; fail "exited before the answer streamed"; }; sleep 0.1; done
kill -INT $pid
printf '/stats\n/quit\n' >&3
exec 3>&-
wait $pid; rc=$?
rm -f "$fifo"
out="$int_out"
[ $rc -eq 0 ] || fail "exit status $rc after Ctrl-C"
grep -q '\[stopped\]' "$out" || fail "the answer was not stopped"
grep -q 'stopped: cancelled' "$out" || fail "/stats does not say cancelled"
echo "chat pipe test: ok"
