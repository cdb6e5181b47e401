#!/usr/bin/env bash
# `make run`: start a standalone cluster, prove it with a write and a read, show it, stop it.
set -euo pipefail
data_dir=${BKAIO_RUN_DIR:-.standalone}
bkaio=.venv/bin/bkaio
mkdir -p "$data_dir"
log="$data_dir/standalone.log"

"$bkaio" standalone --bookies 3 --data-dir "$data_dir" >"$log" 2>&1 &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT

echo "starting a standalone cluster (3 bookies, embedded metadata) in $data_dir ..."
# Ours is the ready.json that names our pid: one left by a killed run (or written by another
# standalone on this directory, which makes ours exit) does not count.
ours() { grep -qE "\"pid\": $pid[,}]" "$data_dir/ready.json" 2>/dev/null; }
for _ in $(seq 1 600); do
    ours && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "bkaio standalone failed to start:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.1
done
ours || { echo "standalone not ready after 60 s; see $log" >&2; exit 1; }
uri=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["metadata"])' \
    "$data_dir/ready.json")

echo
"$bkaio" shell simpletest --metadata "$uri" --entries 1000
echo
"$bkaio" shell listbookies --metadata "$uri"
cat <<NEXT

It works. Next:
  .venv/bin/bkaio standalone --data-dir $data_dir      # keep a cluster up (Ctrl-C stops it)
  BKAIO_METADATA=$uri .venv/bin/python examples/quickstart.py
  BKAIO_METADATA=$uri .venv/bin/bkaio shell listledgers
Stopping the cluster now.
NEXT
