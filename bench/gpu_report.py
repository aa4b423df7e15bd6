"""Issue 71's must-show tables from one GPU run, as Markdown: `python bench/gpu_report.py GPU_JSON [--variants
VARIANTS_JSON] [--expect-ids ID,...] [--out FILE]`.

Reads what `bench/gpu.py --syncs --batched --quickstart` wrote (gpu.json) and, if given, `bench/variants.py --json`'s
file, and prints: the batched client work per client at each N for both models and meta-gradients (step, rounds, the
IFT's ratio to FOMAML+, peak memory, the N `--client-batch auto` planned), the goals with their measured values, the
host syncs per round, and the step's variants. Nothing is measured here: every figure is the run's; a part the run
did not reach prints as missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODELS = ("resnet18-cifar", "small-cnn")
# issue 71's goals, with the readings they are stated against (one NVIDIA H200, one client at a time)
IFT_OVER_FOMAML = 1.5
IFT_ROUND_ALONE_S, IFT_SPEEDUP = 4.2, 8.0
PROJECTION_H = 1.5
QUICKSTART_S = 45.0


def ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1e3:.1f} ms"


def sec(s: float | None) -> str:
    return "–" if s is None else f"{s:.3f} s"


def mb(v: float | None) -> str:
    return "–" if v is None else f"{v / 1024:.1f} GB"


def _at(rec: dict, n: str, key: str) -> float | None:
    v = rec.get(n, {}).get(key)
    return None if v is None else float(v)


def batched_table(b: dict) -> list[str]:
    """Per model and N: step, FOMAML+ and IFT rounds per client, the IFT's ratio, peak memory (step / rounds)."""
    out = ["| model | N | step | FOMAML+ round | IFT round | IFT ÷ FOMAML+ | peak memory: step / FOMAML+ / IFT |",
           "|---|---|---|---|---|---|---|"]
    for model in MODELS:
        r = b.get(model)
        if not r:
            continue
        step, fo, ift = r.get("step", {}), r.get("fomaml_round", {}), r.get("ift_round", {})
        for n in sorted({*step, *fo, *ift}, key=int):
            f, i = _at(fo, n, "per_client_s"), _at(ift, n, "per_client_s")
            ratio = "–" if f is None or i is None else f"{i / f:.2f}"
            peaks = " / ".join(mb(_at(x, n, "peak_gpu_mb")) for x in (step, fo, ift))
            out.append(f"| {model} | {n} | {ms(_at(step, n, 'per_client_s'))} | {sec(f)} | {sec(i)} | {ratio} | {peaks} |")
    return out


def auto_lines(b: dict) -> list[str]:
    """The group size `auto` planned from one client's footprint, per model and workload."""
    out = []
    for model in MODELS:
        picks = {what: b.get(model, {}).get(what, {}).get("1", {}).get("auto_n")
                 for what in ("step", "fomaml_round", "ift_round")}
        if any(v is not None for v in picks.values()):
            out.append(f"- {model}: " + ", ".join(f"{k} N = {v}" for k, v in picks.items() if v is not None))
    return out


def goals(run: dict, expect_ids: list[str]) -> list[str]:
    """Each goal of issue 71's item 6 (and item 1's ratio) with the run's value and whether it is met."""
    rows = []
    b = run.get("batched", {})
    ratios = ift_ratios(b)
    if ratios:
        rows.append(_row(f"IFT round per client ≤ {IFT_OVER_FOMAML}× FOMAML+'s at the same N", f"worst {max(ratios):.2f}×",
                         max(ratios) <= IFT_OVER_FOMAML))
    ift = b.get("resnet18-cifar", {}).get("ift_round", {})
    if ift:
        best = min(float(v["per_client_s"]) for v in ift.values())
        alone = _at(ift, "1", "per_client_s")
        here = f"; {alone / best:.1f}× this run's one at a time" if alone else ""
        rows.append(_row(f"ResNet-18 IFT round per client ≥ {IFT_SPEEDUP:g}× faster than {IFT_ROUND_ALONE_S} s",
                         f"{best:.3f} s: {IFT_ROUND_ALONE_S / best:.1f}×{here}", IFT_ROUND_ALONE_S / best >= IFT_SPEEDUP))
    for key, h in run.get("projection_batched_h", {}).items():
        mg = "IFT" if key.endswith("_ift") else "FOMAML+"
        rows.append(_row(f"CIFAR-10 meta-training ({mg}, 500 rounds × 100 clients) ≤ {PROJECTION_H} h", f"{h:.2f} h",
                         h <= PROJECTION_H))
    qs = run.get("quickstart_s", {})
    if "default" in qs:
        rows.append(_row(f"`fedl2p run quickstart` as shipped ≤ {QUICKSTART_S:g} s",
                         "; ".join(f"{label.replace('_', ' ')}: {_wall(s)}" for label, s in qs.items()),
                         _ok(qs["default"]) and qs["default"] <= QUICKSTART_S))
    for label, ids in run.get("quickstart_meta_train_ids", {}).items():
        if expect_ids:
            rows.append(_row(f"quickstart ({label}): the CPU's meta-train ids", ", ".join(ids) or "none",
                             set(expect_ids) <= set(ids)))
    if not rows:
        return []
    return ["| goal | this run | met |", "|---|---|---|", *rows]


