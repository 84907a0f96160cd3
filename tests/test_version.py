"""The version users install and cite: written once (``ddp_utils.__version__``), read by the build, in the changelog."""

from __future__ import annotations

import json
import re
from importlib import metadata

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
    assert 'version = { attr = "ddp_utils.__version__" }' in pyproject


def test_the_build_reads_the_packages_version():
    expand = pytest.importorskip("setuptools.config.expand")  # what setuptools does with the dynamic version
    assert expand.read_attr("ddp_utils.__version__", root_dir=str(REPO_ROOT)) == ddp_utils.__version__


def test_the_changelog_names_this_version_as_the_latest_release():
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", changelog, re.M)
    assert headings[0] == "Unreleased"  # what the next version will hold, written as it lands
    released = [h.split()[0] for h in headings[1:]]
    assert released and released[0] == ddp_utils.__version__, released


def test_an_install_of_this_checkout_reports_the_same_version():
    try:
        dist = metadata.distribution("ddp_utils")
    except metadata.PackageNotFoundError:
        pytest.skip("ddp_utils is not installed here (imported from the checkout)")
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("url") != REPO_ROOT.as_uri():
        pytest.skip(f"the installed ddp_utils comes from {direct.get('url')}, not this checkout")
    assert dist.version == ddp_utils.__version__
