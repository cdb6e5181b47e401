"""The README and docs/ stand on their own: the quick start is the example file, links resolve,
and nothing points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUICKSTART_INTRO = "`examples/quickstart.py` is this"
# Spelled in two parts so that this file does not match itself.
OUTSIDE_REFERENCES = ("../" + "shared", "/work/" + "shared")
SKIPPED_DIRECTORIES = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache",
                       ".pytest_cache", ".hypothesis", "build", "dist", ".standalone"}  # fmt: skip


def readme_quickstart() -> str:
    """The README's python block that follows the quick start's introduction."""
    readme = (REPO / "README.md").read_text()
    intro = readme.index(QUICKSTART_INTRO)
    match = re.compile(r"```python\n(.*?)```\n", re.DOTALL).search(readme, intro)
    assert match is not None, "no python block after the quick start's introduction"
    return match.group(1)


def test_the_readme_quickstart_is_the_example_file() -> None:
    assert readme_quickstart() == (REPO / "examples" / "quickstart.py").read_text()


def _repository_files() -> list[Path]:
    files = []
    for path in REPO.rglob("*"):
        relative = path.relative_to(REPO)
        if any(
            part in SKIPPED_DIRECTORIES or part.endswith(".egg-info") for part in relative.parts
        ):
            continue
        if path.is_file() and path.suffix not in {".png", ".pyc", ".db", ".whl"}:
            files.append(path)
    return files


def test_nothing_in_the_repository_points_outside_it() -> None:
    offenders: list[str] = []
    for path in _repository_files():
        try:
            text = path.read_text(errors="ignore")
        except OSError:
            continue
        offenders.extend(
            f"{path.relative_to(REPO)}: {reference}"
            for reference in OUTSIDE_REFERENCES
            if reference in text
        )
    assert offenders == []


def test_relative_links_in_the_readme_and_docs_resolve() -> None:
    broken: list[str] = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []


def test_the_docs_cover_architecture_api_and_deployment() -> None:
    for name in ("architecture.md", "api.md", "deployment.md"):
        assert (REPO / "docs" / name).stat().st_size > 2000, name
