#!/usr/bin/env bash
# One short, prepared pass over everything only a GPU can check (issue 71), for a lent machine's few minutes, the
# most needed first, each part under its own time cap (what a part finished is kept; a slow part cannot eat the next):
#   the CUDA tests (120 s); `bench/gpu.py --batched` (240 s: the batched FOMAML+ and IFT per client at N = 1, 8, 32,
#   128 for the step and 1, 8, 32 for the round, with peak memory and the N `auto` plans, and the CIFAR-10
#   projection); `--quickstart` (120 s: the quickstart's wall time and ids as shipped, then one client at a time);
#   `--syncs` (30 s: the host syncs CUDA reports in a client round, one at a time and a group of 8);
#   `bench/variants.py` (60 s: the batched step in float32, strict float32, TF32, bf16 autocast and as a replayed
#   CUDA graph, at N = 32). About 10 minutes at most.
# Results go to $OUT (the device tool's folder) or ./gpu-out: gpu.json, variants.json, the logs, and report.md
# (bench/gpu_report.py: the tables issue 71 asks for, from gpu.json and variants.json).
# Run it from the repository root with the machine's own python3 (it holds PyTorch and the packages fedl2p needs):
#   bash scripts/gpu-session.sh
# The quickstart needs Fashion-MNIST, which a machine without a network cannot install: copy it beside the checkout
# first (`mkdir -p gpu-data && cp -r /usr/share/datasets/fashion-mnist gpu-data/`, 30 MB, git-ignored) and bring
# gpu-data along (the device tool's carry); the script reads it from there unless FEDL2P_DATA names another folder.
set -u
out="${OUT:-gpu-out}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 FEDL2P_STORE="$(mktemp -d)"
if [ -z "${FEDL2P_DATA:-}" ] && [ -d gpu-data/fashion-mnist ]; then export FEDL2P_DATA="$PWD/gpu-data/fashion-mnist"; fi
py="${PYTHON:-python3}"
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu-session: no CUDA device here; nothing measured"; exit 1
fi
mkdir -p "$out"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
    | tee "$out/device.txt"
rm -f bench/gpu.json  # this run's parts only (--merge adds each to the file the previous one wrote)
timeout 120 "$py" -m pytest -q -x -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -30 > "$out/cuda-tests.log"
echo "cuda tests: rc ${PIPESTATUS[0]}" | tee -a "$out/cuda-tests.log"
part() {  # NAME SECONDS ARGS...: one part of bench/gpu.py under its cap, its log in $out/NAME.log
    local name="$1" cap="$2"; shift 2
    timeout "$cap" "$py" bench/gpu.py --merge "$@" > "$out/$name.log" 2>&1
    echo "$name: rc $?" | tee -a "$out/$name.log"
}
part batched 240 --batched --round-ns 1,8,32
part quickstart 120 --quickstart
part syncs 30 --syncs
timeout 60 "$py" bench/variants.py --device cuda --n 32 --json "$out/variants.json" > "$out/variants.log" 2>&1
echo "variants: rc $?" | tee -a "$out/variants.log"
cp bench/gpu.json "$out/gpu.json" 2>/dev/null || echo "bench/gpu.json not written" | tee -a "$out/batched.log"
# the must-show tables (the quickstart's meta-train id on the CPU: docs/guide/store.md)
"$py" bench/gpu_report.py "$out/gpu.json" --variants "$out/variants.json" --expect-ids 8ce6b3c73718 \
    --out "$out/report.md" && cat "$out/report.md"
