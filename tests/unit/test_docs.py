"""The README and the pages under docs/: links resolve, the API reference covers
every public name with its arguments, result and errors, and the site builds.

A link to a page must name a file of the repository, and a link to a heading
(`page.md#some-heading`) a heading of that page, with the anchor GitHub and
the documentation site both give it (lower case, punctuation dropped, spaces
as hyphens).
"""

import glob
import inspect
import os
import re
import subprocess
import sys
import textwrap

import pytest

from harness import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _pages():
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def _text(path):
    with open(path, encoding="utf-8") as f:
        return FENCE.sub("", f.read())


def slug(heading):
    """The anchor of a heading: GitHub's rule, which the site's parser follows too."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    return {slug(h) for h in HEADING.findall(_text(path))}


def broken_links(path):
    """(link, why) for every relative link of `path` that does not resolve."""
    broken = []
    for target in LINK.findall(_text(path)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            broken.append((target, "no such file"))
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            broken.append((target, f"no heading with the anchor #{anchor} in {os.path.relpath(dest, REPO)}"))
    return broken


def test_slug_follows_githubs_rule():
    assert slug("Running jobs and clusters") == "running-jobs-and-clusters"
    assert slug("Building against your cluster's MPI (Open MPI or the MPICH family)") == \
        "building-against-your-clusters-mpi-open-mpi-or-the-mpich-family"
    assert slug("`hvd.init` and `HOROVOD_*`") == "hvdinit-and-horovod"


def test_the_checker_finds_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n[ok](b.md#b-title) [bad](b.md#missing) [gone](c.md)\n"
                                   "```\n[in a code block](nowhere.md)\n```\n")
    (tmp_path / "b.md").write_text("# B title\n")
    assert broken_links(str(tmp_path / "a.md")) == [
        ("b.md#missing", f"no heading with the anchor #missing in {os.path.relpath(str(tmp_path / 'b.md'), REPO)}"),
        ("c.md", "no such file")]


def test_every_relative_link_resolves():
    broken = {os.path.relpath(p, REPO): b for p in _pages() for b in [broken_links(p)] if b}
    assert not broken, f"links that do not resolve: {broken}"


def test_the_readme_stays_short_and_links_the_pages():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert len(readme.splitlines()) <= 200, "README.md is the front page; put details in docs/"
    for page in ("concepts", "api", "running", "elastic", "environment", "troubleshooting", "gpus"):
        assert f"(docs/{page}.md)" in readme, f"README.md does not link docs/{page}.md"


# ---------------------------------------------------------------- the API reference

def _public():
    import hvdcompat
    return hvdcompat, list(hvdcompat.__all__)


def _documented_parameters(doc):
    """The names listed under the docstring's Args: section."""
    m = re.search(r"^Args:\n((?:[ \t]+.*\n|\n)+)", doc + "\n", re.M)
    if not m:
        return set()
    body = textwrap.dedent(m.group(1))
    entries = re.findall(r"^(\**\w+(?:, \**\w+)*)(?: \([^)]*\))?:", body, re.M)
    return {n.lstrip("*") for entry in entries for n in entry.split(", ")}


def docstring_gaps(obj):
    """What the docstring of a public function or class leaves out ([] when nothing)."""
    doc = inspect.getdoc(obj) or ""
    if not doc:
        return ["no docstring"]
    gaps = []
    try:
        params = [p.name for p in inspect.signature(obj).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        params = []
    missing = [p for p in params if p not in _documented_parameters(doc)]
    if missing:
        gaps.append(f"Args: does not describe {', '.join(missing)}")
    if inspect.isfunction(obj):
        if not re.search(r"^Returns:$", doc, re.M):
            gaps.append("no Returns: section")
        if not re.search(r"^Raises:$", doc, re.M) and not re.search(r"^Never raises", doc, re.M):
            gaps.append("no Raises: section (or a line 'Never raises.')")
    return gaps


def test_the_docstring_check_finds_what_is_missing():
    def documented(a, b=1):
        """Adds.

        Args:
            a: one.
            b: two.

        Returns:
            The sum.

        Raises:
            TypeError: not numbers.
        """

    def undocumented(a, b=1):
        """Adds.

        Args:
            a: one.
        """
    assert docstring_gaps(documented) == []
    assert docstring_gaps(undocumented) == [
        "Args: does not describe b", "no Returns: section",
        "no Raises: section (or a line 'Never raises.')"]


def test_every_public_function_documents_its_arguments_result_and_errors():
    hvd, names = _public()
    gaps = {n: g for n in names for g in [docstring_gaps(getattr(hvd, n))]
            if callable(getattr(hvd, n)) and g}
    assert not gaps, f"public names whose docstrings leave something out: {gaps}"


def test_every_public_name_is_in_the_api_reference():
    _, names = _public()
    with open(os.path.join(REPO, "docs", "api.md"), encoding="utf-8") as f:
        page = f.read()
    missing = [n for n in names if not re.search(rf"(hvdcompat|hvd)\.{re.escape(n)}\b", page)]
    assert not missing, f"docs/api.md does not document {missing}"


# ---------------------------------------------------------------- the site

def test_the_site_builds_without_warnings(tmp_path):
    """The documentation site, as a reader gets it: warnings (a broken link, a
    heading anchor that does not exist, a docstring autodoc cannot render) fail."""
    try:
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as e:
        pytest.fail(f"the docs build needs sphinx and myst-parser ({e}); they come with the test "
                    "extra: pip install -e '.[test]' (or pip install 'sphinx>=7' 'myst-parser>=2')")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
           os.path.join(REPO, "docs"), str(tmp_path / "html")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    _, names = _public()
    rendered = set(re.findall(r'id="hvdcompat\.(\w+)"', api))
    assert "allreduce" in rendered and "DistributedOptimizer" in rendered, sorted(rendered)
