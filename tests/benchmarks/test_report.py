"""docs/performance.md is what benchmarks/results/*.json render: no figure on that page without its result file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import report


def test_the_committed_page_is_what_the_committed_results_render() -> None:
    # after a benchmark run, `python -m benchmarks.report` (the last step of `make bench`) brings the page along
    assert report.render() == report.PAGE.read_text()


def test_there_is_one_result_file_per_benchmark_and_no_other() -> None:
    names = {path.stem for path in report.RESULTS.glob("*.json")}
    assert names == set(report.RENDERERS) | report.NOT_RENDERED


def test_a_figure_on_the_page_follows_its_result_file(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS, results)
    path = results / "backbone.json"
    backbone = json.loads(path.read_text())
    backbone["decode"]["float32/1"]["sia_over_dot"] = 0.123
    path.write_text(json.dumps(backbone))
    page = report.render(results)
    assert "| SmolLM2 float32, 1 row: decode with state >= 0.9x state off | 0.12x | missed (0.78x below) |" in page
    assert "| float32 | 1 |" in page and "| 0.12 |" in page
    assert page != report.render()


def test_a_placeholder_that_no_benchmark_renders_is_refused(tmp_path: Path) -> None:
    template = tmp_path / "page.md"
    template.write_text("# Performance\n\n{{ backbone }}\n\n{{ latency }}\n")
    with pytest.raises(ValueError, match="latency"):
        report.render(template=template)


def test_check_reports_a_page_that_differs(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    page.write_text(report.render() + "a hand-edited figure\n")
    assert report.main(["--check", "--out", str(page)]) == 1
    page.write_text(report.render())
    assert report.main(["--check", "--out", str(page)]) == 0
