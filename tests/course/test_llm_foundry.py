"""llm-foundry's MPT table on A100 80 GB: held out, shown whole on the planner's page, its figures held.

Nothing was fitted on these rows (`fsdp_mini.course.planner.llm_foundry`); the bounds are the planner's figures
as they stand, so that a change that makes them worse fails here, and one that makes them better updates them.
"""
from pathlib import Path

import pytest

from fsdp_mini.course.planner import llm_foundry as foundry

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_has_every_row_of_the_published_one():
    rows = foundry.A100_80GB_ROWS
    assert len(rows) == 61
    assert {r.size for r in rows} == set(foundry.MPT_SHAPES)
    # the global batch the README prints is MicroBatchSize x GradAccum x GPUs: 2,048 sequences for 70B on 64 GPUs
    assert next(r for r in rows if r.size == "70b" and r.gpus == 64).layout().local_batch * 64 == 2048


@pytest.mark.parametrize("row", foundry.A100_80GB_ROWS, ids=lambda r: f"{r.size}-{r.seq}-{r.micro_batch}")
def test_each_models_parameters_are_the_published_num_params(row):
    # within 0.2 % (the published count is 0.01-0.08 % higher: what the planner's LayerNorms leave out)
    assert abs(foundry.mpt(row.size, row.seq).params / row.num_params - 1) < 0.002


def test_the_planner_holds_its_documented_figures_on_them():
    s = foundry.summary()
    bounds = foundry.FOUNDRY_BOUNDS
    assert s["median |error|"] <= bounds["median |error|"]
    assert s["rows within 25 %"] >= bounds["rows within 25 %"]
    assert s["rows predicted to fit"] >= bounds["rows predicted to fit"]
    # where the error comes from: rows where attention is a third of the FLOPs or more
    assert s["median |error|, attention a third or more"] > 4 * s["median |error|, attention under a third"]


def test_the_planners_page_shows_every_row_and_the_summary():
    for language in ("en", "ru"):
        page = (ROOT / "lessons" / language / "planner.md").read_text(encoding="utf-8")
        assert foundry.table(language=language) in page, f"run python -m fsdp_mini.course.planner.validation"
        assert foundry.summary_line(language) in page


def test_the_russian_summary_agrees_in_number():
    import re

    from fsdp_mini.course.language import get_language, plural, set_language
    text = foundry.summary_line("ru")
    counted = re.findall(r"(\d+) (строк\w*)", text)
    assert len(counted) == 3  # the rows within 25 %, and the two groups by attention's share
    previous = get_language()
    set_language("ru")
    try:
        assert all(word == plural(int(n), "строка", "строки", "строк") for n, word in counted), counted
    finally:
        set_language(previous)
