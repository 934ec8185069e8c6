"""The README and the pages under docs/: every relative link resolves.

A link to a page must name a file of the repository, and a link to a heading
(`page.md#some-heading`) a heading of that page, with the anchor GitHub and
the documentation site both give it (lower case, punctuation dropped, spaces
as hyphens).
"""

import glob
import os
import re

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
