"""The documentation stays true: the user guide's code runs, the README is a short front door
whose links resolve, and code comments that point at the performance page name its headings.

Every ```python block of the README and of a page under ``docs/`` runs, in order, in one fresh
process per page,
in an empty directory (pages make the small files they read). A block that cannot run here
(it needs a GPU, a cluster or a bucket) says so in its fence: ```python skip <why>.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT, subprocess_env

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"
PAGES = sorted(
    p for p in DOCS.rglob("*.md") if not ({"_build", "_moved"} & set(p.relative_to(DOCS).parts))
)
FENCE = re.compile(r"^(?P<fence>`{3,})(?P<info>.*)$")


def code_blocks(page: Path) -> list[tuple[int, str, str]]:
    """``(first line, info string, code)`` of every fenced block of ``page`` (1-based lines)."""
    blocks: list[tuple[int, str, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m["fence"], m["info"].strip(), i + 1
        i += 1
        while i < len(lines) and lines[i].rstrip() != fence:
            i += 1
        blocks.append((start + 1, info, "\n".join(lines[start:i])))
        i += 1
    return blocks


def python_blocks(page: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The page's ```python blocks to run, as ``(line, code)``, and those marked ``skip``, as
    ``(line, why)``."""
    run: list[tuple[int, str]] = []
    skipped: list[tuple[int, str]] = []
    for line, info, code in code_blocks(page):
        words = info.split(maxsplit=2)
        if not words or words[0] != "python":
            continue
        if len(words) > 1 and words[1] == "skip":
            skipped.append((line, words[2] if len(words) > 2 else ""))
        else:
            run.append((line, code))
    return run, skipped


RUNNER = """\
import sys
page, blocks = sys.argv[1], {blocks!r}
namespace = {{"__name__": "__main__"}}
for line, code in blocks:
    # Padded so that a traceback names the page's own line numbers.
    exec(compile("\\n" * (line - 1) + code, page, "exec"), namespace)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [p for p in [README, *PAGES] if python_blocks(p)[0]],
    ids=lambda p: str(p.relative_to(REPO_ROOT)),
)
def test_the_python_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    blocks, _ = python_blocks(page)
    script = tmp_path / "run_blocks.py"
    script.write_text(RUNNER.format(blocks=blocks))
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, str(script), str(page)],
        cwd=work,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def test_blocks_that_do_not_run_say_why() -> None:
    for page in PAGES:
        for line, why in python_blocks(page)[1]:
            assert len(why.split()) >= 2, f"{page}:{line}: write ```python skip <why it cannot run>"


def test_the_fence_parser_finds_run_and_skipped_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# T\n\n```python\nx = 1\n```\n\n````text\n```python\nno\n```\n````\n\n"
        "```python skip needs a GPU\ny = 2\n```\n\n```bash\nls\n```\n"
    )
    assert python_blocks(page) == ([(4, "x = 1")], [(14, "needs a GPU")])


# -- the README -----------------------------------------------------------------------------------
def test_the_readme_is_a_short_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120
    # The two set-up commands, unchanged, and the one that builds these pages.
    assert 'python -m pip install -e ".[test]" && python examples/demo.py' in text
    # The test command, the one CI runs.
    assert "\npython -m pytest -n auto\n" in text
    assert "\npython -m pytest -n auto\n" in (REPO_ROOT / ".ci" / "run").read_text()
    assert (
        'python -m pip install -e ".[docs]" && python -m sphinx -W -b html docs docs/_build/html'
        in text
    )
    for needed in ("from_arrays", "model.fit", "af.batches", "arrayfeed convert", "performance.md"):
        assert needed in text, needed


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or a heading of the same page (checked by the strict build)
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{page.relative_to(REPO_ROOT)}: broken link {target}"


# -- pointers from the code to the performance page ---------------------------------------------
POINTER = re.compile(r"docs/performance\.md,\s*[\"']([^\"']+)[\"']")


def performance_pointers() -> list[tuple[str, str]]:
    """``(file, topic)`` of every ``docs/performance.md, "<topic>"`` in code and benchmarks
    (a topic may run over a comment's line break)."""
    found = []
    for path in sorted([*REPO_ROOT.glob("arrayfeed/**/*.py"), *REPO_ROOT.glob("benchmarks/*.py")]):
        text = path.read_text(encoding="utf-8")
        # Comment markers at the start of continued lines are not part of the topic.
        joined = re.sub(r"\n\s*(?:#:?\s*)?", " ", text)
        for m in POINTER.finditer(joined):
            found.append((str(path.relative_to(REPO_ROOT)), " ".join(m[1].split())))
    return found


def test_code_pointers_name_headings_of_the_performance_page() -> None:
    headings = {
        " ".join(m[1].split())
        for m in re.finditer(r"^#+\s+(.+?)\s*$", (DOCS / "performance.md").read_text(), re.M)
    }
    pointers = performance_pointers()
    assert len(pointers) >= 10
    missing = [f"{where}: {topic!r}" for where, topic in pointers if topic not in headings]
    assert not missing, "no such heading in docs/performance.md:\n" + "\n".join(missing)


def test_each_topic_the_code_points_at_names_its_machine() -> None:
    """A measurement without its machine cannot be checked again: every section the code points
    at names the machine it was measured on (one of those the page's Methods describe)."""
    text = (DOCS / "performance.md").read_text()
    sections = dict(
        (" ".join(m[1].split()), m[2])
        for m in re.finditer(r"^#+\s+(.+?)\s*\n(.*?)(?=^#|\Z)", text, re.M | re.S)
    )
    for where, topic in performance_pointers():
        body = sections.get(topic, "")
        assert re.search(r"dev-2-cores|gpu-host-16-cores|not measured", body), (
            f"{where}: docs/performance.md, {topic!r} names no machine"
        )
