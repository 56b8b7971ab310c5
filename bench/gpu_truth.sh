#!/usr/bin/env bash
# What the agent says on a real NVIDIA GPU, with a verdict for every figure, in under five
# minutes: the `gpu`-marked tests, `status --json`, the per-process view while a small torch
# job runs, and `health --full --stress` (copy bandwidth, GEMM, peer-to-peer, NCCL, sustained
# load), each measured figure against the spec catalogue and the H200 reference figures.
#
#   bench/gpu_truth.sh                       # from the repository root, on the GPU machine
#
# Environment (all optional):
#   TORCH_PYTHON  the Python whose CUDA torch drives the GPU (default: the first of
#                 .venv/bin/python and python3 whose torch sees a GPU)
#   AGENT_PYTHON  the Python that runs the agent (default python3; 3.9 or newer)
#   PYZ           the agent archive (default: built afresh from this checkout, else
#                 dist/gpu-agent.pyz)
#   STRESS        how long `health --stress` holds the load (default 60s)
#   OUT           where the JSON documents are kept (default a new temporary directory)
#
# Exit status: 0 when no verdict is FAIL, 1 otherwise (WARN lines are printed, not counted:
# a password-enabled sshd on a lent machine says nothing about its GPU).
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
STRESS=${STRESS:-60s}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-truth.XXXXXX")}
AGENT_PYTHON=${AGENT_PYTHON:-python3}
export GPU_AGENT_HOME="$OUT/agent-home"
VERDICTS="$OUT/verdicts"
: >"$VERDICTS"
BEGAN=$(date +%s)

say() { printf '\n=== %s ===\n' "$*"; }
verdict() { # verdict STATUS WHAT
    printf '%-4s  %s\n' "$1" "$2" | tee -a "$VERDICTS"
}

torch_sees_gpu() {
    "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
}

if [ -z "${TORCH_PYTHON:-}" ]; then
    for candidate in "$ROOT/.venv/bin/python" python3; do
        if command -v "$candidate" >/dev/null 2>&1 && torch_sees_gpu "$candidate"; then
            TORCH_PYTHON=$(command -v "$candidate")
            break
        fi
    done
fi
TORCH_PYTHON=${TORCH_PYTHON:-python3}

say "machine"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit,pcie.link.gen.max \
        --format=csv
    nvidia-smi topo -m 2>/dev/null | head -20
else
    echo "nvidia-smi is not on PATH"
fi
"$TORCH_PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
      "sees", torch.cuda.device_count() if torch.cuda.is_available() else 0, "GPU(s)")' \
    || echo "no torch in $TORCH_PYTHON"
echo "agent Python: $("$AGENT_PYTHON" -V 2>&1); torch Python: $TORCH_PYTHON; output in $OUT"

say "the agent archive"
if [ -z "${PYZ:-}" ]; then
    PYZ="$OUT/gpu-agent.pyz"
    BUILDER="$ROOT/.venv/bin/python"
    [ -x "$BUILDER" ] || BUILDER=$AGENT_PYTHON
    if ! "$BUILDER" -m agents.zipapp "$PYZ"; then
        PYZ="$ROOT/dist/gpu-agent.pyz"
        echo "building failed (no nvidia-ml-py for $BUILDER?): using $PYZ, which may be older"
    fi
fi
[ -f "$PYZ" ] || { verdict FAIL "no agent archive at $PYZ"; exit 1; }
echo "$PYZ"
agent() { timeout "${AGENT_TIMEOUT:-60}" "$AGENT_PYTHON" -I "$PYZ" "$@"; }

say "gpu-marked tests"
TEST_PYTHON="$ROOT/.venv/bin/python"
[ -x "$TEST_PYTHON" ] || TEST_PYTHON=$TORCH_PYTHON
if "$TEST_PYTHON" -c 'import pytest' 2>/dev/null; then
    timeout 150 "$TEST_PYTHON" -m pytest -q -rs -m gpu -p no:cacheprovider tests/agents \
        2>&1 | tee "$OUT/gpu-tests.txt"
    RESULT=$(tail -n 1 "$OUT/gpu-tests.txt")
    if [ "${PIPESTATUS[0]}" -ne 0 ] && ! grep -q ' passed' <<<"$RESULT"; then
        verdict FAIL "gpu-marked tests: $RESULT"
    elif grep -q 'failed\|error' <<<"$RESULT"; then
        verdict FAIL "gpu-marked tests: $RESULT"
    elif grep -q ' passed' <<<"$RESULT"; then
        verdict PASS "gpu-marked tests: $RESULT"
    else
        verdict SKIP "gpu-marked tests: $RESULT"
    fi
else
    verdict SKIP "gpu-marked tests: no pytest in $TEST_PYTHON"
fi

