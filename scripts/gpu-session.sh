#!/usr/bin/env bash
# One short, prepared pass over everything only a GPU can check (issue 71), for a lent machine's few minutes:
#   the CUDA tests, then `bench/variants.py` (the batched step in float32, strict float32, TF32, bf16 autocast and as a
#   replayed CUDA graph, at N = 32), then `bench/gpu.py --syncs --batched` (the host syncs CUDA reports in a client
#   round, one at a time and batched; the batched FOMAML+ and IFT per client at N = 1, 8, 32, 128 with peak memory,
#   and the CIFAR-10 projection), then the quickstart's wall time.
# Each part has its own time cap, so a slow part cannot eat the others; what finished is kept. Results go to
# $OUT (the device tool's folder) or ./gpu-out: gpu.json, variants.json, cuda-tests.log, variants.log, bench.log,
# and report.md (bench/gpu_report.py: the tables issue 71 asks for, from gpu.json and variants.json).
# Run it from the repository root with the machine's own python3 (it holds PyTorch and the packages fedl2p needs):
#   bash scripts/gpu-session.sh            # about 10 minutes at most
set -u
out="${OUT:-gpu-out}"; mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 FEDL2P_STORE="$(mktemp -d)"
py="${PYTHON:-python3}"
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu-session: no CUDA device here; nothing measured"; exit 1
fi
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
    | tee "$out/device.txt"
timeout 150 "$py" -m pytest -q -x -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -30 > "$out/cuda-tests.log"
echo "cuda tests: rc ${PIPESTATUS[0]}" | tee -a "$out/cuda-tests.log"
timeout 90 "$py" bench/variants.py --device cuda --n 32 --json "$out/variants.json" > "$out/variants.log" 2>&1
echo "variants: rc $?" | tee -a "$out/variants.log"
timeout 360 "$py" bench/gpu.py --syncs --batched --quickstart 2>&1 | tee "$out/bench.log" | tail -8
cp bench/gpu.json "$out/gpu.json" 2>/dev/null || echo "bench/gpu.json not written" | tee -a "$out/bench.log"
# issue 71's must-show tables from this run (the quickstart's meta-train id on the CPU: docs/guide/store.md)
"$py" bench/gpu_report.py "$out/gpu.json" --variants "$out/variants.json" --expect-ids 8ce6b3c73718 \
    --out "$out/report.md" && cat "$out/report.md"
