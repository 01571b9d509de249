"""The pytest plugin (``dreamlake.lakeshore.testing``) as a user meets it: a test file
of theirs run by pytest, with the fixtures coming from the installed entry point."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.timeout(180)

USER_TESTS = """
import threading

import pytest

import dreamlake.lakeshore as dls


def double(x):
    return 2 * x


def test_embedded_plane_and_workers(lakeshore_plane, lakeshore_worker):
    q = dls.SyncQueue("doubles", dispatch=lakeshore_plane)
    group = lakeshore_worker(q, count=2)
    ids = [q.submit(double, i) for i in range(10)]
    assert [q.result(i, timeout=30) for i in ids] == [2 * i for i in range(10)]
    assert len(group.threads) == 2


def test_a_name_runs_on_the_embedded_plane(lakeshore_worker, lakeshore_plane):
    # the worker fixture is set up first here; teardown still stops it before the plane
    lakeshore_worker("by-name")
    q = dls.SyncQueue("by-name", dispatch=lakeshore_plane)
    assert q.result(q.submit(double, 21), timeout=30) == 42


def test_served_plane_with_tokens(lakeshore_server, lakeshore_worker):
    assert lakeshore_server.url.startswith("http://127.0.0.1:")
    assert lakeshore_server.admin_token.startswith("lks_")
    producer = lakeshore_server.dispatch("producer", queues=["remote-*"])
    worker = lakeshore_server.dispatch(role="worker", queues=["remote-*"])
    lakeshore_worker("remote-doubles", dispatch=worker)
    q = dls.SyncQueue("remote-doubles", dispatch=producer)
    assert q.result(q.submit(double, 5), timeout=30) == 10
    # scopes hold: this producer may not use another queue
    with pytest.raises(dls.LakeshoreError):
        dls.SyncQueue("elsewhere", dispatch=producer).submit(double, 1)


def test_workers_are_gone_after_the_tests():
    assert not [t for t in threading.enumerate() if t.name.startswith("lakeshore-worker")]
"""


def test_the_fixtures_work_in_a_users_test_file(pytester: pytest.Pytester) -> None:
    # Given a user's test file using the plugin's fixtures (nothing in their conftest)
    pytester.makepyfile(test_user=USER_TESTS)
    # When pytest runs it (in a subprocess, as the user would: the entry point loads it)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", "-v")
    # Then every test passes
    result.assert_outcomes(passed=4)


def test_a_failing_worker_fails_the_test_at_teardown(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_user="""
        import dreamlake.lakeshore as dls

        def test_handle_without_queue(lakeshore_worker, lakeshore_plane):
            group = lakeshore_worker("q", dispatch=lakeshore_plane)
            group.errors.append(RuntimeError("worker crashed"))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*RuntimeError: worker crashed*"])


def test_the_plugin_documents_its_fixtures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--fixtures", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*lakeshore_plane*", "*lakeshore_server*", "*lakeshore_worker*"], consecutive=False
    )
