"""The installed package is the one imported, from any working directory.

A clone of this repository is usually a folder named ``hvdcompat``. From the
folder that holds it, ``import hvdcompat`` must still find the real package,
not the clone as an empty namespace package. These tests check however
hvdcompat is installed in this environment (CI: the README's
``pip install -e '.[test]'``), as a fresh Python started outside the
repository sees it; they skip, saying why, when it is not installed.
"""

import json
import os
import subprocess
import sys
import urllib.parse

import pytest

# Run in a fresh interpreter: what `import hvdcompat` finds from its working
# directory, and how the installation that provides it is recorded.
_PROBE = r"""
import importlib.metadata, json, sys
out = {"file": None, "has_init": False, "direct_url": None, "pth": None}
try:
    dist = importlib.metadata.distribution("hvdcompat")
except importlib.metadata.PackageNotFoundError:
    dist = None
if dist is not None:
    out["direct_url"] = json.loads(dist.read_text("direct_url.json") or "null")
    out["pth"] = [line.strip() for f in dist.files or [] if str(f).endswith(".pth")
                  for line in dist.locate_file(f).read_text().splitlines() if line.strip()]
    out["location"] = str(dist.locate_file(""))
    import hvdcompat as hvd
    out["file"] = hvd.__file__
    out["has_init"] = callable(getattr(hvd, "init", None))
json.dump(out, sys.stdout)
"""


def _probe(cwd):
    # Without PYTHONPATH: an entry there would find the package by itself and
    # hide what the installation does.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"the import probe failed in {cwd}:\n{proc.stderr}"
    info = json.loads(proc.stdout)
    if info["pth"] is None:  # no distribution named hvdcompat
        pytest.skip("hvdcompat is not pip-installed here (tests run from PYTHONPATH); "
                    "these checks need `pip install -e .`")
    return info


def _editable_root(info):
    """The project directory of an editable install, else None."""
    url = info["direct_url"] or {}
    if not url.get("dir_info", {}).get("editable"):
        return None
    return os.path.realpath(urllib.parse.unquote(urllib.parse.urlparse(url["url"]).path))


def test_editable_install_is_a_path_entry(tmp_path):
    info = _probe(tmp_path)
    root = _editable_root(info)
    if root is None:
        pytest.skip("hvdcompat is installed as a regular wheel (site-packages is a path entry)")
    # An `import ...` line is setuptools' import hook instead: it runs after the
    # path search, so a folder named hvdcompat in the working directory wins.
    assert [os.path.realpath(line) for line in info["pth"]] == [root], (
        f"the editable install of {root} is {info['pth']!r} in a .pth file, not the path "
        f"entry {root!r}: it was made by an older setup.py; reinstall with `pip install -e .` "
        "from the repository")


def test_import_from_the_folder_holding_a_clone(tmp_path):
    (tmp_path / "hvdcompat").mkdir()  # what the clone looks like from its parent
    (tmp_path / "hvdcompat" / "README.md").write_text("not a package\n")
    info = _probe(tmp_path)
    assert info["file"] is not None, (
        f"from {tmp_path}, `import hvdcompat` found the folder {tmp_path / 'hvdcompat'} (a "
        "namespace package) instead of the installed package; reinstall with `pip install -e .`")
    root = _editable_root(info) or os.path.realpath(info["location"])
    assert os.path.realpath(info["file"]) == os.path.join(root, "hvdcompat", "__init__.py"), info
    assert info["has_init"], f"{info['file']} has no hvd.init"
