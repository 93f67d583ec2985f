"""Where RouterLab's shipped files live (the repository's `assets/` folder), in one place."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # routerlab/core/base/paths.py
ASSETS = ROOT / "assets"
