#!/usr/bin/env bash
# "See a page before the OOM": the demo leaks toward a 1 GiB budget while a real Prometheus
# (with `memexporter rules --preset demo`) and a real Alertmanager (with the shipped routing
# example) watch it. Notifications are printed as they reach a small local webhook.
# Everything listens on loopback and lives in a temporary folder removed at exit.
#   scripts/walkthrough.sh [extra demo options]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
VPY="${MEMEXPORTER_VENV:-.venv}/bin/python"
work=$(mktemp -d -t memexporter-walkthrough-XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { "$VPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
DEMO=$(free_port); PROM=$(free_port); AM=$(free_port); HOOK=$(free_port)

# A webhook that prints each notification on one line.
cat > "$work/hook.py" <<PY
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
start = time.time()
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        for a in body["alerts"]:
            print(f"[{time.time() - start:5.0f}s] {self.path[1:]:5s} {a['status']:8s} {a['labels']['alertname']} "
                  f"(severity {a['labels']['severity']}): {a['annotations'].get('summary', '')}", flush=True)
        self.send_response(200); self.end_headers()
    def log_message(self, *args): pass
HTTPServer(("127.0.0.1", $HOOK), H).serve_forever()
PY
sed -e "s#http://pager.example.invalid/memexporter#http://127.0.0.1:$HOOK/pager#" \
    -e "s#http://chat.example.invalid/memexporter#http://127.0.0.1:$HOOK/chat#" \
    alertmanager/alertmanager.example.yml > "$work/alertmanager.yml"
# The demo preset (windows of seconds) is rendered here, never beside the default rules in alerts/.
"$VPY" -m memexporter rules --preset demo --output "$work/memexporter.demo.rules.yml"
cat > "$work/prometheus.yml" <<YML
global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
rule_files: ["$work/memexporter.demo.rules.yml"]
alerting: {alertmanagers: [{static_configs: [{targets: ["127.0.0.1:$AM"]}]}]}
scrape_configs: [{job_name: memexporter, static_configs: [{targets: ["127.0.0.1:$DEMO"]}]}]
YML

"$VPY" "$work/hook.py" & pids+=($!)
prometheus-alertmanager --config.file="$work/alertmanager.yml" --storage.path="$work/am" \
  --web.listen-address="127.0.0.1:$AM" --cluster.listen-address= >"$work/am.log" 2>&1 & pids+=($!)
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom" \
  --web.listen-address="127.0.0.1:$PROM" >"$work/prom.log" 2>&1 & pids+=($!)
echo "[walkthrough] Prometheus http://127.0.0.1:$PROM/alerts  Alertmanager http://127.0.0.1:$AM  metrics http://127.0.0.1:$DEMO/metrics"
echo "[walkthrough] the demo leaks ~2 MiB/s toward a 1 GiB budget; warnings go to 'chat', critical pages to 'pager'"
set +e
"$VPY" -m memexporter demo --device cpu --port "$DEMO" --addr 127.0.0.1 --layers 1 --d-model 64 --seq-len 32 \
  --batch-size 4 --step-interval 0.2 --warmup-steps 5 --memory-limit-mib 1024 --leak-mib-per-step 0.4 "$@"
echo "[walkthrough] demo exited with $? (3 = the simulated OOM)"
# The target is gone right after a peak near its limit: MemexporterFatalOOMSuspected fires after
# its 10 s 'for' and reaches the webhook after the route's 10 s group_wait.
echo "[walkthrough] waiting 40 s for MemexporterFatalOOMSuspected (Ctrl-C ends the walkthrough sooner)"
sleep 40
