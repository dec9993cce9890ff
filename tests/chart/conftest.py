"""Fixtures: the chart loaded once, and its renderings with default and non-default values."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python as helm
import pytest

from .chart_render import CHART_DIR, NON_DEFAULT_VALUES, Rendered, render


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    """The chart, loaded once by the Helm engine."""
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def default_render(chart: helm.Chart) -> Rendered:
    """The chart rendered with its default values."""
    return render(chart)


@pytest.fixture(scope="session")
def custom_render(chart: helm.Chart) -> Rendered:
    """The chart rendered with NON_DEFAULT_VALUES."""
    return render(chart, NON_DEFAULT_VALUES)


@pytest.fixture(params=["default", "non-default"])
def any_render(request: pytest.FixtureRequest, default_render: Rendered, custom_render: Rendered) -> Rendered:
    """Each of the two renderings in turn."""
    return default_render if request.param == "default" else custom_render
