"""The version users install and cite: written once (``ddp_utils/version.py``, re-exported as
``ddp_utils.__version__``), read by the build without importing the package, in the changelog."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest

import ddp_utils

from .multiproc import REPO_ROOT

RELEASE = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?$")  # PEP 440's plain releases and pre-releases


def test_the_version_is_a_release_number_written_once():
    assert RELEASE.match(ddp_utils.__version__), ddp_utils.__version__
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    project = pyproject[pyproject.index("[project]\n") :].split("\n[", 1)[0]
    assert re.search(r'^dynamic = \["version"\]', project, re.M)
    assert not re.search(r"^version\s*=", project, re.M), "a second version in pyproject.toml's [project]"
    assert 'version = { attr = "ddp_utils.version.__version__" }' in pyproject
    written = [p for p in (REPO_ROOT / "ddp_utils").rglob("*.py") if re.search(r"^__version__ = ", p.read_text(), re.M)]
    assert written == [REPO_ROOT / "ddp_utils" / "version.py"], written


def test_the_build_reads_the_packages_version():
    expand = pytest.importorskip("setuptools.config.expand")  # what setuptools does with the dynamic version
    assert expand.read_attr("ddp_utils.version.__version__", root_dir=str(REPO_ROOT)) == ddp_utils.__version__


def test_the_changelog_names_this_version_as_the_latest_release():
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", changelog, re.M)
    assert headings[0] == "Unreleased"  # what the next version will hold, written as it lands
    released = [h.split()[0] for h in headings[1:]]
    assert released and released[0] == ddp_utils.__version__, released


def checkout_installs(root: Path = REPO_ROOT) -> dict[str, str]:
    """Where this checkout is installed (``pip install -e ".[dev]"``, ``pip install .``): each metadata of it on
    sys.path, by location, with its version.

    Every ``ddp_utils`` metadata is looked at, not only the first: an editable install writes
    ``ddp_utils.egg-info`` into the checkout, and from the checkout (the README's ``python -m pytest``) that one
    comes first on sys.path, before the install's dist-info whose ``direct_url.json`` names the checkout.
    """
    found = {}
    for dist in metadata.distributions(name="ddp_utils"):
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        home = Path(str(dist.locate_file(""))).resolve()  # the directory holding the metadata
        if direct.get("url") == root.as_uri() or home == root.resolve():
            found[str(home)] = dist.version
    return found


def test_an_install_of_this_checkout_reports_the_same_version():
    installs = checkout_installs()
    if not installs:
        pytest.skip("this checkout is not installed here (ddp_utils imported from it, or installed from elsewhere)")
    assert set(installs.values()) == {ddp_utils.__version__}, f"reinstall (pip install -e .): {installs}"


def test_a_stale_egg_info_in_the_checkout_is_found_and_would_fail_the_install_check(tmp_path, monkeypatch):
    """Positive control: the egg-info an editable install leaves in a checkout counts as that checkout's install
    (it hid the install's dist-info, and the check skipped), so an old version there is caught."""
    info = tmp_path / "ddp_utils.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: ddp_utils\nVersion: 0.0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert checkout_installs(tmp_path) == {str(tmp_path.resolve()): "0.0.1"}
    assert ddp_utils.__version__ != "0.0.1"  # so the install check would fail here: reinstall
