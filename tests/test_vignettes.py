"""The vignettes run end to end in their quick mode and write what they promise."""

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def test_toenail_vignette_quick(tmp_path):
    start = time.perf_counter()
    script = ROOT / "vignettes" / "toenail.py"
    res = subprocess.run([sys.executable, str(script), "--quick", "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    assert res.returncode == 0, res.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results" / "toenail_ber_quick.csv")
    assert (tmp_path / "figures" / "toenail_ber_quick.png").read_bytes()[:4] == b"\x89PNG"
    assert set(table["method"]) == {"svm_grid", "svm_balanced", "vb", "gibbs"}
    assert table.groupby("method").size().eq(5).all()
    assert table["ber"].between(0, 1).all() and (table["seconds"] > 0).all()
    mean = table.groupby("method")["ber"].mean()
    # the random-intercept models use the patient effects the linear SVMs cannot see
    assert mean["vb"] < mean["svm_balanced"] and mean["gibbs"] < mean["svm_balanced"]
    out = res.stdout
    assert "| random intercept VB |" in out and "Paper (Luts & Ormerod 2014, Figure 2)" in out
    assert "mean fit time" in out
    print(f"toenail vignette --quick: {elapsed:.1f} s")
