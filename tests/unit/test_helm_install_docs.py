"""The docs' first page says how to get Helm (today only the testing section named `make k8s-tools`), and the
Makefile target it names puts helm where the page says."""

from __future__ import annotations

import re

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("page", ["getting-started.md", "kubernetes.md"])
def test_the_page_says_how_to_get_helm_before_it_is_used(page):
    text = (REPO / "docs" / page).read_text()
    told = text.find("make k8s-tools")
    assert told >= 0 and ".tools/bin" in text, f"docs/{page} does not say how to get helm"
    used = text.find("helm install")
    assert used < 0 or told < used, f"docs/{page} uses helm before saying how to get it"


def test_make_k8s_tools_puts_helm_in_the_folder_the_docs_name():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^TOOLS := \.tools/bin$", makefile, re.M)
    assert re.search(r"^k8s-tools: \$\(TOOLS\)/helm$", makefile, re.M)
