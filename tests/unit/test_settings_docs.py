"""Every settings table in docs/ is generated from its dataclass's documented fields, and is current."""
from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_settings_tables_are_current():
    tables = runpy.run_path(str(ROOT / "scripts" / "settings_tables.py"))
    stale = [doc.name for doc in sorted((ROOT / "docs").glob("*.md")) if tables["filled"](doc.read_text()) != doc.read_text()]
    assert not stale, f"settings tables out of date in {stale}: run `make docs`"


def test_the_controller_settings_are_in_its_doc():
    assert "<!-- settings: controller.config:ControllerConfig -->" in (ROOT / "docs" / "controller.md").read_text()
