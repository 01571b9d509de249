"""auth.yml: saved planes and tokens, and how ``Dispatch()`` picks its plane."""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import authfile, config
from dreamlake.lakeshore.http import HttpTransport

URL = "https://abc.execute-api.us-east-1.amazonaws.com"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A clean environment: no plane configured, auth.yml in a temporary folder."""
    for name in ("LAKESHORE_URL", "LAKESHORE_TOKEN", "LAKESHORE_PROFILE", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "config" / "lakeshore" / "auth.yml"
    monkeypatch.setenv("LAKESHORE_AUTH_FILE", str(path))
    monkeypatch.setenv("LAKESHORE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(config, "_settings", None)
    monkeypatch.setattr(config, "_default", None)
    yield path


def _remote(dp: dls.Dispatch) -> HttpTransport:
    assert isinstance(dp.transport, HttpTransport)
    return dp.transport


def test_a_saved_profile_reads_back(env: Path) -> None:
    # Given a profile saved to a file that did not exist
    written = authfile.save_profile("prod", URL + "/", "lks_secret")
    # Then the file is where the environment says, private, and reads back the same
    assert written == env
    assert authfile.load() == {
        "default": "prod",
        "profiles": {"prod": {"url": URL, "token": "lks_secret"}},
    }
    assert authfile.resolve() == (URL, "lks_secret")
    assert env.read_text().splitlines()[1:] == [
        "default: prod",
        "profiles:",
        "  prod:",
        f"    url: {URL}",
        "    token: lks_secret",
    ]


def test_the_file_is_written_0600(env: Path) -> None:
    authfile.save_profile("prod", URL, "lks_secret")
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert stat.S_IMODE(env.parent.stat().st_mode) == 0o700
    # and stays so when rewritten, with no temporary file left behind
    authfile.save_profile("dev", "http://127.0.0.1:8080", "lks_dev")
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert sorted(p.name for p in env.parent.iterdir()) == ["auth.yml"]


def test_a_file_others_may_read_warns(env: Path) -> None:
    authfile.save_profile("prod", URL, "lks_secret")
    env.chmod(0o644)
    with pytest.warns(UserWarning, match="chmod 600"):
        authfile.load()
    env.chmod(0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        authfile.load()


def test_profiles_and_the_default(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two profiles, the second saved without becoming the default
    authfile.save_profile("prod", URL, "lks_prod")
    authfile.save_profile("dev", "http://127.0.0.1:8080", "lks_dev", make_default=False)
    # Then the default is used unless a profile is named, by argument or environment
    assert authfile.resolve() == (URL, "lks_prod")
    assert authfile.resolve("dev") == ("http://127.0.0.1:8080", "lks_dev")
    monkeypatch.setenv("LAKESHORE_PROFILE", "dev")
    monkeypatch.setattr(config, "_settings", None)
    assert authfile.resolve() == ("http://127.0.0.1:8080", "lks_dev")
    # and a profile that is not there is an error, not a silent fallback
    with pytest.raises(authfile.AuthFileError, match="no profile 'staging'"):
        authfile.resolve("staging")
    assert authfile.token_for(URL + "/") == "lks_prod"
    assert authfile.remove_profile("prod") and not authfile.remove_profile("prod")
    assert authfile.load()["default"] is None


def test_no_file_is_no_profile(env: Path) -> None:
    assert authfile.load() == {"default": None, "profiles": {}}
    assert authfile.resolve() is None
    with pytest.raises(authfile.AuthFileError, match="does not exist"):
        authfile.resolve("prod")


def test_the_hand_written_shape_parses(tmp_path: Path) -> None:
    # Given a file written by hand: comments, quotes, other indentation
    path = tmp_path / "auth.yml"
    path.write_text(
        "# my planes\n"
        "default: 'prod'\n"
        "\n"
        "profiles:\n"
        "    prod:   # the real one\n"
        '        url: "https://example.com/prod"\n'
        "        token: lks_abc # rotated monthly\n"
        "    odd:\n"
        '        url: "http://h:1"\n'
        '        token: "with \\"quotes\\" and # hash"\n'
    )
    path.chmod(0o600)
    assert authfile.load(path) == {
        "default": "prod",
        "profiles": {
            "prod": {"url": "https://example.com/prod", "token": "lks_abc"},
            "odd": {"url": "http://h:1", "token": 'with "quotes" and # hash'},
        },
    }


def test_awkward_values_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "auth.yml"
    for token in ["a # b", " spaced ", 'q"uo\\te', "true", "123", "", "x:y"]:
        authfile.save_profile("p", URL, token, path=path)
        assert authfile.load(path)["profiles"]["p"]["token"] == token


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("profiles:\n\tprod:\n", "tabs"),
        ("colour: blue\n", "unknown key"),
        ("profiles:\n  prod: x\n", "indented map"),
        ("profiles:\n  prod:\n    url: 'open\n", "unterminated"),
        ("default prod\n", "key: value"),
    ],
)
def test_a_malformed_file_says_where(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "auth.yml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(authfile.AuthFileError, match=f"auth.yml:[123]: .*{why}"):
        authfile.load(path)


def test_the_default_path_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LAKESHORE_AUTH_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setattr(config, "_settings", None)
    assert authfile.default_path() == tmp_path / "lakeshore" / "auth.yml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setattr(config, "_settings", None)
    assert authfile.default_path() == Path("~/.config/lakeshore/auth.yml").expanduser()


# --- Dispatch() ---------------------------------------------------------------------------


def test_dispatch_uses_the_saved_profile(env: Path) -> None:
    # Given a saved profile and no LAKESHORE_URL
    authfile.save_profile("prod", URL, "lks_prod")
    # When Dispatch() is made, then it is a remote plane with that token (no call made)
    with dls.Dispatch() as dp:
        assert dp.target == URL
        assert _remote(dp)._token == "lks_prod"


def test_the_environment_comes_before_the_file(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    authfile.save_profile("prod", URL, "lks_prod")
    monkeypatch.setenv("LAKESHORE_URL", "http://127.0.0.1:9999")
    monkeypatch.setenv("LAKESHORE_TOKEN", "lks_env")
    monkeypatch.setattr(config, "_settings", None)
    with dls.Dispatch() as dp:
        assert (dp.target, _remote(dp)._token) == ("http://127.0.0.1:9999", "lks_env")
    # and an explicit URL takes the token saved for it, never another plane's
    with dls.Dispatch(URL) as dp:
        assert _remote(dp)._token == "lks_prod"
    with dls.Dispatch("https://elsewhere.example") as dp:
        assert _remote(dp)._token is None


def test_no_url_and_no_file_is_the_local_plane(env: Path) -> None:
    with dls.Dispatch() as dp:
        assert dp.target == str(Path(os.environ["LAKESHORE_HOME"]) / "plane.db")
        assert not isinstance(dp.transport, HttpTransport)
