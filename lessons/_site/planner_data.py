"""MkDocs hook: the planner's presets and constants go into the calculator page when the site is built.

The page's planner (lessons/assets/calculator/planner.js) ports the formulas of `fsdp_mini.course.planner` and
restates none of its numbers: a page that contains `<!-- planner data -->` gets, in its place, a script that sets
`window.PLANNER_DATA` to `fsdp_mini.course.planner_site.site_data()` (model shapes, GPU specifications, the
fitted fractions, the named constants, the layout's defaults). Built from the code each time, it cannot go stale;
tests/site/test_site.py checks that the built page carries exactly `site_data()`.
"""
from __future__ import annotations

MARKER = "<!-- planner data -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    from fsdp_mini.course.planner_site import data_script

    return markdown.replace(MARKER, f'<script id="planner-data">{data_script()}</script>')
