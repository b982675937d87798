"""One self-contained HTML report, viewable offline.

* :mod:`.html`: the section types (``Markdown``, ``Table``, ``Figure``, ...) and ``write_report``;
* :mod:`.from_study`: ``gather-aggregate report STUDY`` and ``study_report(study)``, from a study folder's results;
* :mod:`.from_results`: the report of loose result files (written before study folders);
* :mod:`.demo_story`: the demo's report, which tells each model's Gather-and-Aggregate story.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "Markdown": "gather_aggregate.report.html",
    "Text": "gather_aggregate.report.html",
    "Table": "gather_aggregate.report.html",
    "Figure": "gather_aggregate.report.html",
    "Attention": "gather_aggregate.report.html",
    "KeyValues": "gather_aggregate.report.html",
    "Html": "gather_aggregate.report.html",
    "Section": "gather_aggregate.report.html",
    "SECTION_TYPES": "gather_aggregate.report.html",
    "as_section": "gather_aggregate.report.html",
    "markdown_to_html": "gather_aggregate.report.html",
    "render_report": "gather_aggregate.report.html",
    "write_report": "gather_aggregate.report.html",
    "study_report": "gather_aggregate.report.from_study",
    "write_study_report": "gather_aggregate.report.from_study",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
