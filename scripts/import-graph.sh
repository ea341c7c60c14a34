#!/usr/bin/env bash
# The module dependency arrows of src/ (scripts/import-graph.py: `use crate::…`, `super::` and
# inline paths, resolved to the file that defines the item); exits 1 when the modules or the
# files form a cycle. `--files` prints the file arrows too; `--stats` prints structure figures
# (pub items, longest functions, unsafe blocks outside sys.rs) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/import-graph.py "$@"
