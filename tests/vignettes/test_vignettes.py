"""The vignettes run end to end in their quick mode and write what they promise; their committed
renders exist and link only to images that exist.

The scripts run as plain Python (no Jupyter needed); rendering is ``python vignettes/render.py``.
"""

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
VIGNETTES_DIR = ROOT / "vignettes"


def _render_module():
    spec = importlib.util.spec_from_file_location("vignette_render", VIGNETTES_DIR / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VIGNETTES = _render_module().VIGNETTES

# What each vignette writes in quick mode (under --out-dir).
OUTPUTS = {
    "getting_started": ["figures/getting_started_forest_quick.png", "figures/getting_started_trace_quick.png",
                        "results/getting_started_compare_quick.csv"],
    "toenail": ["figures/toenail_ber_quick.png", "results/toenail_ber_quick.csv", "results/toenail_ber_quick.md"],
    "spam_selection": ["figures/spam_inclusion_quick.png", "figures/spam_elbo_quick.png",
                       "results/spam_inclusion_quick.csv"],
    "acath_missing": ["figures/acath_ber_quick.png", "results/acath_ber_quick.csv", "results/acath_ber_quick.md"],
    "gp_raetsch": ["figures/gp_heart_trace_quick.png", "figures/gp_raetsch_quick.png",
                   "results/gp_raetsch_quick.json"],
    "gp_autotune": ["figures/gp_autotune_quick.png", "results/gp_autotune_quick.json"],
}


def test_every_vignette_is_listed():
    scripts = {p.stem for p in VIGNETTES_DIR.glob("*.py") if p.stem not in ("render", "_vignette", "conf")}
    assert scripts == set(VIGNETTES) == set(OUTPUTS)


def _check_contents(name, out, stdout):
    if name == "getting_started":
        table = pd.read_csv(out / "results/getting_started_compare_quick.csv", index_col=0)
        assert "beta[time:terbinafine]" in table.index and table["vb_accuracy"].between(0, 100).all()
        assert "prob_vb" in stdout and "sigma2_patient_id" in stdout
    elif name == "toenail":
        table = pd.read_csv(out / "results/toenail_ber_quick.csv")
        assert set(table["method"]) == {"svm_grid", "svm_balanced", "vb", "gibbs"}
        assert table["ber"].between(0, 1).all() and (table["seconds"] > 0).all()
        mean = table.groupby("method")["ber"].mean()
        # the random-intercept models use the patient effects the linear SVMs cannot see
        assert mean["vb"] < mean["svm_balanced"] and mean["gibbs"] < mean["svm_balanced"]
        assert "| random intercept VB |" in stdout and "Paper (Luts & Ormerod 2014, Figure 2)" in stdout
    elif name == "spam_selection":
        table = pd.read_csv(out / "results/spam_inclusion_quick.csv", index_col=0)
        assert len(table) == 57
        assert table[["p_include_meanfield", "p_include_vb", "p_include_gibbs"]].stack().between(0, 1).all()
    elif name == "acath_missing":
        table = pd.read_csv(out / "results/acath_ber_quick.csv")
        assert len(table) == 2
        methods = ["SVM-CC", "VB-CC", "VB-cond", "Gibbs-cond", "VB-joint", "Gibbs-joint"]
        assert table[methods].stack().between(0, 1).all()
    elif name == "gp_raetsch":
        results = json.loads((out / "results/gp_raetsch_quick.json").read_text())["results"]
        assert {"svi", "vb", "svc"} <= set(results["heart"])
        assert 0 <= results["heart"]["svi"]["error"] < 0.5
    elif name == "gp_autotune":
        result = json.loads((out / "results/gp_autotune_quick.json").read_text())
        assert len(result["grid"]) == 3 and result["auto_lengthscale"] > 0 and 0 <= result["auto_error"] < 0.5


@pytest.mark.parametrize("name", VIGNETTES)
@pytest.mark.slow
def test_vignette_quick(name, tmp_path):
    start = time.perf_counter()
    res = subprocess.run([sys.executable, str(VIGNETTES_DIR / f"{name}.py"), "--quick", "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    assert res.returncode == 0, res.stderr[-3000:]
    for rel in OUTPUTS[name]:
        path = tmp_path / rel
        assert path.is_file() and path.stat().st_size > 0, f"{name} --quick did not write {rel}"
        if path.suffix == ".png":
            assert path.read_bytes()[:4] == b"\x89PNG"
    _check_contents(name, tmp_path, res.stdout)
    print(f"{name} --quick: {elapsed:.1f} s")


@pytest.mark.parametrize("name", VIGNETTES)
def test_vignette_rendered(name):
    """The committed render exists, shows figures, and every image it links exists."""
    doc = VIGNETTES_DIR / "rendered" / f"{name}.md"
    assert doc.is_file(), f"no rendered document: run  python vignettes/render.py {name}"
    text = doc.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert images, f"{doc.name} shows no figure"
    for link in images:
        assert (doc.parent / link).is_file(), f"{doc.name} links to a missing image {link}"
    assert text.startswith("*Rendered from") and f"vignettes/{name}.py" in text
