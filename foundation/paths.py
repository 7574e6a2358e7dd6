"""Where the project's deployment files are: ``deploy/`` beside the packages, or ``ROLLOUTBUS_DEPLOY_DIR``."""

from __future__ import annotations

import os
from pathlib import Path

DEPLOY_DIR = Path(os.environ.get("ROLLOUTBUS_DEPLOY_DIR") or Path(__file__).resolve().parents[1] / "deploy")

__all__ = ["DEPLOY_DIR"]
