"""The documents lead where they say: every relative link in README.md and the pages under docs/ reaches a
file, and a link to a heading (``page.md#heading``) reaches a heading that page has; every ``docs/...md`` path
named in the repository's text (pages, docstrings, comments, error messages) exists; and README.md shows its
two commands on its first screen."""
import os
import re
from glob import glob

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(["README.md", "benchmarks/README.md",
                *(os.path.relpath(p, ROOT) for p in glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
NAMED = re.compile(r"(?<![\w/.])docs/[\w./-]*\w\.md\b")
TEXT = (".py", ".md", ".cpp", ".h", ".sh", ".yaml", ".json", ".toml", ".cfg", ".ini", ".sbatch")
FIRST_SCREEN = 40
README_COMMANDS = ["bash scripts/install.sh && bash scripts/demo.sh",
                   "bash scripts/install.sh && python3 -m pytest -q tests"]


def _prose(path: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    with open(os.path.join(ROOT, path)) as fh:
        for line in fh.read().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                lines.append(line)
    return lines


def anchors(path: str) -> set[str]:
    """The page's heading anchors as GitHub makes them (lower case, punctuation dropped, spaces to hyphens, a
    repeated one numbered) and its ``<a id="...">`` anchors."""
    found, seen = set(), {}
    for line in _prose(path):
        found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_the_slugs_are_githubs():
    assert re.sub(r"[^\w\- ]", "", "Pictures - `plot` and `lsm-gnn plot`".lower()).replace(" ", "-") == \
        "pictures---plot-and-lsm-gnn-plot"


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for line in _prose(page):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, heading = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(ROOT, resolved)):
                broken.append(f"{target}: no {resolved}")
            elif heading and heading not in anchors(resolved):
                broken.append(f"{target}: {resolved} has no heading #{heading}")
    assert not broken, f"{page}: broken links\n" + "\n".join(broken)


def test_every_docs_path_named_in_the_repository_exists():
    missing = []
    for top in ("README.md", "docs", "lsm_gnn", "benchmarks", "tests", "csrc", "scripts", "launch", "configs"):
        start = os.path.join(ROOT, top)
        files = [start] if os.path.isfile(start) else [os.path.join(d, f) for d, _, names in os.walk(start)
                                                        for f in names if f.endswith(TEXT)]
        for file in files:
            with open(file, errors="replace") as fh:
                for number, line in enumerate(fh, 1):
                    missing += [f"{os.path.relpath(file, ROOT)}:{number}: {name}" for name in NAMED.findall(line)
                                if not os.path.exists(os.path.join(ROOT, name))]
    assert not missing, "paths to documents that do not exist:\n" + "\n".join(missing)


def test_the_readme_shows_its_two_commands_on_the_first_screen():
    with open(os.path.join(ROOT, "README.md")) as fh:
        first_screen = fh.read().splitlines()[:FIRST_SCREEN]
    for command in README_COMMANDS:
        assert command in first_screen, f"README.md: '{command}' is not a line of its first {FIRST_SCREEN} lines"