say "gpu-agent status"
agent status
agent status --json >"$OUT/status.json"
"$AGENT_PYTHON" - "$OUT/status.json" >>"$VERDICTS" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
err = doc["nvml_error"]
if err:
    print(f"FAIL  status: NVML failed: {err['code']}: {err['message']}")
elif not doc["gpus"]:
    print("FAIL  status: NVML sees no GPU")
else:
    gpu = doc["gpus"][0]
    missing = sorted(k for k, v in gpu.items() if v is None)
    print(f"PASS  status: {len(doc['gpus'])} GPU(s), GPU 0 {gpu['name']}; fields NVML does not "
          f"report here: {', '.join(missing) or 'none'}")
PY
tail -n 1 "$VERDICTS"

say "per-process view with a torch job running"
if ! torch_sees_gpu "$TORCH_PYTHON"; then
    verdict SKIP "per-process view: the torch of $TORCH_PYTHON sees no GPU (set TORCH_PYTHON)"
else
    "$TORCH_PYTHON" - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
began = time.time()
while time.time() - began < 45:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
PY
    JOB=$!
    SEEN=""
    for _ in $(seq 1 40); do
        sleep 0.5
        agent status --json >"$OUT/status-busy.json" 2>/dev/null || continue
        if grep -q "\"pid\":$JOB[,}]" "$OUT/status-busy.json"; then SEEN=1; break; fi
    done
    sleep 2  # let the driver sample the process's utilisation
    agent status --json >"$OUT/status-busy.json"
    agent status | sed -n '/^GPU  PID/,$p'
    agent who
    kill "$JOB" 2>/dev/null
    wait "$JOB" 2>/dev/null
    "$AGENT_PYTHON" - "$OUT/status-busy.json" "$JOB" "$SEEN" >>"$VERDICTS" <<'PY'
import json, sys
doc, pid, seen = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
rows = [p for p in doc["processes"] if p["pid"] == pid]
if not rows:
    print(f"FAIL  per-process view: the torch job (pid {pid}) is not among the GPU processes"
          + ("" if seen else " (never seen)"))
else:
    p = rows[0]
    text = (f"pid {pid} on GPU {p['gpu_index']}: SM {p['sm_util_pct']}%, memory bandwidth "
            f"{p['mem_bw_util_pct']}%, CPU {p['cpu_pct']}%, RSS {p['rss_bytes']}, "
            f"up {p['elapsed_s']} s")
    busy = (p["sm_util_pct"] or 0) > 0 and p["cpu_pct"] is not None and p["elapsed_s"] is not None
    print(("PASS" if busy else "FAIL") + "  per-process view: " + text)
PY
    tail -n 1 "$VERDICTS"
fi

say "gpu-agent health --full --stress $STRESS"
AGENT_TIMEOUT=280 agent health --full --stress "$STRESS" --python "$TORCH_PYTHON" --timeout 120 \
    --json >"$OUT/health.json"
echo "exit status $? (1 means some check failed)"
"$AGENT_PYTHON" - "$OUT/health.json" >>"$VERDICTS" <<'PY'
import json, sys

# Reference figures by catalogue key: an H200 copies about 4.3 TB/s device to device (90 % of
# the 4.8 TB/s spec) and reaches about 788 TFLOP/s in dense bf16 GEMM (80 % of 989).
REFERENCE = {"h200": {"bandwidth": 4300.0, "gemm": 788.0}}
LABELS = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    print("FAIL  health --full: printed no JSON document")
    sys.exit()
for check in report["checks"]:
    print(f"{LABELS[check['status']]}  health {check['id']}: {check['summary']}")
    details = check.get("details") or {}
    if check["id"] in ("bandwidth", "gemm"):
        for index, row in sorted((details.get("gpus") or {}).items()):
            key = row.get("gpu") or ""
            ref = next((f[check["id"]] for k, f in REFERENCE.items() if key.startswith(k)), None)
            if ref is None or row.get("measured") is None:
                continue
            share = row["measured"] / ref
            print(f"{'PASS' if share >= 0.9 else 'WARN'}  GPU {index} {check['id']}: "
                  f"{row['measured']:.0f} {details.get('unit')}, {share:.0%} of the reference "
                  f"{ref:.0f} for {key}")
    if check["id"] == "stress":
        for index, row in sorted((details.get("gpus") or {}).items()):
            print(f"      GPU {index} under load: {json.dumps(row, sort_keys=True)}")
    if check["id"] in ("p2p", "nccl", "topology") and check["status"] != "skip":
        print(f"      {check['id']} details: {json.dumps(details, sort_keys=True)[:600]}")
PY

say "verdicts ($(($(date +%s) - BEGAN)) s)"
cat "$VERDICTS"
echo "documents: $OUT"
if grep -q '^FAIL' "$VERDICTS"; then exit 1; fi
exit 0
