"""Calibration wall time of this checkout against a baseline checkout, side by side in one run.

``python -m bench.micro.calibration_wall --baseline DIR [--model fmnist-cnn] [--threads 1] [--json PATH]``

``DIR`` is another checkout of the project (``git worktree add DIR <commit>``, with its native
kernels built) whose ``qpart calibrate`` is the one to compare with. Both jobs start at the same
moment and run to the end on the same machine, each limited to ``--threads`` torch threads (so on
a 2-core host each has a core), with the same settings otherwise (the defaults of each). Both see
the same load from anything else running, so their ratio is the figure; the absolute times are
those of a shared machine. For each job: wall seconds, user and system CPU seconds of the job and
every process it waited for (its worker pool included), peak RSS of the largest of them, the
pattern count and violations it printed, and where its artifact went (``--out-root``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import REPO, write_json


def start(name: str, root: Path, model: str, threads: int, out: Path,
          log: Path) -> tuple[subprocess.Popen[bytes], float]:
    """``qpart calibrate`` of the checkout at ``root`` in its own process group."""
    env = {**os.environ, "PYTHONPATH": str(root), "QPART_CALIB_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "qpart", "calibrate", "--model", model, "--out", str(out)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    print(f"{name}: pid {proc.pid}, {' '.join(cmd)} in {root}", flush=True)
    return proc, time.perf_counter()


def git_commit(root: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def stages(out: Path) -> dict[str, float]:
    """The job's seconds per stage, from the ``timing.json`` it wrote (empty if it wrote none)."""
    path = out / "timing.json"
    if not path.is_file():
        return {}
    timing = json.loads(path.read_text())["timing_s"]
    return {k.removeprefix("stage_"): round(v, 1) for k, v in timing.items() if k.startswith("stage_")}


def patterns(new: Path, baseline: Path) -> dict[str, Any]:
    """The two artifacts' served patterns side by side: counts, the new one's calibrated cuts,
    patterns over their level on the test split, and, at each (cut, level) both serve, whether
    the new pattern is the baseline's or at least as conservative (no tensor with fewer bits)."""
    arts = {name: json.loads((d / "artifact.json").read_text())
            for name, d in (("new", new), ("baseline", baseline))}
    served = {name: {(p["cut"], p["level"]): p for p in a["patterns"]} for name, a in arts.items()}
    both = sorted(set(served["new"]) & set(served["baseline"]))
    same = sum(served["new"][k]["pattern_id"] == served["baseline"][k]["pattern_id"] for k in both)

    def conservative(k: tuple[int, float]) -> bool:
        n, b = served["new"][k], served["baseline"][k]
        return n["activation_bits"] >= b["activation_bits"] and all(
            n["weight_bits"][t] >= bits for t, bits in b["weight_bits"].items())

    choice = arts["new"].get("cut_choice") or {}
    return {"served": {name: len(a["patterns"]) for name, a in arts.items()},
            "calibrated_cuts_new": choice.get("calibrated"), "legal_cuts": len(arts["new"]["cuts"]),
            "at_same_cut_and_level": len(both), "identical": same,
            "as_conservative_or_more": sum(map(conservative, both)),
            "over_level_on_test_split": {
                name: sum(1 for p in a["patterns"] if p["level"] > 0 and p["test_drop"] is not None
                          and p["test_drop"] > p["level"]) for name, a in arts.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="checkout of the code to compare with")
    p.add_argument("--model", default="fmnist-cnn")
    p.add_argument("--threads", type=int, default=1, help="torch threads per job (1: a core each on 2)")
    p.add_argument("--out-root", type=Path, default=Path("/tmp/calibration_wall"),
                   help="artifacts and logs go to OUT_ROOT/{new,baseline}")
    p.add_argument("--json", type=Path, default=REPO / "bench/runs/calibration_wall.json",
                   help="where the comparison goes (bench/runs/ is ignored; commit a copy to bench/results/)")
    a = p.parse_args(argv)
    a.out_root.mkdir(parents=True, exist_ok=True)
    out = a.out_root
    jobs = {name: start(name, root.resolve(), a.model, a.threads, out / name, out / f"{name}.log")
            for name, root in (("new", REPO), ("baseline", a.baseline))}
    results: dict[str, Any] = {}
    pending = {proc.pid: name for name, (proc, _) in jobs.items()}
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        name = pending.pop(pid, None)
        if name is None:
            continue
        t0 = jobs[name][1]
        wall = time.perf_counter() - t0
        tail = (a.out_root / f"{name}.log").read_text(errors="replace").strip().splitlines()[-1:]
        results[name] = {
            "checkout": str(REPO if name == "new" else a.baseline.resolve()),
            "commit": git_commit(REPO if name == "new" else a.baseline),
            "exit_status": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 1),
            "user_s": round(usage.ru_utime, 1), "system_s": round(usage.ru_stime, 1),
            "peak_rss_kib_largest_process": usage.ru_maxrss, "last_line": tail[0] if tail else "",
            "out": str(a.out_root / name)}
        print(f"{name}: done after {wall:.0f} s: {results[name]}", flush=True)
    ratio = results["new"]["wall_s"] / results["baseline"]["wall_s"]
    report = {"model": a.model, "threads_per_job": a.threads, "jobs": results,
              "wall_ratio_new_over_baseline": round(ratio, 4),
              "cpu_ratio_new_over_baseline": round(
                  (results["new"]["user_s"] + results["new"]["system_s"])
                  / (results["baseline"]["user_s"] + results["baseline"]["system_s"]), 4),
              "host_cpus": os.cpu_count(), "load_at_end": os.getloadavg(),
              "rusage_note": "user, system and peak RSS (KiB) of each job count the processes it waited for",
              "stage_s": {name: stages(out / name) for name in results},
              }
    if all(r["exit_status"] == 0 for r in results.values()):
        report["patterns"] = patterns(out / "new", out / "baseline")
    write_json(a.json, report)
    print(f"wall new/baseline = {ratio:.3f}; wrote {a.json}")


if __name__ == "__main__":
    main()
