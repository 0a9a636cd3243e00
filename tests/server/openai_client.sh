#!/usr/bin/env bash
# Runs openai_client.cjs (the official openai npm package against ep-server) when node and the
# package are there; skips (77) otherwise.
#   openai_client.sh EP_SERVER MODEL NODE_DIR WORK_DIR   (NODE_DIR/node_modules/openai: npm install --no-save --prefix NODE_DIR openai)
set -euo pipefail
server=$1 model=$2 node_dir=$3 work=$4
if ! command -v node >/dev/null 2>&1; then
  echo "node not found: skipped (install Node.js and 'npm install --no-save --prefix $node_dir openai')"
  exit 77
fi
if [[ ! -f $node_dir/node_modules/openai/package.json ]]; then
  echo "the openai npm package is not in $node_dir/node_modules: skipped ('npm install --no-save --prefix $node_dir openai')"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "${BASH_SOURCE[0]}")/start_server.sh"
# Prefix-cache blocks of 8 tokens: the short first turn is a few blocks, which its next turn continues.
start_server "$server" "$model" "$work" --api-key test-key --parallel 4 --prefill-chunk 8
node "$(dirname "${BASH_SOURCE[0]}")/openai_client.cjs" "$url/v1" test-key "$node_dir/node_modules/openai"
stop_server
