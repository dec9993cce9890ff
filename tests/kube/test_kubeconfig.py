"""Where the cluster configuration comes from and its start-up check (kube/kubeconfig.py, #32 5e)."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.errors import ConfigError
from koordqos.kube.kubeconfig import KubeSource, check_source, find_source
from tests.support.fake_apiserver import FakeAPIServer

CLUSTER = "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
CONTEXT = "contexts: [{name: x, context: {cluster: c, user: u}}]\n"


def test_the_flag_then_kubeconfig_then_home_then_in_cluster(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    env = {"HOME": str(home), "KUBECONFIG": f"{tmp_path}/a:{tmp_path}/b"}
    assert find_source("/flag", env) == KubeSource("--kubeconfig", (Path("/flag"),))
    assert find_source(None, env) == KubeSource("KUBECONFIG", (tmp_path / "a", tmp_path / "b"))
    del env["KUBECONFIG"]
    assert find_source(None, env) is None  # no ~/.kube/config, no service account: local mode
    (home / ".kube" / "config").mkdir()  # a directory is found (and refused by the check), not skipped
    assert find_source(None, env) == KubeSource("~/.kube/config", (home / ".kube" / "config",))


def test_a_kubeconfig_list_skips_missing_files_and_the_first_setting_wins(tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.write_text("current-context: x\n" + CONTEXT)
    second = tmp_path / "second"
    second.write_text(
        "current-context: other\n" + CLUSTER + "contexts: [{name: x, context: {cluster: gone}}]\n"
    )
    source = KubeSource("KUBECONFIG", (tmp_path / "missing", first, second))
    check_source(source)  # x from the first file, its cluster c from the second
    assert source.kubeconfig == f"{tmp_path / 'missing'}:{first}:{second}"  # the loader merges the same files


def test_a_kubeconfig_list_of_missing_files_is_an_error(tmp_path: Path) -> None:
    source = KubeSource("KUBECONFIG", (tmp_path / "a", tmp_path / "b"))
    with pytest.raises(ConfigError, match=r"^KUBECONFIG .*/a:.*/b: none of its files exists$"):
        check_source(source)


def test_a_broken_file_in_a_list_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("current-context: x\n" + CONTEXT + CLUSTER)
    bad = tmp_path / "bad"
    bad.write_text("{")
    source = KubeSource("KUBECONFIG", (good, bad))
    with pytest.raises(ConfigError, match=rf"^KUBECONFIG {good}:{bad}: {bad}: not valid YAML at line 1: "):
        check_source(source)


def test_a_context_naming_an_absent_cluster(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    kc.write_text("current-context: x\n" + CONTEXT)
    with pytest.raises(ConfigError, match=r"context 'x' names cluster 'c', which is not among its clusters"):
        check_source(KubeSource("--kubeconfig", (kc,)))


def test_the_fake_api_servers_kubeconfig_passes(tmp_path: Path) -> None:
    api = FakeAPIServer()
    check_source(KubeSource("--kubeconfig", (api.write_kubeconfig(tmp_path / "kc"),)))
    check_source(KubeSource("in-cluster"))  # nothing to read: the loader checks the service account
