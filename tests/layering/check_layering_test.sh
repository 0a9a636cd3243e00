#!/usr/bin/env bash
# scripts/check-layering on small trees made here: a clean one passes, and each kind of include
# against the table fails naming the file and line (a back-edge, an edge the "knows nothing of"
# column forbids by a layer's name, by CUDA and by I/O, a public header of the C ABI); a folder
# under src/ that is no layer, and a layer whose folder is missing, are refused; the repository's
# own table and sources with one back-edge injected fail.
#
#   check_layering_test.sh CHECKER SOURCE_DIR WORK_DIR
set -uo pipefail
checker="$1" source_dir="$2" work="$3"
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0

fail() { echo "FAILED: $*"; failures=$((failures + 1)); }

# expect NAME TREE STATUS PATTERN: the checker on TREE exits with STATUS and prints a line matching PATTERN.
expect() {
  local name="$1" tree="$2" want="$3" pattern="$4" out rc
  out=$("$checker" "$tree" 2>&1); rc=$?
  if [[ $rc != "$want" ]]; then fail "$name: exit $rc, expected $want; output:"; echo "$out"; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then fail "$name: no line matches /$pattern/; output:"; echo "$out"; return; fi
  echo "ok: $name"
}

# A tree of five layers (core, gpu, io, store, model) and the C ABI (capi), with legal includes only.
make_tree() {
  local t="$1"
  mkdir -p "$t/docs" "$t/src/core" "$t/src/gpu" "$t/src/io" "$t/src/store" "$t/src/model" "$t/capi" "$t/include/expertpack"
  cat >"$t/docs/architecture.md" <<'EOF'
# Architecture

## Layers

| layer | folder | owns | knows nothing of |
|---|---|---|---|
| core | `src/core` | errors; of the public headers it sees only `expertpack/status.h` | everything else |
| gpu | `src/gpu` | CUDA basics | models |
| io | `src/io` | reads | CUDA |
| store | `src/store` | the store | model math |
| model | `src/model` | the forward pass | files' I/O strategy, the store |
| capi | `capi/` | the only `extern "C"` | everything below the engine |

## Data flow
EOF
  printf '#pragma once\n#include <expertpack/status.h>\n#include <vector>\n' >"$t/src/core/error.hpp"
  printf '#include "core/error.hpp"\n#include "expertpack/build_config.h"\n' >"$t/src/gpu/check.cpp"
  printf '#include "core/error.hpp"\n#include "reader.hpp"\n' >"$t/src/io/reader.cpp"
  printf '#include "io/reader.hpp"\n#include "gpu/check.hpp"\n' >"$t/src/store/store.cpp"
  printf '#include "core/error.hpp"\n#include "gpu/check.hpp"\n#include <fmt/format.h>\n' >"$t/src/model/model.cpp"
  printf '#include <expertpack/model.h>\n#include "model/model.hpp"\n#include "store/store.hpp"\n' >"$t/capi/model_api.cpp"
}

make_tree "$work/clean"
expect "a clean tree passes" "$work/clean" 0 "^check-layering: 6 layers, no include runs against"

make_tree "$work/back_edge"
printf '#include "core/error.hpp"\n\n#include "model/model.hpp"\n' >"$work/back_edge/src/io/reader.cpp"
expect "a back-edge fails" "$work/back_edge" 1 \
  '^src/io/reader\.cpp:3: io includes "model/model\.hpp" of the layer model, which docs/architecture\.md puts above io$'

make_tree "$work/knows_store"
printf '#include "store/store.hpp"\n' >>"$work/knows_store/src/model/model.cpp"
expect "an edge the row forbids by name fails" "$work/knows_store" 1 \
  '^src/model/model\.cpp:4: model includes "store/store\.hpp" of the layer store; docs/architecture\.md says model knows nothing of "the store"$'

make_tree "$work/knows_cuda"
printf '#include "gpu/check.hpp"\n' >"$work/knows_cuda/src/io/direct.cpp"
expect "an edge the row forbids as CUDA fails" "$work/knows_cuda" 1 \
  '^src/io/direct\.cpp:1: io includes "gpu/check\.hpp" of the layer gpu; .* knows nothing of "CUDA"$'

make_tree "$work/knows_io"
printf '#include <io/reader.hpp>\n' >"$work/knows_io/src/model/loader.cpp"
expect "an edge the row forbids as I/O fails" "$work/knows_io" 1 \
  '^src/model/loader\.cpp:1: model includes "io/reader\.hpp" of the layer io; .* knows nothing of "files. I/O strategy"$'

make_tree "$work/public_header"
printf '#include <expertpack/model.h>\n' >"$work/public_header/src/store/stats.hpp"
expect "a public header of the C ABI below capi fails" "$work/public_header" 1 \
  '^src/store/stats\.hpp:1: store includes "expertpack/model\.h" of the layer capi, which .* puts above store$'

make_tree "$work/two"
printf '#include "model/model.hpp"\n' >"$work/two/src/core/log.cpp"
printf '#include "capi/guard.hpp"\n' >"$work/two/src/model/guarded.cpp"
expect "every back-edge is reported" "$work/two" 1 "^check-layering: 2 include\(s\) against the layering"

make_tree "$work/unknown_folder"
mkdir -p "$work/unknown_folder/src/experts"
expect "a folder under src/ that is no layer is refused" "$work/unknown_folder" 2 \
  "^check-layering: src/experts is no layer of the table in docs/architecture\.md"

make_tree "$work/missing_folder"
rm -r "$work/missing_folder/src/gpu"
expect "a layer whose folder is missing is refused" "$work/missing_folder" 2 "names the folder src/gpu, which does not exist"

make_tree "$work/no_table"
printf '# Architecture\n\nNo table.\n' >"$work/no_table/docs/architecture.md"
expect "a document without the table is refused" "$work/no_table" 2 'no layer table under "## Layers"'

# The repository's own table and sources, once as they are and once with format including the engine.
mkdir -p "$work/repo/docs"
cp "$source_dir/docs/architecture.md" "$work/repo/docs/"
# (hard links where the file system allows: nothing is copied; the one file changed is replaced)
cp -rl "$source_dir/src" "$source_dir/capi" "$work/repo/" 2>/dev/null ||
  { rm -rf "$work/repo/src" "$work/repo/capi"; cp -r "$source_dir/src" "$source_dir/capi" "$work/repo/"; }
expect "the repository passes" "$work/repo" 0 "no include runs against the layering"
rm "$work/repo/src/format/gguf.cpp"
{ cat "$source_dir/src/format/gguf.cpp"; printf '#include "engine/engine.hpp"\n'; } >"$work/repo/src/format/gguf.cpp"
expect "the repository with format including the engine fails" "$work/repo" 1 \
  '^src/format/gguf\.cpp:[0-9]+: format includes "engine/engine\.hpp" of the layer engine, which docs/architecture\.md puts above format$'

if ((failures)); then echo "$failures case(s) failed"; exit 1; fi
echo "all cases passed"
