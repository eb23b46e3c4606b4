"""Links the pages point at exist: every relative `[text](target)` of the README, benchmarks/README.md,
models/README.md and docs/ names a file of the repository, and its `#anchor`, where it has one, is a
heading of that file as GitHub names it (lowercase, punctuation dropped, spaces as hyphens, a repeated
heading numbered). The README links each figure to its benchmark's section; a renamed section is what
this catches."""

import functools
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [
    "README.md",
    "benchmarks/README.md",
    "models/README.md",
    *sorted(glob.glob("docs/*.md", root_dir=ROOT)),
]


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown text (headings inside ``` blocks are code)."""
    anchors, seen, in_code = set(), {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            repeats = seen.get(slug, 0)
            seen[slug] = repeats + 1
            anchors.add(f"{slug}-{repeats}" if repeats else slug)
    return anchors


@functools.cache
def page_anchors(path: str) -> frozenset[str]:
    return frozenset(heading_anchors(open(path, encoding="utf-8").read()))


def broken_links(page: str, text: str) -> list[str]:
    """`page: target` for each relative link of the text whose file or anchor does not exist."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https://, mailto: and the like are not the repository's
            continue
        file, _, anchor = target.partition("#")
        path = (
            os.path.normpath(os.path.join(ROOT, os.path.dirname(page), file))
            if file
            else os.path.join(ROOT, page)
        )
        if not os.path.exists(path):
            broken.append(f"{page}: {target}")
        elif anchor and path.endswith(".md") and anchor not in page_anchors(path):
            broken.append(f"{page}: {target}")
    return broken


def test_every_link_of_the_pages_reaches_a_file_and_its_heading():
    broken = []
    for page in PAGES:
        broken += broken_links(page, open(os.path.join(ROOT, page), encoding="utf-8").read())
    assert broken == []


def test_a_stale_link_is_caught():
    """The check can fail: a section renamed, a file moved away; a heading's punctuation is dropped."""
    text = (
        "[a](benchmarks/README.md#bench_sampler) [b](benchmarks/README.md#no-such-section) [c](docs/gone.md)"
    )
    assert broken_links("README.md", text) == [
        "README.md: benchmarks/README.md#no-such-section",
        "README.md: docs/gone.md",
    ]
    assert heading_anchors("## The suite's time\n## History\n### History\n```\n# code\n```") == {
        "the-suites-time",
        "history",
        "history-1",
    }