def ift_ratios(b: dict) -> list[float]:
    """The IFT's round per client over FOMAML+'s, at every N both were measured at, both models."""
    out = []
    for model in MODELS:
        fo, ift = b.get(model, {}).get("fomaml_round", {}), b.get(model, {}).get("ift_round", {})
        for n in fo:
            f, i = _at(fo, n, "per_client_s"), _at(ift, n, "per_client_s")
            if f and i is not None:
                out.append(i / f)
    return out


def _ok(s: object) -> bool:
    return isinstance(s, (int, float))


def _wall(s: object) -> str:
    """A quickstart's wall time, or what its failure printed last."""
    return f"{s:.1f} s" if _ok(s) else f"failed ({s})"


def _row(goal: str, value: str, met: bool) -> str:
    return f"| {goal} | {value} | {'yes' if met else '**no**'} |"


def syncs_table(s: dict) -> list[str]:
    if not s:
        return []
    out = [f"Host syncs CUDA reports in one client round ({s.get('model')}, the group: {s.get('n')} clients):", "",
           "| meta-gradient | one client | group | group's sites |", "|---|---|---|---|"]
    for mg, name in (("fomaml", "FOMAML+"), ("ift", "IFT")):
        one, group = s.get(f"{mg}_one_client", {}), s.get(f"{mg}_group", {})
        sites = ", ".join(f"{k} ({v})" for k, v in group.get("sites", {}).items()) or "–"
        out.append(f"| {name} | {one.get('total', '–')} | {group.get('total', '–')} | {sites} |")
    return out


def variants_table(v: dict) -> list[str]:
    if not v.get("models"):
        return []
    out = [f"The batched step's variants, N = {v.get('n')} ({v.get('device')}):", "",
           "| model | variant | per client | ÷ eager | update's distance from eager's |", "|---|---|---|---|---|"]
    for model, rec in v["models"].items():
        for name, r in rec.items():
            out.append(f"| {model} | {name} | {ms(r.get('per_client_s'))} | {r.get('vs_eager', float('nan')):.2f} | "
                       f"{r.get('update_vs_eager', float('nan')):.2e} |")
    return out


def report(run: dict, variants: dict | None = None, expect_ids: list[str] | None = None) -> str:
    head = f"# One GPU run: {run.get('device', '?')}, torch {run.get('torch', '?')}, CUDA {run.get('cuda', '?')}"
    b = run.get("batched", {})
    picks = auto_lines(b)
    parts = [[head], batched_table(b) if b else [],
             ["`--client-batch auto` planned, from one client's peak memory on this card:", *picks] if picks else [],
             goals(run, expect_ids or []), syncs_table(run.get("host_syncs_per_round", {})),
             variants_table(variants or {})]
    return "\n\n".join("\n".join(p) for p in parts if p) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gpu_json", type=Path, help="the run's gpu.json (bench/gpu.py)")
    ap.add_argument("--variants", type=Path, default=None, help="the run's variants.json (bench/variants.py --json)")
    ap.add_argument("--expect-ids", default="", help="meta-train ids the quickstart built on the CPU, comma-separated")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown here (else standard output)")
    a = ap.parse_args(argv)
    try:
        run = json.loads(a.gpu_json.read_text())
        variants = json.loads(a.variants.read_text()) if a.variants and a.variants.exists() else None
    except (OSError, ValueError) as e:
        sys.exit(f"gpu_report: cannot read {e}")
    text = report(run, variants, [i for i in a.expect_ids.split(",") if i])
    if a.out:
        a.out.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
