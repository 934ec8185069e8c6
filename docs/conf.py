"""Sphinx configuration of the documentation site.

Build it with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
(tests/unit/test_docs.py does the same, warnings as errors). The pages are
Markdown (MyST); the API reference (api.md) is generated from the docstrings
of hvdcompat's public names, so the package must be importable (installed).
"""

project = "hvdcompat"
author = "the hvdcompat authors"
copyright = "the hvdcompat authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the docstrings' Args:/Returns:/Raises: sections
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# `[text](page.md#some-heading)` links resolve to headings of levels 1-4; an
# unknown page or heading is a warning, so an error in the test's build.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "none"        # the docstrings say what each argument takes
autodoc_preserve_defaults = True  # show `process_set=global_process_set`, not its repr
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = "hvdcompat"
html_show_sourcelink = False
